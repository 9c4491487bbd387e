"""``python -m benchmarks.phases``: where nmbatch's time goes, and how it scales.

Per ``--threads`` count, a child process (thread pools are process-wide; limited by
:func:`.process.limit_threads`) loads the data as the bench does, measures the memory
bandwidth, warms the JIT up and runs one nmbatch fit from the seed's shuffled problem,
timing every phase of every step by wrapping methods of that algorithm instance (and, to
split the dense pass into BLAS product and kernel, ``assign_dense[_grouped]`` as
``algorithms.base`` calls them: patched in the child, for the timed fit only). Times are
exclusive (a callee's time is its own phase's); ``other``: ``step`` outside every phase.
The smallest count runs to the bench's stopping rule (converged, ``--budget`` seconds of
step time, ``--max-iter`` steps), the others as many steps; the final centroids must then
be bit-identical, which is checked.

Per phase, Amdahl's ``t(p) = t1 ((1 - f) + f / p)`` is fitted (:func:`amdahl_fit`) and
projected to ``--project`` cores; the projected total is the sum of the projected phases.
``--peers FILE`` projects other algorithms' times alike; FILE is ``{"algorithm": {"1":
seconds, "2": seconds}}`` or the bench's ``scaling.json`` (each algorithm's time to 1% of
E*_s). Writes ``--out``/phases.json, phases.md and phases.png (stacked bars per count).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np

from benchmarks.peak import gemm_peak, lloyd_at_peak
from benchmarks.phases_report import markdown, plot
from benchmarks.process import child_env

__all__ = ["PhaseTimer", "amdahl_fit", "amdahl_time", "instrument", "main", "project"]

ORDER = (
    "assign new: BLAS product", "assign new: assign kernel",
    "assign new: pooled product and kernel", "revisit: bound sweep", "revisit: settle",
    "revisit: reassign", "revisit: BLAS product", "revisit: assign kernel",
    "revisit: pooled product and kernel",
    "update centroids", "relocate empty", "doubling test", "grow arrays", "other",
)  # fmt: skip
Label = str | Callable[[str], str]  # a phase's label, or its label by context
Bytes = Callable[..., int] | None  # the bytes a call moves, from its arguments
_BLOCK = 1 << 16  # float32 elements per block of the bandwidth kernels


def amdahl_time(t1: float, f: float, p: float) -> float:
    """Time on ``p`` cores of work taking ``t1`` on one, a fraction ``f`` of it parallel."""
    return t1 * ((1.0 - f) + f / p)


def amdahl_fit(counts: Sequence[int], times: Sequence[float]) -> tuple[float | None, float]:
    """``(f, t1)``: Amdahl's law fitted to ``times[i]`` (s) measured on ``counts[i]`` threads.

    Least squares of ``t(p) = a + c / p`` (exact with two counts), ``f = c / (a + c)``
    clipped to [0, 1]. ``t1``: the time measured on 1 thread if any, else the least-squares
    ``t1`` with that ``f``. ``f`` is None with fewer than two distinct counts or no
    positive time.
    """
    p = np.asarray(counts, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    one = p == 1
    if np.unique(p).size < 2 or not (t > 0).any():
        return None, float(t[one].mean() if one.any() else t.mean()) if t.size else 0.0
    a, c = np.linalg.lstsq(np.stack([np.ones_like(p), 1.0 / p], axis=1), t, rcond=None)[0]
    f = float(np.clip(c / (a + c), 0.0, 1.0)) if a + c > 0 else 0.0
    g = (1.0 - f) + f / p
    return f, float(t[one].mean() if one.any() else (t * g).sum() / (g * g).sum())


def project(counts: Sequence[int], times: Sequence[float], targets: Sequence[int]) -> dict:
    """``{"f", "t1", "projected": {str(p): seconds or None (no f)}}`` for ``targets``."""
    f, t1 = amdahl_fit(counts, times)
    proj = {str(p): None if f is None else amdahl_time(t1, f, p) for p in targets}
    return {"f": f, "t1": t1, "projected": proj}


def read_peers(path: Path) -> dict[str, dict[int, float]]:
    """Seconds by algorithm and thread count from ``{"name": {"1": s, "2": s}}`` or the
    bench's ``scaling.json`` (time to 1% of E*_s; counts that never reached it left out)."""
    doc = json.loads(Path(path).read_text())
    out: dict[str, dict[int, float]] = {}
    for name, per in doc.get("algorithms", doc).items():
        times = {}
        for n, v in per.items():
            v = (v.get("time_to") or {}).get("0.01") if isinstance(v, dict) else v
            if isinstance(v, int | float) and math.isfinite(v) and v > 0:
                times[int(n)] = float(v)
        if times:
            out[str(name)] = times
    return out


@numba.njit(fastmath=True, cache=True, nogil=True)
def _sum(x):  # pragma: no cover - compiled; fastmath lets LLVM vectorise the sum
    s = np.float32(0.0)
    for i in range(x.shape[0]):
        s += x[i]
    return s


@numba.njit(parallel=True, cache=True, nogil=True)
def _sum_blocks(a):  # pragma: no cover - compiled
    n_blocks = (a.shape[0] + _BLOCK - 1) // _BLOCK
    out = np.zeros(n_blocks, dtype=np.float32)
    for b in numba.prange(n_blocks):
        out[b] = _sum(a[b * _BLOCK : (b + 1) * _BLOCK])
    return out.sum()


@numba.njit(parallel=True, cache=True, nogil=True)
def _copy_blocks(src, dst):  # pragma: no cover - compiled
    for b in numba.prange((src.shape[0] + _BLOCK - 1) // _BLOCK):
        dst[b * _BLOCK : (b + 1) * _BLOCK] = src[b * _BLOCK : (b + 1) * _BLOCK]


def measure_bandwidth(gib: float, repeats: int = 5) -> dict[str, float]:
    """GB/s (1e9 bytes) of a parallel sum (``4 n`` bytes read) and copy (``8 n`` bytes read
    and written) of ``n`` float32 (``gib`` GiB) at numba's thread count: best of ``repeats``."""
    n = max(_BLOCK, int(gib * 2**30) // 4)
    src, dst = np.ones(n, dtype=np.float32), np.zeros(n, dtype=np.float32)  # both touched
    best = [math.inf, math.inf]
    for _ in range(repeats + 1):  # the first call compiles or loads the kernels
        t0 = time.perf_counter()
        _sum_blocks(src)
        t1 = time.perf_counter()
        _copy_blocks(src, dst)
        best = [min(best[0], t1 - t0), min(best[1], time.perf_counter() - t1)]
    gbps = {"sum_gbps": 4 * n / best[0] / 1e9, "copy_gbps": 8 * n / best[1] / 1e9}
    return {"gib": n * 4 / 2**30, "threads": numba.get_num_threads(), **gbps}


class PhaseTimer:
    """Exclusive seconds, calls and bytes moved per phase label of the wrapped calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.bytes_unknown: set[str] = set()
        self._stack: list[list[Any]] = []  # per active call: [context, its callees' seconds]

    def context(self) -> str:
        """The innermost context of the active calls ("" if none)."""
        return next((c for c, _ in reversed(self._stack) if c), "")

    def wrap(self, fn: Callable, label: Label, *, context: str = "", nbytes: Bytes = None) -> Any:
        """``fn`` timed as ``label`` (or ``label(context)``), setting ``context`` for its
        callees; ``nbytes(*args, **kwargs)``: the bytes a call moves."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            name = label(self.context()) if callable(label) else label
            frame = [context, 0.0]
            self._stack.append(frame)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self._stack.pop()
                self.seconds[name] += dt - frame[1]
                self.calls[name] += 1
                if self._stack:
                    self._stack[-1][1] += dt
                try:
                    self.bytes[name] += 0 if nbytes is None else int(nbytes(*args, **kwargs))
                except (AttributeError, IndexError, KeyError, TypeError):
                    self.bytes_unknown.add(name)

        return timed

    def table(self) -> dict[str, dict[str, Any]]:
        """``{label: {"seconds", "calls", "bytes" (None: not counted)}}``."""
        out = {}
        for p, s in self.seconds.items():
            nbytes = None if p in self.bytes_unknown else self.bytes[p] or None
            out[p] = {"seconds": s, "calls": self.calls[p], "bytes": nbytes}
        return out


def instrument(algo: Any, timer: PhaseTimer) -> Callable[[], None]:
    """Wrap ``algo``'s phase methods (instance attributes) and the dense kernels of
    ``algorithms.base`` (module attributes); returns the function that restores those."""
    from nmbatch.engine.algorithms import base

    d, k = algo.dim, algo.n_clusters

    def rows_bytes(X: Any, rows: Any, *a: Any, lower: Any = None, **kw: Any) -> int:
        lower = a[4] if lower is None else lower  # settle passes it by position
        return rows.shape[0] * (4 * X.shape[1] + 8 * lower.shape[1] + 12)

    def sweep_bytes(p: Any, labels: Any, upper: Any, lower: Any) -> int:
        return labels.nbytes + 2 * upper.nbytes + 2 * lower.nbytes

    def kernel_bytes(X: Any, rows: Any, C: Any, **kw: Any) -> int:
        lower = kw.get("lower_bounds")  # rows and products read, bounds written
        return rows.shape[0] * 4 * (d + k + (0 if lower is None else lower.shape[1]))

    def wrap_bounds() -> None:
        bk = algo._bk
        if not getattr(bk, "_phases_wrapped", False):
            bk.sweep = timer.wrap(bk.sweep, "revisit: bound sweep", nbytes=sweep_bytes)
            bk.settle = timer.wrap(bk.settle, "revisit: settle", nbytes=rows_bytes)
            bk.reassign = timer.wrap(bk.reassign, "revisit: reassign", nbytes=rows_bytes)
            bk._phases_wrapped = True

    reserve = timer.wrap(algo._reserve, "grow arrays")

    def reserve_and_wrap(b: int) -> None:
        reserve(b)
        wrap_bounds()  # auto bounds may have switched to group bounds

    wrap_bounds()
    names = ("assign_dense", "assign_dense_grouped", "pooled_assign")
    saved = {n: fn for n in names if (fn := getattr(base, n, None)) is not None}
    for n, fn in saved.items():
        what = "pooled product and kernel" if n == "pooled_assign" else "assign kernel"
        kernel = timer.wrap(fn, lambda c, w=what: f"{c or 'revisit'}: {w}", nbytes=kernel_bytes)
        setattr(base, n, kernel)
    dense = "BLAS product" if saved else "dense pass (BLAS and kernel)"
    dense_bytes = lambda data, rows, **kw: rows.shape[0] * 4 * (d + k)  # noqa: E731
    algo._dense_pass = timer.wrap(  # its bytes: the rows read, the products written
        algo._dense_pass, lambda c: f"{c or 'revisit'}: {dense}", nbytes=dense_bytes
    )
    algo._reserve = reserve_and_wrap
    algo.step = timer.wrap(algo.step, "other")
    algo._assign_new = timer.wrap(algo._assign_new, "other", context="assign new")
    algo._revisit_bounded = timer.wrap(algo._revisit_bounded, "other", context="revisit")
    for name, label in [
        ("_update_centroids", "update centroids"),
        ("_relocate", "relocate empty"),
        ("_doubling_test", "doubling test"),
    ]:
        setattr(algo, name, timer.wrap(getattr(algo, name), label))

    def undo() -> None:
        for n, fn in saved.items():
            setattr(base, n, fn)

    return undo


# -- one thread count (child process) -----------------------------------------------------


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """At ``args.child`` threads: load, bandwidth, warm-up, the timed fit; its document."""
    from benchmarks import machine
    from benchmarks.options import load_dataset
    from benchmarks.ours import jit_warmup, run_ours
    from benchmarks.process import (
        available_gib,
        keep_freed_memory,
        limit_threads,
        prefault_memory,
    )
    from benchmarks.protocol import Budget, shuffled_problem, stepwise
    from nmbatch.engine import NestedBatchStore, make_algorithm
    from nmbatch.engine.threads import kernel_threads

    kept = False if args.no_keep_memory else keep_freed_memory()
    load = [os.getloadavg()[0]]  # 1-minute load average: other processes on these cores
    ds = load_dataset(args)
    limit_threads(args.child)
    bandwidth = measure_bandwidth(args.bandwidth_gib)
    want = min(max(1.0, 8 * ds.train.nbytes / 2**30), available_gib() / 2)
    prefault_memory(args.prefault_gb if args.prefault_gb is not None else want)
    jit_warmup(ds.train, min(args.k, 1024), ("nmbatch",))
    limit_threads(args.child)  # again, as the bench does (the JIT run may load OpenMP)
    pr = shuffled_problem(ds.train, args.seed, args.k, rho=args.rho, batch_size=args.batch_size)
    for _ in run_ours("nmbatch")(pr, Budget(args.warmup, 3)):
        pass  # untimed, as the bench's warm-up: BLAS, allocator and caches
    store = NestedBatchStore(pr.train.shape[1], seed=pr.seed, capacity=pr.train.shape[0])
    store.append(pr.train)
    options = {"rho": pr.rho, "batch_size": pr.batch_size, "bounds": args.bounds}
    algo = make_algorithm("nmbatch", store, pr.k, init=pr.init, random_state=pr.seed, **options)
    timer = PhaseTimer()
    seconds: list[float] = []  # of each step, measured around step()
    sizes: list[int] = []  # each step's batch
    n_dist = 0

    def step() -> bool:
        nonlocal n_dist
        t0 = time.perf_counter()
        s = algo.step()
        seconds.append(time.perf_counter() - t0)
        sizes.append(s.batch_size)
        n_dist += s.n_distances
        return s.converged and not fixed  # a fixed count of steps runs past convergence

    fixed = args.steps is not None
    budget = Budget(math.inf, args.steps) if fixed else Budget(args.budget, args.max_iter)
    trace, stop = stepwise(step, lambda: algo.centroids, budget), None
    undo = instrument(algo, timer)
    # As the bench runs nmbatch: kernels on the thread count, BLAS on one.
    with kernel_threads(args.child):
        blas = sorted({b["num_threads"] for b in machine.machine_info()["blas"]
                       if b["user_api"] == "blas"})  # fmt: skip
        try:
            while stop is None:
                try:
                    next(trace)
                except StopIteration as end:
                    stop = end.value["stop"]
        finally:
            undo()
    C = np.ascontiguousarray(algo.centroids)
    doc = {"dataset": ds.name, "description": ds.description, "dim": int(ds.dim)}
    doc.update(n_train=int(ds.train.shape[0]), k=args.k, bound_mode=algo.bound_mode, stop=stop)
    doc.update(threads=args.child, numba_threads=numba.get_num_threads(), keep_memory=kept)
    doc["load"] = [*load, os.getloadavg()[0]]
    info = machine.machine_info()
    doc.update(blas_threads=blas, bandwidth=bandwidth, machine=info)
    doc.update(n_steps=len(seconds), step_seconds=seconds, total_seconds=float(sum(seconds)))
    doc.update(batch_sizes=sizes, peak=gemm_peak(ds.dim, args.k, args.child))
    doc.update(final_batch_size=int(algo.batch_size), n_distances=int(n_dist))
    doc.update(centroids=C.tolist(), centroids_sha256=hashlib.sha256(C.tobytes()).hexdigest())
    return {**doc, "phases": timer.table()}


def summarize(runs: dict[int, dict], targets: Sequence[int], peers: dict | None = None) -> dict:
    """The model from each count's child document (:func:`_child`): per phase its seconds,
    share of the total, calls, bytes, GB/s, Amdahl fit and projections; the totals; the
    bandwidths; the final centroids' agreement; the peers' projections."""
    counts = sorted(runs)
    first = runs[counts[0]]
    totals = [runs[n]["total_seconds"] for n in counts]

    def by(values: Sequence[Any]) -> dict[str, Any]:  # one value per thread count
        return dict(zip(map(str, counts), values, strict=True))

    seen = {p for r in runs.values() for p in r["phases"]}
    phases = {}
    for p in [p for p in ORDER if p in seen] + sorted(seen - set(ORDER)):
        got = [runs[n]["phases"].get(p, {}) for n in counts]
        sec = [g.get("seconds", 0.0) for g in got]
        nbytes = next((g["bytes"] for g in got if g.get("bytes")), None)
        gbps = None if not nbytes else by([nbytes / s / 1e9 if s > 0 else None for s in sec])
        share = [s / t if t else 0.0 for s, t in zip(sec, totals, strict=True)]
        phases[p] = {
            "seconds": by(sec), "share": by(share),
            "calls": by([g.get("calls", 0) for g in got]), "bytes": nbytes, "gbps": gbps,
            **project(counts, sec, targets),
        }  # fmt: skip
    C = [np.asarray(runs[n]["centroids"], dtype=np.float32) for n in counts]
    total = {"seconds": by(totals), **project(counts, totals, targets)}
    total["phase_sum"] = by([sum(ph["seconds"][str(n)] for ph in phases.values()) for n in counts])
    total["projected_from_phases"] = {
        str(p): sum(ph["projected"][str(p)] or 0.0 for ph in phases.values()) for p in targets
    }
    keys = ["dataset", "description", "n_train", "dim", "k", "bound_mode", "stop"]
    doc = {key: first[key] for key in [*keys, "final_batch_size", "n_distances"]}
    doc.update({"threads": counts, "project_to": list(targets)})
    per_count = ["n_steps", "numba_threads", "blas_threads", "load", "bandwidth", "peak"]
    for key in [*per_count, "centroids_sha256"]:
        doc[key] = by([runs[n][key] for n in counts])
    doc["identical"] = len(set(doc["centroids_sha256"].values())) == 1
    doc["lloyd_at_peak"] = by([lloyd_at_peak(runs[n]["batch_sizes"], first["dim"], first["k"],
                                             runs[n]["peak"]["gflops"]) for n in counts])
    doc["max_abs_diff"] = max(float(np.abs(c - C[0]).max()) for c in C)
    doc.update({"phases": phases, "total": total, "machine": first["machine"]})
    doc["peers"] = {
        name: {"seconds": {str(n): per[n] for n in sorted(per)},
               **project(sorted(per), [per[n] for n in sorted(per)], targets)}
        for name, per in (peers or {}).items()
    }  # fmt: skip
    return doc


def _counts(text: str) -> list[int]:
    """``"4,1,2"`` -> ``[1, 2, 4]``; each an integer >= 1."""
    try:
        counts = sorted({int(t) for t in text.split(",")})
    except ValueError:
        counts = [0]
    if counts[0] < 1:
        raise argparse.ArgumentTypeError(f"expected counts >= 1 such as 1,2, got {text!r}")
    return counts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.phases")
    p.add_argument("--dataset", choices=("npz", "mnist", "patches", "infmnist", "blobs"))
    for opt, kind, default in [
        ("--data", Path, None), ("--infmnist-n", int, 400_000), ("--data-seed", int, 0),
        ("--cache-dir", Path, None), ("--max-train", int, None), ("--max-test", int, None),
        ("--k", int, 50), ("--seed", int, 0), ("--rho", float, 100.0),
        ("--batch-size", int, 5000), ("--prefault-gb", float, None),
    ]:  # fmt: skip
        p.add_argument(opt, type=kind, default=default, help="as in the bench")
    p.add_argument("--bounds", default="auto", choices=("auto", "full", "group", "hamerly"))
    p.add_argument("--threads", type=_counts, default=[1, 2], help="thread counts (default 1,2)")
    p.add_argument("--budget", type=float, help="seconds of step time (default 20; quick 0.5)")
    p.add_argument("--max-iter", type=int, help="steps at most (default 100000; quick 300)")
    p.add_argument("--warmup", type=float, help="untimed seconds, <= 3 steps (default 0.5)")
    p.add_argument("--no-keep-memory", action="store_true", help="as in the bench")
    p.add_argument("--bandwidth-gib", type=float, help="bandwidth array (default 1; quick 1/8)")
    p.add_argument("--project", type=_counts, default=[8, 16, 64], help="cores to project to")
    p.add_argument("--peers", type=Path, help='{"name": {"1": s, "2": s}} or scaling.json')
    p.add_argument("--quick", action="store_true", help="small data and budgets (the bench's)")
    p.add_argument("--out", type=Path, help="default bench-results/phases-<dataset>")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)  # run one count, print JSON
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)  # exactly this many steps
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.dataset = args.dataset or ("npz" if args.data else "blobs")
    args.budget = args.budget if args.budget is not None else (0.5 if args.quick else 20.0)
    args.max_iter = args.max_iter or (300 if args.quick else 100_000)
    args.warmup = args.warmup if args.warmup is not None else (0.05 if args.quick else 0.5)
    args.bandwidth_gib = args.bandwidth_gib or (0.125 if args.quick else 1.0)
    if args.quick and args.prefault_gb is None:
        args.prefault_gb = 0.25
    if args.child is not None:  # the JSON document, as the last line of stdout
        sys.stdout.write(json.dumps(_child(args)) + "\n")
        return 0
    counts, targets = args.threads, args.project
    runs: dict[int, dict[str, Any]] = {}
    steps: list[str] = []
    for n in counts:  # the first runs to the stopping rule, the others as many steps
        print(f"threads {n}: profiling nmbatch ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "benchmarks.phases", *argv, "--child", str(n)]
        out = subprocess.run([*cmd, *steps], check=True, stdout=subprocess.PIPE, text=True,
                             env=child_env())
        runs[n] = json.loads(out.stdout.strip().splitlines()[-1])
        steps = steps or ["--steps", str(runs[n]["n_steps"])]
    doc = {"command": "python -m benchmarks.phases " + shlex.join(argv)}
    doc.update(summarize(runs, targets, read_peers(args.peers) if args.peers else None))
    doc["step_seconds"] = {str(n): runs[n]["step_seconds"] for n in counts}
    folder = args.out or Path("bench-results") / f"phases-{args.dataset}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "phases.json").write_text(json.dumps(doc, indent=1))
    (folder / "phases.md").write_text(markdown(doc))
    plot(folder / "phases.png", doc)
    print(markdown(doc))
    if not doc["identical"]:
        print("warning: the final centroids differ between thread counts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
