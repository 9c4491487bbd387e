"""Runners for the engine's own algorithms, and their JIT warm-up.

``run_ours(name)`` appends the seed-shuffled training set to a fresh
:class:`engine.NestedBatchStore` (the store then shuffles its tail itself), builds
``engine.make_algorithm(name, store, k, init=C0, rho=..., batch_size=...)`` with the
explicit initial centroids ``C0`` (so every algorithm starts from the same place) and
times each ``algo.step()``. Building the algorithm is inside the first timed step; loading
the store is not (it is the data's input format, as ``X`` in memory is for the peers) and
its time is reported apart, as ``notes["store_load_seconds"]``. The steps run with the
kernels on the bench's thread count and BLAS on one (``engine.threads.kernel_threads``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numba
import numpy as np

from benchmarks.protocol import Budget, Problem, Runner, Snapshot, stepwise
from nmbatch.engine.threads import kernel_threads

__all__ = ["OURS", "jit_warmup", "run_ours"]

OURS = (
    "nmbatch", "nmbatch.deact", "mbatch", "mbatch.remove", "lloyd", "elkan", "nmbatch.strict",
    "nmbatch.swap", "nmbatch.noswap",
)
# Bench-only variants: (algorithm, attributes set on it). nmbatch.strict: the paper's
# doubling test, every moved cluster must pass (.growth.doubling_allowance: none) with the
# problem's rho (.growth.doubling_rho: no lower rho at large k).
# nmbatch.swap / nmbatch.noswap: nmbatch with cluster swaps on / off (.algorithms.swap;
# nmbatch's default turns them on when the first batch is sized to k).
VARIANTS = {
    "nmbatch.strict": ("nmbatch", {"doubling_tolerance": 0.0, "large_k_rho": float("inf")}),
    "nmbatch.swap": ("nmbatch", {"swap": True}),
    "nmbatch.noswap": ("nmbatch", {"swap": False}),
}


def run_ours(name: str, rho: float | None = None) -> Runner:
    """Runner of engine algorithm ``name`` (or a bench variant, :data:`VARIANTS`); ``rho``
    overrides the problem's."""
    base, attrs = VARIANTS.get(name, (name, {}))

    def run(problem: Problem, budget: Budget) -> Iterator[Snapshot]:
        from nmbatch.engine import NestedBatchStore, make_algorithm

        X = problem.train
        t0 = time.perf_counter()
        store = NestedBatchStore(X.shape[1], seed=problem.seed, capacity=X.shape[0])
        store.append(X)
        load = time.perf_counter() - t0
        algo = None
        last = None

        def step() -> bool:
            nonlocal algo, last
            if algo is None:
                algo = make_algorithm(
                    base, store, problem.k, init=problem.init,
                    rho=problem.rho if rho is None else rho,
                    batch_size=problem.batch_size, random_state=problem.seed,
                )
                for attr, value in attrs.items():
                    setattr(algo, attr, value)
            last = algo.step()
            return last.converged

        # Kernels on the bench's thread count, BLAS on one (nmbatch.engine.threads).
        with kernel_threads(numba.get_num_threads()):
            notes = yield from stepwise(step, lambda: algo.centroids, budget)
        notes["store_load_seconds"] = load
        if last is not None:
            notes["final_batch_size"] = int(last.batch_size)
            notes["iterations"] = int(last.iteration)
        return notes

    return run


def jit_warmup(train: np.ndarray, k: int, names: tuple[str, ...] = OURS) -> float:
    """Run each of ``names`` once on a small problem (2,000 rows of ``train``, initial
    batch 200, up to 8 steps; nmbatch also with each revisit path forced, with full and
    with group bounds, since ``auto`` picks groups at a large ``k``) so numba compiles
    every kernel, and compute one energy; returns the wall time of it all, in seconds."""
    from nmbatch.engine import NestedBatchStore, energy, make_algorithm
    from nmbatch.engine.kernels.exact import closer_to, own_sqdist

    t0 = time.perf_counter()
    X = np.ascontiguousarray(train[: max(2000, 4 * k)], dtype=np.float32)
    bases = tuple(dict.fromkeys(VARIANTS.get(n, (n,))[0] for n in names))
    runs = [(name, None, "auto") for name in bases]
    if "nmbatch" in bases:  # both paths of the bounded revisit, whichever the data picks
        runs += [("nmbatch", f, b) for b in ("full", "group") for f in (-1.0, np.inf)]
    for name, fraction, bounds in runs:
        store = NestedBatchStore(X.shape[1], seed=0, capacity=X.shape[0])
        store.append(X)
        options = {"bounds": bounds} if name == "nmbatch" else {}
        algo = make_algorithm(name, store, k, init=X[:k].copy(), batch_size=200,
                              random_state=0, **options)
        if fraction is not None:
            algo.dense_revisit_fraction = fraction
        for _ in range(8):
            if algo.step().converged:
                break
        energy(X[:500], algo.centroids)
    # Relocation's exact distances: a step relocates only when a cluster empties
    dist2 = own_sqdist(X, X.shape[0], np.zeros(X.shape[0], dtype=np.int32), X[:k])
    closer_to(dist2, X, X.shape[0], X[0])
    return time.perf_counter() - t0
