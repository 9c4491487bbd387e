"""``python -m nmbatch.engine.bench``: the benchmark of the paper's Results section, end to end.

Loads the data (``--dataset mnist``: ``--data``, or MNIST downloaded once into the data
folder, see ``mnist.py``), limits every thread pool, compiles our kernels before timing,
warms every algorithm up alike, runs every algorithm from the same start for each seed
(order rotated from seed to seed), computes ``E*_s``, and writes results.json,
results.md, curves.png and curves.json (plus rho_study.json with ``--rho-study``) into
``--out``.

With ``--drift`` it runs the drift benchmark instead (:mod:`nmbatch.engine.bench.drift`:
streams that change, methods that forget; drift.json, drift.md and drift.png).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from nmbatch.engine.bench import datasets, mnist, threads
from nmbatch.engine.bench.protocol import Budget, Curve, Problem, Runner, record, shuffled_problem

__all__ = ["build_parser", "limit_threads", "main"]

_LIMITERS: list[Any] = []  # keeps the threadpoolctl limiter alive for the process

# A pause before each timed run, every algorithm alike. After its last parallel loop an
# OpenMP runtime keeps its threads spinning for a while; with more than one thread the
# next algorithm's threads would share the cores with them (measured on patches at 2
# threads: nmbatch's first step took 28-50 ms right after scikit-learn's Elkan, 2.5 ms
# on its own).
SETTLE_SECONDS = 0.2


def limit_threads(threads: int) -> None:
    """One thread count for every BLAS and OpenMP pool (threadpoolctl), numba and faiss.

    Imports the libraries first: threadpoolctl only limits pools already loaded.
    """
    import faiss
    import numba
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS so it is limited too)
    import sklearn.cluster  # noqa: F401  (loads scikit-learn's OpenMP runtime)
    from threadpoolctl import threadpool_limits

    import nmbatch.engine  # noqa: F401  (loads numba's threading layer users)

    _LIMITERS.append(threadpool_limits(limits=threads))
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    faiss.omp_set_num_threads(threads)


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 4.0


def keep_freed_memory() -> bool:
    """Make glibc serve large allocations from the heap and never hand freed memory back.

    On this kind of VM, memory the guest frees is soon returned to the host, and the next
    first touch of it is slow (about 1 s per GB); an algorithm that allocates large arrays
    (scikit-learn's fit copies ``X``) then pays a cost that depends on what ran in the
    seconds before. Keeping freed memory in the process makes every algorithm reuse
    already-backed pages after the warm-up. Returns whether it took effect (glibc only).
    """
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's mallopt parameter numbers
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, -1) == 1
    except (OSError, AttributeError):
        return False


def prefault_memory(gib: float) -> float:
    """Write ``gib`` GiB once and free it; returns the seconds it took.

    On a virtual machine the first write to a guest page the host has not backed yet is
    slow (here ~1 GB/s): whichever algorithm first allocates large arrays would pay for
    it at random (a 188 MB copy once took 1 s instead of 0.2 s). Touching memory once
    before timing lets every later allocation reuse pages the host has already backed.
    """
    t0 = time.perf_counter()
    if gib > 0:
        buf = np.ones(int(gib * 2**30) // 8)
        del buf
    return time.perf_counter() - t0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m nmbatch.engine.bench",
        description="Time-to-energy benchmark of nmbatch against its baselines and peers "
        "(Newling & Fleuret 2016, Results section).",
    )
    d = p.add_argument_group("data")
    d.add_argument("--data", type=Path, help="an .npz with keys train and test; for "
                   "--dataset mnist or infmnist, MNIST in that layout (default: "
                   f"{mnist.MNIST_NPZ} in $NMBATCH_DATA_HOME, else $XDG_CACHE_HOME/nmbatch "
                   "or ~/.cache/nmbatch, downloaded there once from the standard MNIST "
                   "files, SHA-256 checked)")
    d.add_argument("--dataset", choices=("npz", "mnist", "patches", "infmnist", "blobs"),
                   help="default: npz if --data is given, else blobs")
    d.add_argument("--infmnist-n", type=int, default=400_000)
    d.add_argument("--data-seed", type=int, default=0,
                   help="seed of the data generators and hold-out splits (not of the runs)")
    d.add_argument("--cache-dir", type=Path, default=None,
                   help=f"where generated data is cached (default {datasets.default_cache_dir()})")
    d.add_argument("--max-train", type=int, help="subsample the training set to this size")
    d.add_argument("--max-test", type=int, help="subsample the validation set to this size")
    r = p.add_argument_group("protocol")
    r.add_argument("--k", type=int, default=50)
    r.add_argument("--batch-size", type=int, default=5000,
                   help="initial batch of nmbatch, batch of mbatch")
    r.add_argument("--rho", type=float, default=100.0)
    r.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5; quick 2)")
    r.add_argument("--first-seed", type=int, default=0)
    r.add_argument("--threads", type=threads.parse_threads, action=threads.ThreadsAction,
                   default=1, help="threads of every pool (default 1); a list (1,2,4) runs "
                   "the benchmark once per count, each in its own process, into "
                   "OUT/threads-N, and writes OUT/scaling.json, scaling.md and scaling.png")
    p.set_defaults(thread_counts=[1])
    r.add_argument("--budget", type=float, default=None,
                   help="seconds of its own time per algorithm and seed (default 20; quick 0.5)")
    r.add_argument("--max-iter", type=int, default=None,
                   help="iterations per algorithm and seed (default 100000; quick 300)")
    r.add_argument("--eval-grid", type=float, default=0.01,
                   help="after the first 20 iterations, evaluate E_V when the algorithm's "
                   "time grew by this fraction since the last evaluation (0: every step)")
    r.add_argument("--warmup", type=float, default=None,
                   help="seconds (at most 3 iterations) each algorithm runs untimed before "
                   "the first seed (default 0.5; quick 0.05)")
    r.add_argument("--prefault-gb", type=float, default=None,
                   help="GiB of memory to touch once before timing (default: 8x the training "
                   "set, at least 1, at most half the available memory; quick 0.25)")
    r.add_argument("--no-keep-memory", action="store_true",
                   help="let glibc return freed memory to the system (see keep_freed_memory)")
    r.add_argument("--algorithms", default=None,
                   help="comma-separated subset of: " + ", ".join(_all_names())
                   + "; also ray.P: nmbatch on P Ray shard actors (needs nmbatch[ray])")
    r.add_argument("--reference-seconds", type=float, default=float("inf"),
                   help="cap on the untimed reference Lloyd run (default: to its fixed point)")
    r.add_argument("--faiss-blas-fixed", action="store_true",
                   help="also run faiss in a subprocess with OPENBLAS_CORETYPE set "
                   "(labelled faiss.blasfixed; not in results.json)")
    r.add_argument("--faiss-coretype", default="SkylakeX")
    r.add_argument("--rho-study", action="store_true",
                   help="also run nmbatch and nmbatch.deact for each --rho-values")
    r.add_argument("--rho-values", default="1,10,100,1000")
    r.add_argument("--rho-slices", default=None,
                   help="times (s) at which the rho study reports E_V "
                   "(default 2,10; quick 0.05,0.2)")
    p.add_argument("--drift", action="store_true",
                   help="run the drift benchmark instead (its options: --drift --help; "
                   "nmbatch.engine.bench.drift)")
    p.add_argument("--quick", action="store_true",
                   help="small version for CI: blobs (or a subsample of the data), 2 seeds, "
                   "short budgets; under a minute")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default bench-results/<dataset>)")
    return p


def _all_names() -> tuple[str, ...]:
    from nmbatch.engine.bench.report import RESULT_NAMES

    return RESULT_NAMES


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _mnist_path(args: argparse.Namespace) -> Path:
    """``--data``, else MNIST from the data folder (downloaded there if missing)."""
    return args.data or mnist.fetch_mnist(log=_log)


def _load_dataset(args: argparse.Namespace) -> datasets.Dataset:
    kind = args.dataset or ("npz" if args.data else "blobs")
    if kind == "npz":
        if args.data is None:
            raise SystemExit("--dataset npz needs --data FILE.npz")
        ds = datasets.load_npz(args.data)
    elif kind == "mnist":
        ds = datasets.load_npz(_mnist_path(args), name="mnist")
    elif kind == "patches":
        ds = datasets.make_patches(seed=args.data_seed)
    elif kind == "infmnist":
        n = min(args.infmnist_n, 20_000) if args.quick else args.infmnist_n
        ds = datasets.make_infmnist(
            _mnist_path(args), n=n, seed=args.data_seed, cache_dir=args.cache_dir
        )
    else:
        ds = (datasets.make_blobs(n_train=20_000, n_test=4_000, seed=args.data_seed)
              if args.quick else
              datasets.make_blobs(n_train=200_000, n_test=20_000, seed=args.data_seed))
    max_train = args.max_train or (10_000 if args.quick and kind != "blobs" else None)
    max_test = args.max_test or (2_000 if args.quick and kind != "blobs" else None)
    if max_train or max_test:
        ds = datasets.subsample(
            ds, max_train or ds.train.shape[0], max_test or ds.test.shape[0], args.data_seed
        )
    return ds


def _runner(name: str, rho: float | None = None) -> Runner:
    from nmbatch.engine.bench.ours import OURS, run_ours
    from nmbatch.engine.bench.peers import make_peer
    from nmbatch.engine.bench.ray_runner import is_ray_name, run_ray

    if is_ray_name(name):
        return run_ray(name)
    return run_ours(name, rho) if name in OURS else make_peer(name)


def _reference_lloyd(
    problem: Problem, test: np.ndarray, max_iter: int, seconds: float = float("inf")
) -> tuple[float, int, str]:
    """Our exact Lloyd from the problem's start to its fixed point or for ``seconds``
    (untimed, all cores): energy, iterations and why it stopped."""
    import numba
    from threadpoolctl import threadpool_limits

    from nmbatch.engine.bench.ours import run_ours

    cores = os.cpu_count() or 1
    before = numba.get_num_threads()
    numba.set_num_threads(min(cores, numba.config.NUMBA_NUM_THREADS))
    try:
        with threadpool_limits(limits=cores):
            curve = record(
                "lloyd.reference", run_ours("lloyd")(problem, Budget(seconds, max_iter)),
                test, problem.seed, eval_grid=float("inf"), first_steps=0,
            )
    finally:
        numba.set_num_threads(before)
    return curve.final_energy, curve.n_steps, str(curve.notes.get("stop"))


def _faiss_blas_fixed(
    ds: datasets.Dataset, seeds: list[int], args: argparse.Namespace, budget: Budget
) -> tuple[dict[int, dict[str, Curve]], list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="nmbatch-bench-") as tmp:
        work = Path(tmp)
        np.save(work / "train.npy", ds.train)
        np.save(work / "test.npy", ds.test)
        (work / "config.json").write_text(json.dumps({
            "seeds": seeds, "k": args.k, "rho": args.rho, "batch_size": args.batch_size,
            "budget": budget.seconds, "max_iter": budget.max_iter, "eval_grid": args.eval_grid,
            "threads": args.threads, "warmup": args.warmup, "suffix": ".blasfixed",
            "keep_memory": not args.no_keep_memory, "prefault_gb": args.prefault_gb,
        }))
        env = dict(os.environ, OPENBLAS_CORETYPE=args.faiss_coretype)
        subprocess.run(
            [sys.executable, "-m", "nmbatch.engine.bench.faiss_worker", str(work)],
            env=env,
            check=True,
        )
        got = json.loads((work / "curves.json").read_text())
    curves = {
        int(s): {n: Curve.from_json(c) for n, c in per.items()} for s, per in got["curves"].items()
    }
    return curves, got["blas"]


def main(argv: list[str] | None = None) -> int:
    if "--drift" in (sys.argv[1:] if argv is None else argv):  # the drift benchmark instead
        from nmbatch.engine.bench.drift import main as drift_main

        return drift_main(argv)
    if "--large-k" in (sys.argv[1:] if argv is None else argv):  # several k, one folder
        from nmbatch.engine.bench.large_k import main as large_k_main

        return large_k_main([a for a in (sys.argv[1:] if argv is None else argv)
                             if a != "--large-k"])
    parser = build_parser()
    args = parser.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or (2 if quick else 5)
    args.budget = args.budget if args.budget is not None else (0.5 if quick else 20.0)
    args.max_iter = args.max_iter or (300 if quick else 100_000)
    args.warmup = args.warmup if args.warmup is not None else (0.05 if quick else 0.5)
    args.rho_slices = args.rho_slices or ("0.05,0.2" if quick else "2,10")
    from nmbatch.engine.bench.ours import VARIANTS

    default = [n for n in _all_names() if n not in VARIANTS]
    names = default if args.algorithms is None else [
        n.strip() for n in args.algorithms.split(",") if n.strip()
    ]
    from nmbatch.engine.bench.ray_runner import is_ray_name

    unknown = sorted(n for n in set(names) - set(_all_names()) if not is_ray_name(n))
    if unknown:
        raise SystemExit(f"unknown algorithm(s) {unknown}; choose from {_all_names()}")
    if len(args.thread_counts) > 1:  # one child process per count, then the scaling table
        options = [o for a in parser._actions for o in a.option_strings]
        return threads.run_scaling(args, sys.argv[1:] if argv is None else argv, options)
    command = "python -m nmbatch.engine.bench " + shlex.join(sys.argv[1:] if argv is None else argv)

    kept = False if args.no_keep_memory else keep_freed_memory()
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        ds = _load_dataset(args)
    except mnist.MnistDownloadError as exc:
        _log(f"python -m nmbatch.engine.bench: error: {exc}. No copy of MNIST is cached in "
             f"{mnist.data_home()}: pass --data FILE.npz (arrays train and test, e.g. "
             "MNIST as uint8 rows of 784 pixels), or retry when online.")
        return 2
    data_seconds = time.perf_counter() - t0
    _log(f"data: {ds.description} ({data_seconds:.1f} s)")
    t0 = time.perf_counter()
    limit_threads(args.threads)
    import_seconds = time.perf_counter() - t0

    from nmbatch.engine.bench import machine, report
    from nmbatch.engine.bench.ours import OURS, jit_warmup

    if args.prefault_gb is None:
        want = max(1.0, 8 * ds.train.nbytes / 2**30)
        args.prefault_gb = 0.25 if quick else round(min(want, _available_gib() / 2), 2)
    prefault_seconds = prefault_memory(args.prefault_gb)
    _log(f"touched {args.prefault_gb:g} GiB of memory in {prefault_seconds:.2f} s")
    # Compilation does not depend on k: a large k warms up at 1,024 (every bound mode).
    warm = {*names, *(("nmbatch", "nmbatch.deact") if args.rho_study else ())}
    jit_seconds = jit_warmup(ds.train, min(args.k, 1024),
                             tuple(n for n in OURS if n in warm) or ("nmbatch",))
    limit_threads(args.threads)  # again: the JIT run may have loaded numba's OpenMP runtime
    _log(f"JIT warm-up of our algorithms: {jit_seconds:.2f} s")

    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    budget = Budget(args.budget, args.max_iter)
    rhos = [float(r) for r in args.rho_values.split(",")] if args.rho_study else []
    rho_names = [f"{v} rho={r:g}" for v in ("nmbatch", "nmbatch.deact") for r in rhos]
    curves: dict[int, dict[str, Curve]] = {}
    rho_curves: dict[int, dict[str, Curve]] = {}
    references: dict[int, dict[str, Any]] = {}
    warm_seconds = 0.0
    for si, seed in enumerate(seeds):
        problem = shuffled_problem(ds.train, seed, args.k, rho=args.rho,
                                   batch_size=args.batch_size)
        if si == 0:
            t0 = time.perf_counter()
            for name in names:  # every algorithm alike: BLAS, allocator, caches
                warm = Budget(args.warmup, 3)
                record(name, _runner(name)(problem, warm), ds.test, seed)
            warm_seconds = time.perf_counter() - t0
        order = names[si % len(names):] + names[: si % len(names)]
        curves[seed] = {}
        for name in order:
            time.sleep(SETTLE_SECONDS)
            c = record(name, _runner(name)(problem, budget), ds.test, seed,
                       eval_grid=args.eval_grid)
            curves[seed][name] = c
            _log(f"seed {seed} {name:24s} {c.n_steps:6d} steps {c.total_seconds:8.3f} s  "
                 f"E_V {c.final_energy:.6g}  ({c.notes.get('stop')})")
        rho_curves[seed] = {}
        for label in rho_names:
            variant, rho = label.split(" rho=")
            time.sleep(SETTLE_SECONDS)
            c = record(label, _runner(variant, float(rho))(problem, budget), ds.test, seed,
                       eval_grid=args.eval_grid)
            rho_curves[seed][label] = c
            _log(f"seed {seed} {label:24s} {c.n_steps:6d} steps {c.total_seconds:8.3f} s  "
                 f"E_V {c.final_energy:.6g}  ({c.notes.get('stop')})")
        lloyd = curves[seed].get("lloyd")
        if lloyd is not None and lloyd.converged:
            references[seed] = {"source": "lloyd (timed run converged)",
                                "energy": lloyd.final_energy, "iterations": lloyd.n_steps}
        else:
            e, it, why = _reference_lloyd(problem, ds.test, max(args.max_iter, 10_000),
                                          args.reference_seconds)
            source = ("reference run of our lloyd to its fixed point" if why == "converged"
                      else f"reference run of our lloyd, stopped ({why}) before its fixed point")
            references[seed] = {"source": source, "energy": e, "iterations": it}
        del problem

    extra_blas: list[dict[str, Any]] = []
    if args.faiss_blas_fixed:
        fixed, extra_blas = _faiss_blas_fixed(ds, seeds, args, budget)
        for seed in seeds:
            curves[seed].update(fixed.get(seed, {}))

    estar = {
        s: min(
            [min(c.energy) for c in [*curves[s].values(), *rho_curves[s].values()] if c.energy]
            + [references[s]["energy"]]
        )
        for s in seeds
    }
    summary = report.summarize_all(curves, estar)
    extra_names = [n for n in curves[seeds[0]] if n not in _all_names()]

    out = args.out or Path("bench-results") / ds.name
    out.mkdir(parents=True, exist_ok=True)
    results = report.results_json(
        dataset=ds.name, n_train=ds.train.shape[0], n_test=ds.test.shape[0], dim=ds.dim,
        k=args.k, threads=args.threads, seeds=seeds, estar=estar, summary=summary,
    )
    report.write_json(out / "results.json", results)
    report.write_json(out / "curves.json", {
        "estar_per_seed": {str(s): estar[s] for s in seeds},
        "references": {str(s): references[s] for s in seeds},
        "extra_algorithms": {n: summary[n] for n in extra_names if n in summary},
        "curves": {str(s): {n: c.to_json() for n, c in curves[s].items()} for s in seeds},
    })
    rho_table = None
    if args.rho_study:
        slices = [float(t) for t in args.rho_slices.split(",")]
        rho_table = report.rho_study(rho_curves, estar, rho_names, slices)
        report.write_json(out / "rho_study.json", {
            "rho_study": rho_table,
            "curves": {str(s): {n: c.to_json() for n, c in rho_curves[s].items()}
                       for s in seeds},
        })
    title = f"{ds.name}: n={ds.train.shape[0]}, d={ds.dim}, k={args.k}, {len(seeds)} seed(s)"
    plot_names = [n for n in (*_all_names(), *extra_names) if n in curves[seeds[0]]]
    report.plot_curves(out / "curves.png", curves, estar, plot_names, title)
    if args.rho_study:
        report.plot_curves(out / "rho_study.png", rho_curves, estar, rho_names,
                           title + ": rho study")
    info = machine.machine_info()
    store_loads = [c.notes["store_load_seconds"] for s in seeds for c in curves[s].values()
                   if "store_load_seconds" in c.notes]
    report.write_markdown(
        out / "results.md",
        dataset=ds, args=vars(args), command=command, info=info, extra_blas=extra_blas,
        summary=summary, names=[n for n in plot_names if n in summary], estar=estar,
        seeds=seeds, references=references, rho_table=rho_table,
        timings={
            "data": data_seconds, "imports": import_seconds, "jit": jit_seconds,
            "prefault": prefault_seconds, "prefault_gb": args.prefault_gb,
            "keep_memory": kept, "load_start": load_start, "load_end": os.getloadavg()[0],
            "warmup": warm_seconds,
            "store_load": float(np.median(store_loads)) if store_loads else None,
        },
        ours=[n for n in OURS if n in names],
    )
    _log(f"wrote {out / 'results.json'}, results.md, curves.png, curves.json")
    print((out / "results.md").read_text())
    return 0
