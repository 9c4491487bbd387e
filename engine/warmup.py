"""Load every numba kernel the engine runs, once, before the work that must not wait for it.

Numba compiles (or, with ``cache=True``, loads from its on-disk cache) a kernel the first
time it is called with a new type signature. The signature depends on dtypes and array
layouts only, never on ``k`` or ``d``, so one small problem reaches every kernel the
engine calls on real data: each path of nmbatch's bounded revisit, a restore from
centroids, retirements (votes taken back, the store compacted), and the exact lookups
(``nearest``, ``nearest_one``, ``energy``). It runs on one thread, then on two (every
parallel path taken, whatever the size: ``kernels.parallel.every_parallel_path``) when
numba may use two, so the single-thread and the parallel kernels are both ready.
"""

from __future__ import annotations

import contextlib
import time

import numba
import numpy as np

from nmbatch.engine.algorithms import make_algorithm
from nmbatch.engine.assign import energy, nearest, nearest_one
from nmbatch.engine.kernels.exact import closer_to, own_sqdist
from nmbatch.engine.kernels.parallel import every_parallel_path
from nmbatch.engine.kernels.update import centroid_of
from nmbatch.engine.metric import unit_rows
from nmbatch.engine.seeding import kmeans_plusplus_rejection
from nmbatch.engine.store import NestedBatchStore
from nmbatch.engine.threads import thread_limits

__all__ = ["warm_up"]


def warm_up(*, k: int = 4, dim: int = 8, n: int = 2000, seed: int = 0) -> float:
    """Run nmbatch and the exact lookups on ``n`` random ``float32`` rows of dimension ``dim``.

    nmbatch runs three times (its automatic revisit, then the revisit forced to the BLAS
    path and to the scalar path), each from k-means++ with an initial batch of ``n // 10``
    until it has used all ``n`` rows or converged, then once more restored from its own
    centroids; then rows are retired by id (below a threshold, and a set) and it steps
    again. Returns the wall time, in seconds.
    """
    t0 = time.perf_counter()
    for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
        paths = every_parallel_path() if threads > 1 else contextlib.nullcontext()
        with thread_limits(threads), paths:
            _run(k=k, dim=dim, n=n, seed=seed)
    return time.perf_counter() - t0


def _run(*, k: int, dim: int, n: int, seed: int) -> None:
    """One pass of :func:`warm_up` at the current thread count."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim)).astype(np.float32)
    for fraction in (None, -1.0, np.inf):  # automatic, always BLAS, always scalar
        store = NestedBatchStore(dim, seed=seed, capacity=n)
        store.append(X)
        algo = make_algorithm(
            "nmbatch", store, k, init="k-means++", batch_size=n // 10, random_state=seed
        )
        if fraction is not None:
            algo.dense_revisit_fraction = fraction
        for _ in range(16):
            if algo.step().converged and algo.batch_size == n:
                break
        algo.restore(algo.centroids, algo.batch_size, algo.iteration)
        algo.step()
        algo.energy_estimate()
    # Exact forgetting: a window's retirement, a reservoir's, then a step.
    algo.retire(before=n // 20)
    algo.retire(ids=store.ids()[::7])
    algo.step()
    C = np.ascontiguousarray(algo.centroids, dtype=np.float32)
    # Relocation's and swaps' exact distances (a step relocates only when a cluster empties)
    dist2 = own_sqdist(X, n, np.zeros(n, dtype=np.int32), C)
    closer_to(dist2, X, n, X[0])
    # A centroid from its sums, as the relocation and the swaps derive it; unit rows
    # (metric="cosine": the same kernels after ingestion).
    centroid_of(algo.S, algo.v, 0, False, C[0].copy())
    unit_rows(X[:4])
    # "auto"'s seeding at large k (one trial, by rejection): its two kernels.
    kmeans_plusplus_rejection(X[: 8 * k], 2 * k, rng)
    nearest(X, C)
    nearest_one(X[0], C)
    energy(X, C)
