"""Runners of the user-mode benchmark: each method as a user runs it, its own defaults and
its own initialisation inside the clock (``python -m benchmarks --mode user``).

A runner is ``(UserProblem, Budget) -> Iterator[Snapshot]`` (the protocol's
:class:`~benchmarks.protocol.Snapshot`, consumed by :func:`~benchmarks.protocol.record`,
which measures ``E_V`` off the clock). The clock starts just before the estimator is built,
so input validation, copies, the store's loading and the seeding are all in it. How each
curve is sampled:

- ``nmbatch``: ``NestedMiniBatchKMeans(n_clusters=k, random_state=seed).fit(X)``, every
  other parameter at its default (``init="auto"``). A ``callback`` copies the centroids
  after every iteration; the time it spends is taken off the clock, and it stops the fit
  when the budget is spent.
- ``sklearn``: stock ``sklearn.cluster.KMeans(n_clusters=k, random_state=seed).fit(X)``
  (k-means++, ``n_init="auto"`` = 1, Lloyd), sampled at every iteration through its
  per-iteration kernel (as the shared mode's ``sklearn.lloyd``, :mod:`benchmarks.peers`).
- The others cannot report their centroids per iteration, so each is run afresh with an
  iteration cap of 1, 2, 4, 8, ... (up to its default cap), every run timed as a whole
  (its seeding included each time); point ``i`` of the curve is run ``i``'s time and
  centroids, the time lowered to the least of the later runs when noise made a shorter
  run slower (a run with fewer iterations cannot truly take longer). The ladder stops when
  a run stopped by itself before its cap (converged, or early termination: a longer cap
  would give the same result), at the method's default cap, or past the budget.

  - ``faiss``: ``faiss.Kmeans(d, k, niter=i, seed=seed).train(X)``: faiss's defaults,
    subsampling to ``256 k`` rows; caps 1, 2, 4, 8, 16, 25 (faiss's default ``niter``).
  - ``faiss.allrows``: faiss without subsampling (``max_points_per_centroid = n``): its
    iterations keep no state, so one run is sampled exactly by a chain of ``niter=1``
    calls, the first seeding itself as ``train(X)`` does, the next ones starting from the
    centroids before (each call timed in full); until the budget or a fixed point.
  - ``sklearnex``: ``sklearnex.cluster.KMeans(n_clusters=k, random_state=seed,
    max_iter=i).fit(X)`` (oneDAL; k-means++ seeding, its defaults); caps up to 300.
  - ``superkmeans``: ``SuperKMeans(k, d, seed=seed, iters=i).train(X)``, its defaults
    (30% sample, at most 256 rows per centroid, early termination; hierarchical above
    100,000 rows, where the ladder runs over ``iters_fineclustering`` up to its default
    5); caps 1, 2, 4, 8, 10.
  - ``superkmeans.full``: full precision without sampling or early termination, as its
    authors benchmark it: ``SuperKMeans(k, d, hierarchical=False, quantizer="f32",
    sampling_fraction=1.0, max_points_per_cluster=n, early_termination=False,
    iters=i)``; caps up to the budget's iteration limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.protocol import Budget, Snapshot, stepwise

__all__ = ["USER_METHODS", "UserProblem", "available", "ladder", "make_user_runner"]

USER_METHODS = (
    "nmbatch", "faiss", "faiss.allrows", "sklearnex", "superkmeans", "superkmeans.full",
    "sklearn",
)
# The Python module each method needs (optional extras: ``pip install nmbatch[bench]``).
MODULES = {
    "faiss": "faiss", "faiss.allrows": "faiss", "sklearnex": "sklearnex",
    "superkmeans": "superkmeans", "superkmeans.full": "superkmeans",
}


@dataclass(frozen=True)
class UserProblem:
    """What a user has: ``train`` ((n, d) float32, C-contiguous), ``k``, a ``seed`` for
    the method's own randomness, and the ``threads`` the method may use."""

    train: np.ndarray
    k: int
    seed: int
    threads: int = 1


UserRunner = Callable[[UserProblem, Budget], Iterator[Snapshot]]


def available(name: str) -> bool:
    """Whether the package method ``name`` needs imports here."""
    import importlib.util

    mod = MODULES.get(name)
    return mod is None or importlib.util.find_spec(mod) is not None


def ladder(
    fit: Callable[[int], tuple[np.ndarray, bool]], caps: list[int], budget: Budget
) -> Iterator[Snapshot]:
    """Run ``fit(cap)`` (returns centroids and "stopped before its cap") for each cap in
    ``caps``, each timed as a whole; yield one snapshot per run (times made monotone).
    Returns ``{"stop": ..., "caps": [...], "total_seconds_all_runs": ...}``."""
    runs: list[tuple[float, np.ndarray, int]] = []
    stop = "default_cap"
    for cap in caps:
        if cap > budget.max_iter:
            stop = "max_iter"
            break
        t0 = time.perf_counter()
        C, stopped = fit(cap)
        runs.append((time.perf_counter() - t0, np.array(C, dtype=np.float32), cap))
        if stopped:
            stop = "converged"
            break
        if runs[-1][0] >= budget.seconds:
            stop = "budget"
            break
    times = np.minimum.accumulate(np.array([t for t, _, _ in runs])[::-1])[::-1]
    for t, (_, C, cap) in zip(times, runs, strict=True):
        yield Snapshot(float(t), C, cap, converged=stop == "converged" and cap == runs[-1][2],
                       evaluate=True)
    return {"stop": stop, "caps": [c for _, _, c in runs],
            "total_seconds_all_runs": float(sum(t for t, _, _ in runs))}


def doubling(default_cap: int) -> list[int]:
    """1, 2, 4, ... below ``default_cap``, then ``default_cap``."""
    caps = [1]
    while caps[-1] * 2 < default_cap:
        caps.append(caps[-1] * 2)
    return [*caps, default_cap] if default_cap > 1 else [1]


def run_nmbatch(problem: UserProblem, budget: Budget) -> Iterator[Snapshot]:
    from nmbatch.engine import NestedMiniBatchKMeans

    samples: list[tuple[float, np.ndarray, int, bool]] = []
    paused = 0.0
    t0 = 0.0

    def watch(stats: Any, state: Any) -> bool:  # the estimator's callback
        nonlocal paused
        enter = time.perf_counter()
        t = enter - t0 - paused
        samples.append((t, np.array(state.centroids), int(stats.iteration),
                        bool(stats.converged)))
        paused += time.perf_counter() - enter
        return t >= budget.seconds or len(samples) >= budget.max_iter

    t0 = time.perf_counter()
    est = NestedMiniBatchKMeans(problem.k, random_state=problem.seed, callback=watch,
                                n_threads=problem.threads)
    est.fit(problem.train)
    fit_seconds = time.perf_counter() - t0 - paused
    for t, C, it, conv in samples:
        yield Snapshot(t, C, it, converged=conv)
    stop = "converged" if samples and samples[-1][3] else "budget"
    return {"stop": stop, "fit_seconds": fit_seconds, "init": str(est.init)}


def run_sklearn(problem: UserProblem, budget: Budget) -> Iterator[Snapshot]:
    from sklearn.cluster import KMeans

    from benchmarks.peers import recorded_kmeans_fit

    def make() -> KMeans:
        return KMeans(n_clusters=problem.k, random_state=problem.seed,
                      max_iter=min(300, budget.max_iter))

    return (yield from recorded_kmeans_fit(make, problem.train, "lloyd", budget))


def run_faiss(problem: UserProblem, budget: Budget) -> Iterator[Snapshot]:
    import faiss

    X = problem.train
    d = X.shape[1]

    def fit(cap: int) -> tuple[np.ndarray, bool]:
        km = faiss.Kmeans(d, problem.k, niter=cap, seed=problem.seed)
        km.train(X)
        return km.centroids, False

    return (yield from ladder(fit, doubling(25), budget))


def run_faiss_allrows(problem: UserProblem, budget: Budget) -> Iterator[Snapshot]:
    import faiss

    X = problem.train
    n, d = X.shape
    C: np.ndarray | None = None

    def step() -> bool:
        nonlocal C
        km = faiss.Kmeans(d, problem.k, niter=1, seed=problem.seed,
                          max_points_per_centroid=max(n, 1),
                          check_input_data_for_NaNs=C is None)
        if C is None:
            km.train(X)
            converged = False
        else:
            km.train(X, init_centroids=C)
            converged = np.array_equal(km.centroids, C)
        C = km.centroids
        return converged

    return (yield from stepwise(step, lambda: C, budget))


def run_sklearnex(problem: UserProblem, budget: Budget) -> Iterator[Snapshot]:
    from sklearnex.cluster import KMeans

    def fit(cap: int) -> tuple[np.ndarray, bool]:
        est = KMeans(n_clusters=problem.k, random_state=problem.seed, max_iter=cap)
        est.fit(problem.train)
        return est.cluster_centers_, int(est.n_iter_) < cap

    return (yield from ladder(fit, doubling(300), budget))


def _superkmeans(full: bool) -> UserRunner:
    def run(problem: UserProblem, budget: Budget) -> Iterator[Snapshot]:
        from superkmeans import SuperKMeans

        X = problem.train
        n, d = X.shape
        hierarchical = not full and n > 100_000  # its own rule for hierarchical=None
        common = {"seed": problem.seed, "n_threads": problem.threads}
        if full:
            common |= {"hierarchical": False, "quantizer": "f32", "sampling_fraction": 1.0,
                       "max_points_per_cluster": n, "early_termination": False}

        def fit(cap: int) -> tuple[np.ndarray, bool]:
            it = {"iters_fineclustering": cap} if hierarchical else {"iters": cap}
            km = SuperKMeans(problem.k, d, **common, **it)
            C = km.train(X)
            done = (not full and not hierarchical and len(km.iteration_stats) < cap)
            return C, done

        caps = doubling(5 if hierarchical else 10) if not full else doubling(budget.max_iter)
        return (yield from ladder(fit, caps, budget))

    return run


RUNNERS: dict[str, UserRunner] = {
    "nmbatch": run_nmbatch,
    "sklearn": run_sklearn,
    "faiss": run_faiss,
    "faiss.allrows": run_faiss_allrows,
    "sklearnex": run_sklearnex,
    "superkmeans": _superkmeans(full=False),
    "superkmeans.full": _superkmeans(full=True),
}


def make_user_runner(name: str) -> UserRunner:
    """The user-mode runner of method ``name`` (one of :data:`USER_METHODS`)."""
    try:
        return RUNNERS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose from {USER_METHODS}") from None
