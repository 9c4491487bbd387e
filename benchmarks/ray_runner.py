"""The benchmark's runner of distributed nmbatch: ``ray.P`` is nmbatch on ``P`` shard actors.

``--algorithms nmbatch,ray.1,ray.2,ray.4`` times the distributed algorithm under the
same protocol as every other runner (:mod:`benchmarks.protocol`): the same
shuffled training set and initial centroids, and the same nested prefix as the
single-machine ``nmbatch`` (the priorities are the store's shuffle with the problem's
seed, :func:`~nmbatch.engine.distributed.fit.priorities`), so both runs compute the same
model and the difference in time is the cost of running it on a cluster.

Not timed, reported apart in the notes as ``setup_seconds``: putting the partitions in
Ray's object store (rows to shard ``i mod P``), starting the ``P`` actors and loading
their kernels (:meth:`~nmbatch.engine.distributed.shard.ShardState.warm_up`), as a
long-running service does once. Timed: every round (:meth:`Coordinator.step`), from the
first ``tau`` search to the doubling test, with the coordinator's waits on the shards.
Each shard's kernels run on the benchmark's thread count, BLAS on one.

The first ``ray.P`` run starts a local Ray (every core, no dashboard) that lives as long
as the benchmark's process; a Ray already initialised in the process is used as it is.
Notes: ``setup_seconds``, ``iterations``, ``final_batch_size``, ``round_bytes`` (median
bytes sent + received per round), ``round_seconds`` (median seconds per round),
``shard_seconds`` (median over rounds of the slowest shard's own step time),
``overhead_seconds`` (the run's round time not spent in the slowest shard's step: Ray's
calls and the coordinator's work), ``n_shards``, ``n_lost``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import numba
import numpy as np

from benchmarks.protocol import Budget, Problem, Runner, Snapshot, stepwise

__all__ = ["RAY_NAME", "is_ray_name", "run_ray"]

RAY_NAME = re.compile(r"^ray\.(?P<shards>[1-9][0-9]*)$")
"""``ray.P``: nmbatch on ``P`` shard actors."""


def is_ray_name(name: str) -> bool:
    """True for ``ray.P`` with ``P >= 1``."""
    return RAY_NAME.match(name) is not None


def _ensure_ray() -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False,
                 log_to_driver=False)


def run_ray(name: str) -> Runner:
    """Runner of ``ray.P`` (:data:`RAY_NAME`)."""
    match = RAY_NAME.match(name)
    if match is None:
        raise ValueError(f"not a ray.P name: {name!r}")
    n_shards = int(match["shards"])

    def run(problem: Problem, budget: Budget) -> Iterator[Snapshot]:
        import ray

        from nmbatch.engine.distributed.coordinator import Coordinator
        from nmbatch.engine.distributed.fit import partition, priorities

        X = problem.train
        t0 = time.perf_counter()
        _ensure_ray()
        pi = priorities(X.shape[0], problem.seed)
        parts = [(ray.put(X[ids]), ids, pi[ids]) for ids in partition(X.shape[0], n_shards)]
        coord = Coordinator(
            parts, problem.k, X.shape[1], init=problem.init, rho=problem.rho,
            batch_size=problem.batch_size, random_state=problem.seed,
            n_threads=numba.get_num_threads(),
        )  # fmt: skip
        seconds: list[float] = []
        try:
            ray.get([shard.warm_up.remote() for shard in coord.shards])
            setup = time.perf_counter() - t0

            def step() -> bool:
                stats = coord.step()
                seconds.append(stats.seconds)
                return stats.converged

            notes = yield from stepwise(step, lambda: coord.centroids, budget)
        finally:
            coord.close()
        totals = [sent + received for sent, received in coord.round_bytes]
        notes.update(
            setup_seconds=setup, iterations=int(coord.iteration),
            final_batch_size=int(coord.batch_size), n_shards=n_shards,
            round_bytes=float(np.median(totals)) if totals else 0.0,
            round_seconds=float(np.median(seconds)) if seconds else 0.0,
            shard_seconds=float(np.median(coord.round_shard_seconds)) if seconds else 0.0,
            overhead_seconds=float(sum(seconds) - sum(coord.round_shard_seconds)),
            n_lost=int(coord.n_lost),
        )  # fmt: skip
        return notes

    return run
