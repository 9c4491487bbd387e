"""Time whole nmbatch fits of one commit, and hash what they produce.

Run from two environments (one with the old commit installed, one with the new), in
alternation, to see whether a change to a kernel slowed the single-thread path, and that
the models are the same bit for bit::

    python -m benchmarks.fit_timing --dataset mnist \\
        --threads 1 --repeats 5 --label new --out docs/bench/threads/old-vs-new

Each fit is the benchmark's nmbatch run (:mod:`benchmarks.ours`: the
seed-shuffled store, the first ``k`` shuffled rows as initial centroids, steps until
convergence, the kernels on ``--threads`` threads and BLAS on one); only the steps are
timed. Appends one JSON line per fit to
``OUT/fits.jsonl``: label, dataset, seed, threads, seconds, steps, and the SHA-256 of the
final centroids and labels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


def _fit(train: np.ndarray, seed: int, k: int) -> tuple[float, int, str]:
    from benchmarks.protocol import shuffled_problem
    from nmbatch.engine import NestedBatchStore, make_algorithm

    problem = shuffled_problem(train, seed, k, rho=100.0, batch_size=5000)
    store = NestedBatchStore(train.shape[1], seed=problem.seed, capacity=train.shape[0])
    store.append(problem.train)
    algo = make_algorithm("nmbatch", store, k, init=problem.init, rho=100.0,
                          batch_size=5000, random_state=problem.seed)  # fmt: skip
    import numba

    from nmbatch.engine.threads import kernel_threads

    with kernel_threads(numba.get_num_threads()):  # as the bench: BLAS on one thread
        t0 = time.perf_counter()
        steps = 0
        while steps < 100_000:
            steps += 1
            if algo.step().converged:
                break
        seconds = time.perf_counter() - t0
    h = hashlib.sha256(algo.centroids.tobytes())
    h.update(algo.labels().tobytes())
    return seconds, steps, h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the fits, append their records; returns 0."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.fit_timing", description=__doc__)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label", required=True)
    p.add_argument("--max-train", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from benchmarks.options import build_parser, load_dataset
    from benchmarks.process import limit_threads

    bench_args = build_parser().parse_args(
        ["--dataset", args.dataset, "--threads", str(args.threads)]
        + (["--data", str(args.data)] if args.data else [])
        + (["--max-train", str(args.max_train)] if args.max_train else [])
    )
    ds = load_dataset(bench_args)
    limit_threads(args.threads)
    train = np.ascontiguousarray(ds.train, dtype=np.float32)
    _fit(train[: max(2000, 4 * args.k)], 0, args.k)  # compile
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "fits.jsonl", "a") as f:
        for _ in range(args.repeats):
            for seed in range(args.seeds):
                seconds, steps, digest = _fit(train, seed, args.k)
                record = {"label": args.label, "dataset": ds.name, "seed": seed,
                          "threads": args.threads, "seconds": round(seconds, 4),
                          "steps": steps, "sha256": digest}  # fmt: skip
                f.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
