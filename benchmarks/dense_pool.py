"""``python -m benchmarks.dense_pool``: the dense pass per chunk on the BLAS pool
(``engine.pooled``) against the pass it replaced, in one process, interleaved.

Both variants run the same nmbatch fit (the seed's shuffled problem, ``--steps`` steps,
the kernels on ``--threads`` threads and BLAS on one, as the bench runs nmbatch); "before"
has ``use_pool`` switched off, so its dense passes take the products of several chunks on
the pool, then numba's parallel kernel. The order alternates between repeats. Per run:
the steps' wall and CPU seconds, the seconds inside ``_dense_pass`` (new samples and dense
revisits) and the centroids' hash (the same for both: the results are bit-identical);
then the medians, and the 1-minute load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

import numpy as np

__all__ = ["main"]


def _run(pr: Any, args: argparse.Namespace, pooled: bool) -> dict[str, Any]:
    from nmbatch.engine import NestedBatchStore, make_algorithm
    from nmbatch.engine.algorithms import base
    from nmbatch.engine.pooled import use_pool
    from nmbatch.engine.threads import kernel_threads

    dense = [0.0]
    real = base.KMeansAlgorithm._dense_pass

    def timed(self: Any, *a: Any, **kw: Any) -> int:
        t0 = time.perf_counter()
        try:
            return real(self, *a, **kw)
        finally:
            dense[0] += time.perf_counter() - t0

    base.use_pool = use_pool if pooled else (lambda *a: False)
    base.KMeansAlgorithm._dense_pass = timed
    try:
        store = NestedBatchStore(pr.train.shape[1], seed=pr.seed, capacity=pr.train.shape[0])
        store.append(pr.train)
        algo = make_algorithm("nmbatch", store, pr.k, init=pr.init, random_state=pr.seed,
                              rho=pr.rho, batch_size=pr.batch_size, bounds=args.bounds)
        with kernel_threads(args.threads):
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                algo.step()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        base.use_pool = use_pool
        base.KMeansAlgorithm._dense_pass = real
    digest = hashlib.sha256(np.ascontiguousarray(algo.centroids).tobytes()).hexdigest()[:16]
    return {"wall": wall, "cpu": cpu, "dense": dense[0], "sha256": digest,
            "load": os.getloadavg()[0]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from benchmarks.options import load_dataset
    from benchmarks.process import limit_threads
    from benchmarks.protocol import shuffled_problem

    p = argparse.ArgumentParser(prog="python -m benchmarks.dense_pool", description=__doc__)
    p.add_argument("--dataset", choices=("npz", "mnist", "patches", "blobs"), default="patches")
    p.add_argument("--data", default=None, help="an .npz (--dataset npz or mnist)")
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bounds", choices=("auto", "full", "group", "hamerly"), default="auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small data (the bench's)")
    args = p.parse_args(argv)
    data = argparse.Namespace(dataset=args.dataset, data=args.data, infmnist_n=None,
                              data_seed=0, cache_dir=None, max_train=None, max_test=None,
                              quick=args.quick)  # fmt: skip
    ds = load_dataset(data)
    limit_threads(args.threads)
    pr = shuffled_problem(ds.train, 0, args.k, rho=100.0, batch_size=5000)
    _run(pr, args, True), _run(pr, args, False)  # warm-up: compile, caches
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "pooled": []}
    for r in range(args.repeats):
        for name in ("before", "pooled") if r % 2 == 0 else ("pooled", "before"):
            time.sleep(0.2)
            got = _run(pr, args, name == "pooled")
            runs[name].append(got)
            print(f"{ds.name} k={args.k} {args.bounds} {args.threads}t rep {r} {name:6s} "
                  + " ".join(f"{key} {val:.2f}" if isinstance(val, float) else f"{key} {val}"
                             for key, val in got.items()), flush=True)  # fmt: skip
    for name, rs in runs.items():
        med = {key: float(np.median([x[key] for x in rs])) for key in ("wall", "cpu", "dense")}
        print(f"{name}: median " + ", ".join(f"{key} {v:.2f} s" for key, v in med.items()))
    same = len({x["sha256"] for rs in runs.values() for x in rs}) == 1
    print(f"centroids bit-identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
