"""The time exact deletion takes: ``NestedMiniBatchKMeans.forget`` on a model of a million.

Fits ``NestedMiniBatchKMeans(n_clusters=k, random_state=seed, n_threads=1)`` to ``n``
synthetic samples (``k`` Gaussian blobs in ``d`` dimensions: centres ``4 x`` standard
normal, unit noise; seeded), to convergence or ``--max-iter``, then times ``forget`` of
``1``, ``1,000`` and ``100,000`` ids drawn uniformly from the samples still stored, each
size ``--repeat`` times (the large size once by default: it takes a tenth of the model),
in the order small to large, on the same model (converged by default, so its nested
batch holds every sample): the model holds ``n`` samples minus those
already deleted (each record gives ``n_before``). ``lookup`` of 1 and 1,000 stored ids is
timed too, and a few iterations after the deletions (the model going on).

    taskset -c 0 python -m benchmarks.forget --out docs/bench/forget

Writes ``OUT/forget.json`` (the records, the machine, the parameters) and ``OUT/forget.md``
(a table: median seconds per size).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.machine import machine_info

__all__ = ["blobs", "forget_run", "main", "report"]

SIZES = (1, 1_000, 100_000)


def blobs(n: int, d: int, k: int, seed: int) -> np.ndarray:
    """``(n, d)`` float32: ``k`` centres ``4 x`` standard normal, each row one of them
    (uniformly) plus standard normal noise."""
    rng = np.random.default_rng(seed)
    centres = (4.0 * rng.standard_normal((k, d))).astype(np.float32)
    X = rng.standard_normal((n, d), dtype=np.float32)
    X += centres[rng.integers(0, k, size=n)]
    return X


def forget_run(
    n: int, d: int, k: int, *, seed: int = 0, repeat: int = 5, repeat_large: int = 1,
    max_iter: int = 300, sizes: tuple[int, ...] = SIZES,
) -> dict[str, Any]:  # fmt: skip
    """Fit, then time ``forget`` and ``lookup`` (module docstring); returns the records."""
    from nmbatch.engine import NestedMiniBatchKMeans

    X = blobs(n, d, k, seed)
    km = NestedMiniBatchKMeans(n_clusters=k, random_state=seed, n_threads=1, max_iter=max_iter)
    t0 = time.perf_counter()
    km.fit(X)
    fit_seconds = time.perf_counter() - t0
    del X
    rng = np.random.default_rng(seed + 1)
    records: list[dict[str, Any]] = []
    for m in (1, 1_000):
        for _ in range(repeat):
            ids = rng.choice(km._store.ids(), size=m, replace=False)
            t0 = time.perf_counter()
            look = km.lookup(ids)
            records.append({"op": "lookup", "m": m, "n_before": km.n_samples_retained_,
                            "batch": km._algorithm.batch_size,
                            "seconds": time.perf_counter() - t0})  # fmt: skip
            assert look.present.all()
    for m in sizes:
        for _ in range(repeat_large if m >= 100_000 else repeat):
            ids = rng.choice(km._store.ids(), size=m, replace=False)
            n_before = km.n_samples_retained_
            batch = km._algorithm.batch_size
            t0 = time.perf_counter()
            deleted = km.forget(ids)
            seconds = time.perf_counter() - t0
            assert deleted == m
            records.append({"op": "forget", "m": m, "n_before": n_before, "batch": batch,
                            "seconds": seconds})  # fmt: skip
    steps = []
    for _ in range(3):
        t0 = time.perf_counter()
        km._algorithm.step()
        steps.append(time.perf_counter() - t0)
    return {
        "n": n, "d": d, "k": k, "seed": seed, "fit_seconds": fit_seconds,
        "fit_iterations": int(km.n_iter_), "batch_after_fit": int(km.batch_size_),
        "records": records, "step_seconds_after": steps,
        "n_after": int(km.n_samples_retained_),
    }  # fmt: skip


def report(run: dict[str, Any]) -> str:
    """The markdown table of a run: median seconds per operation and size."""
    cores = run.get("machine", {}).get("cores_available", "?")
    lines = [
        f"# Exact deletion: `forget` on a model of {run['n']:,} samples",
        "",
        f"Synthetic blobs, `d = {run['d']}`, `k = {run['k']}`, seed {run['seed']}; "
        f"`fit` took {run['fit_seconds']:.1f} s ({run['fit_iterations']} iterations, "
        f"nested batch {run['batch_after_fit']:,} at its end). One thread "
        f"(`n_threads=1`), {cores} core(s) available to the process. Each size's ids "
        f"drawn uniformly from the samples still stored; sizes run small to large on the "
        f"same model.",
        "",
        "| operation | ids | samples stored before | nested batch | runs | median seconds "
        "| fastest run (s) | per id, median (µs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for op in ("forget", "lookup"):
        sizes = sorted({r["m"] for r in run["records"] if r["op"] == op})
        for m in sizes:
            recs = [r for r in run["records"] if r["op"] == op and r["m"] == m]
            sec = float(np.median([r["seconds"] for r in recs]))
            fastest = min(r["seconds"] for r in recs)
            lines.append(
                f"| `{op}` | {m:,} | {recs[0]['n_before']:,} | {recs[0]['batch']:,} | "
                f"{len(recs)} | {sec:.4f} | {fastest:.4f} | {1e6 * sec / m:.2f} |"
            )
    steps = ", ".join(f"{s:.2f}" for s in run["step_seconds_after"])
    lines += ["", f"Iterations after the deletions (model of {run['n_after']:,}): {steps} s."]
    if "load_average" in run:
        load = ", ".join(f"{x:.1f}" for x in run["load_average"])
        lines += ["", f"Load average at the end of the run (1, 5, 15 min): {load}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.forget", description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--repeat-large", type=int, default=3)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    sizes = tuple(m for m in SIZES if m <= args.n // 4)
    run = forget_run(
        args.n, args.d, args.k, seed=args.seed, repeat=args.repeat,
        repeat_large=args.repeat_large, max_iter=args.max_iter, sizes=sizes,
    )  # fmt: skip
    run["machine"] = machine_info()
    run["load_average"] = os.getloadavg()  # 1, 5, 15 minutes: the machine may be shared
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "forget.json").write_text(json.dumps(run, indent=1) + "\n")
    (args.out / "forget.md").write_text(report(run))
    print(report(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
