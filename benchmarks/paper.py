"""``python -m benchmarks``: the benchmark of the paper's Results section, end to end.

Loads the data (``--dataset mnist``: ``--data``, or MNIST downloaded once into the data
folder, see ``mnist.py``), limits every thread pool, compiles our kernels before timing,
warms every algorithm up alike, runs every algorithm from the same start for each seed
(order rotated from seed to seed), computes ``E*_s``, and writes results.json,
results.md, curves.png and curves.json (plus rho_study.json with ``--rho-study``) into
``--out``. Its options: :func:`benchmarks.options.build_parser`.
"""

from __future__ import annotations

import argparse
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

from benchmarks import datasets, mnist, threads
from benchmarks.options import all_names, build_parser, load_dataset, log
from benchmarks.process import (
    available_gib,
    child_env,
    keep_freed_memory,
    limit_threads,
    prefault_memory,
)
from benchmarks.protocol import Budget, Curve, Problem, Runner, record, shuffled_problem

__all__ = ["SETTLE_SECONDS", "main"]

# A pause before each timed run, every algorithm alike. After its last parallel loop an
# OpenMP runtime keeps its threads spinning for a while; with more than one thread the
# next algorithm's threads would share the cores with them (measured on patches at 2
# threads: nmbatch's first step took 28-50 ms right after scikit-learn's Elkan, 2.5 ms
# on its own).
SETTLE_SECONDS = 0.2


def _runner(name: str, rho: float | None = None) -> Runner:
    from benchmarks.ours import OURS, run_ours
    from benchmarks.peers import make_peer
    from benchmarks.ray_runner import is_ray_name, run_ray

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

    from benchmarks.ours import run_ours

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
        env = child_env(OPENBLAS_CORETYPE=args.faiss_coretype)
        subprocess.run(
            [sys.executable, "-m", "benchmarks.faiss_worker", str(work)],
            env=env,
            check=True,
        )
        got = json.loads((work / "curves.json").read_text())
    curves = {
        int(s): {n: Curve.from_json(c) for n, c in per.items()} for s, per in got["curves"].items()
    }
    return curves, got["blas"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with the options ``argv`` (default ``sys.argv[1:]``); exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or (2 if quick else 5)
    args.budget = args.budget if args.budget is not None else (0.5 if quick else 20.0)
    args.max_iter = args.max_iter or (300 if quick else 100_000)
    args.warmup = args.warmup if args.warmup is not None else (0.05 if quick else 0.5)
    args.rho_slices = args.rho_slices or ("0.05,0.2" if quick else "2,10")
    from benchmarks.ours import VARIANTS

    default = [n for n in all_names() if n not in VARIANTS]
    names = default if args.algorithms is None else [
        n.strip() for n in args.algorithms.split(",") if n.strip()
    ]
    from benchmarks.ray_runner import is_ray_name

    unknown = sorted(n for n in set(names) - set(all_names()) if not is_ray_name(n))
    if unknown:
        raise SystemExit(f"unknown algorithm(s) {unknown}; choose from {all_names()}")
    if len(args.thread_counts) > 1:  # one child process per count, then the scaling table
        options = [o for a in parser._actions for o in a.option_strings]
        return threads.run_scaling(args, sys.argv[1:] if argv is None else argv, options)
    command = "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv)

    kept = False if args.no_keep_memory else keep_freed_memory()
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        ds = load_dataset(args)
    except mnist.MnistDownloadError as exc:
        log(f"python -m benchmarks: error: {exc}. No copy of MNIST is cached in "
             f"{mnist.data_home()}: pass --data FILE.npz (arrays train and test, e.g. "
             "MNIST as uint8 rows of 784 pixels), or retry when online.")
        return 2
    data_seconds = time.perf_counter() - t0
    log(f"data: {ds.description} ({data_seconds:.1f} s)")
    t0 = time.perf_counter()
    limit_threads(args.threads)
    import_seconds = time.perf_counter() - t0

    from benchmarks import machine, report
    from benchmarks.ours import OURS, jit_warmup

    if args.prefault_gb is None:
        want = max(1.0, 8 * ds.train.nbytes / 2**30)
        args.prefault_gb = 0.25 if quick else round(min(want, available_gib() / 2), 2)
    prefault_seconds = prefault_memory(args.prefault_gb)
    log(f"touched {args.prefault_gb:g} GiB of memory in {prefault_seconds:.2f} s")
    # Compilation does not depend on k: a large k warms up at 1,024 (every bound mode).
    warm = {*names, *(("nmbatch", "nmbatch.deact") if args.rho_study else ())}
    jit_seconds = jit_warmup(ds.train, min(args.k, 1024),
                             tuple(n for n in OURS if n in warm) or ("nmbatch",))
    limit_threads(args.threads)  # again: the JIT run may have loaded numba's OpenMP runtime
    log(f"JIT warm-up of our algorithms: {jit_seconds:.2f} s")

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
            log(f"seed {seed} {name:24s} {c.n_steps:6d} steps {c.total_seconds:8.3f} s  "
                 f"E_V {c.final_energy:.6g}  ({c.notes.get('stop')})")
        rho_curves[seed] = {}
        for label in rho_names:
            variant, rho = label.split(" rho=")
            time.sleep(SETTLE_SECONDS)
            c = record(label, _runner(variant, float(rho))(problem, budget), ds.test, seed,
                       eval_grid=args.eval_grid)
            rho_curves[seed][label] = c
            log(f"seed {seed} {label:24s} {c.n_steps:6d} steps {c.total_seconds:8.3f} s  "
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
    extra_names = [n for n in curves[seeds[0]] if n not in all_names()]

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
    plot_names = [n for n in (*all_names(), *extra_names) if n in curves[seeds[0]]]
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
    log(f"wrote {out / 'results.json'}, results.md, curves.png, curves.json")
    print((out / "results.md").read_text())
    return 0
