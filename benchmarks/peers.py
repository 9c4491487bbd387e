"""Runners for the peers: scikit-learn's MiniBatchKMeans and KMeans, and faiss's Kmeans.

Each factory returns a :data:`~benchmarks.protocol.Runner` starting from the problem's
initial centroids. How each curve is sampled (what is timed):

- ``sklearn.minibatch.<b>``: ``MiniBatchKMeans(batch_size=b, init=C0, n_init=1,
  compute_labels=False)`` driven with ``partial_fit``; each step draws ``b`` row indices
  uniformly with replacement (as ``fit`` does) and calls ``partial_fit(X[idx])``. The
  estimator's construction, the index draw, the gather copy and ``partial_fit`` (with its
  per-call input validation) are timed.
- ``sklearn.lloyd`` / ``sklearn.elkan``: one ordinary ``KMeans(init=C0, n_init=1,
  algorithm=...).fit(X)`` with the default ``tol``. A thin wrapper around scikit-learn's
  per-iteration kernel (``lloyd_iter_chunked_dense`` / ``elkan_iter_chunked_dense``,
  looked up by ``_kmeans_single_*`` at call time) records ``perf_counter`` and a copy of
  the new centres after each iteration; the time is from just before the estimator is
  built. So the whole fit is timed as a user runs it (validation, the centring copy,
  norms, Elkan's bound initialisation) and the curve is sampled at every iteration. The
  final extra E-step and inertia of ``fit`` come after the last sample and are not in any
  sampled time. Centres are recorded centred and shifted back by the same ``X.mean(0)``
  that ``fit`` subtracts.
- ``faiss``: ``faiss.Kmeans`` with subsampling off (``max_points_per_centroid >= n``):
  a chain of ``train(X, init_centroids=C)`` calls with ``niter=1``, each starting from the
  previous centroids, each timed in full. faiss's iterations keep no state between them
  (no bounds), so the chain computes exactly one long run; the per-call overhead (a new
  ``Clustering``, an ``O(n)`` random permutation, index rebuild) is counted. The NaN scan
  of the input runs in the first call only, as in a single run. Stops when an iteration
  leaves the centroids unchanged.
- ``faiss.subsampled``: faiss's defaults (``max_points_per_centroid=256``, ``niter=25``):
  for ``i = 1..25`` a fresh ``train(X, init_centroids=C0)`` with ``niter=i``, each run
  timed in full; point ``i`` of the curve is (time of run ``i``, its centroids), the time
  lowered to the least of runs ``i..25`` when noise made a shorter run slower. Exact, at
  a quadratic cost bounded by ``niter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from benchmarks.protocol import Budget, Problem, Runner, Snapshot, stepwise

__all__ = [
    "FAISS_DEFAULT_NITER",
    "PEERS",
    "faiss_full",
    "faiss_subsampled",
    "make_peer",
    "recorded_kmeans_fit",
    "sklearn_kmeans",
    "sklearn_minibatch",
]

PEERS = (
    "sklearn.minibatch.5000",
    "sklearn.minibatch.1024",
    "sklearn.lloyd",
    "sklearn.elkan",
    "faiss",
    "faiss.subsampled",
)
FAISS_DEFAULT_NITER = 25


def sklearn_minibatch(batch_size: int) -> Runner:
    """``MiniBatchKMeans`` with batch ``batch_size``, one ``partial_fit`` per step."""

    def run(problem: Problem, budget: Budget) -> Iterator[Snapshot]:
        from sklearn.cluster import MiniBatchKMeans

        X = problem.train
        n = X.shape[0]
        draws = np.random.RandomState(problem.seed)
        est: MiniBatchKMeans | None = None

        def step() -> bool:
            nonlocal est
            if est is None:
                est = MiniBatchKMeans(
                    n_clusters=problem.k, init=problem.init, n_init=1,
                    batch_size=batch_size, compute_labels=False, random_state=problem.seed,
                )
            est.partial_fit(X[draws.randint(0, n, batch_size)])
            return False  # partial_fit has no convergence test

        return (yield from stepwise(step, lambda: est.cluster_centers_, budget))

    return run


class _BudgetExceededError(Exception):
    pass


def recorded_kmeans_fit(
    make: Callable[[], object], X: np.ndarray, algorithm: str, budget: Budget
) -> Iterator[Snapshot]:
    """Fit ``make()`` (a scikit-learn ``KMeans`` with ``algorithm``) on ``X``, timed from
    just before ``make`` is called, with a snapshot after every iteration (the kernel
    wrapper described in this module's docstring); returns ``{"stop", "fit_seconds"}``."""
    import sklearn.cluster._kmeans as km

    attr = f"{algorithm}_iter_chunked_dense"
    kernel = getattr(km, attr)
    shift = X.mean(axis=0)  # what fit subtracts (same dtype, same reduction)
    samples: list[tuple[float, np.ndarray]] = []
    t0 = 0.0

    def recording_kernel(*args, **kwargs):
        kernel(*args, **kwargs)
        if kwargs.get("update_centers", True):
            t = time.perf_counter() - t0
            samples.append((t, np.array(args[3])))  # centers_new, centred
            if t >= budget.seconds:
                raise _BudgetExceededError

    setattr(km, attr, recording_kernel)
    try:
        t0 = time.perf_counter()
        est = make()
        try:
            est.fit(X)
            stop = "converged" if est.n_iter_ < est.max_iter else "max_iter"
        except _BudgetExceededError:
            stop = "budget"
        fit_seconds = time.perf_counter() - t0
    finally:
        setattr(km, attr, kernel)
    if not samples:
        raise RuntimeError(
            f"scikit-learn never called {attr}: its internals changed; "
            f"the per-iteration sampling of sklearn.{algorithm} must be revisited"
        )
    for i, (t, centred) in enumerate(samples):
        last = i == len(samples) - 1
        yield Snapshot(t, centred + shift, i + 1, converged=last and stop == "converged")
    return {"stop": stop, "fit_seconds": fit_seconds}


def sklearn_kmeans(algorithm: str) -> Runner:
    """``KMeans(algorithm=algorithm)`` fitted once, sampled at every iteration."""
    if algorithm not in ("lloyd", "elkan"):
        raise ValueError(f"algorithm must be 'lloyd' or 'elkan', got {algorithm!r}")

    def run(problem: Problem, budget: Budget) -> Iterator[Snapshot]:
        from sklearn.cluster import KMeans

        def make() -> KMeans:
            return KMeans(
                n_clusters=problem.k, init=problem.init, n_init=1, algorithm=algorithm,
                max_iter=budget.max_iter, random_state=problem.seed,
            )

        return (yield from recorded_kmeans_fit(make, problem.train, algorithm, budget))

    return run


def faiss_full() -> Runner:
    """faiss k-means without subsampling, one timed ``train(niter=1)`` per iteration."""

    def run(problem: Problem, budget: Budget) -> Iterator[Snapshot]:
        import faiss

        X = problem.train
        n, d = X.shape
        C = problem.init
        first = True

        def step() -> bool:
            nonlocal C, first
            km = faiss.Kmeans(
                d, problem.k, niter=1, max_points_per_centroid=max(n, 1), seed=problem.seed,
                verbose=False, check_input_data_for_NaNs=first,
            )
            km.train(X, init_centroids=C)
            first = False
            converged = np.array_equal(km.centroids, C)
            C = km.centroids
            return converged

        return (yield from stepwise(step, lambda: C, budget))

    return run


def faiss_subsampled(niter: int = FAISS_DEFAULT_NITER) -> Runner:
    """faiss k-means with its default subsampling, run ``i = 1..niter`` iterations afresh."""

    def run(problem: Problem, budget: Budget) -> Iterator[Snapshot]:
        import faiss

        X = problem.train
        d = X.shape[1]
        runs: list[tuple[float, np.ndarray]] = []
        stop = "finished" if niter <= budget.max_iter else "max_iter"
        for it in range(1, min(niter, budget.max_iter) + 1):
            t0 = time.perf_counter()
            km = faiss.Kmeans(d, problem.k, niter=it, seed=problem.seed, verbose=False)
            km.train(X, init_centroids=problem.init)
            runs.append((time.perf_counter() - t0, km.centroids))
            if runs[-1][0] >= budget.seconds:
                stop = "budget"
                break
        # Run i is a prefix of run j > i, so it cannot truly take longer: each point gets
        # the least time measured for at least as many iterations (noise goes its way).
        times = np.minimum.accumulate(np.array([t for t, _ in runs])[::-1])[::-1]
        for it, (t, (_, centroids)) in enumerate(zip(times, runs, strict=True), start=1):
            yield Snapshot(float(t), centroids, it, converged=False, evaluate=True)
        return {"stop": stop, "niter": niter, "total_seconds_all_runs": sum(t for t, _ in runs)}

    return run


def make_peer(name: str) -> Runner:
    """The runner of peer ``name`` (one of :data:`PEERS`)."""
    if name.startswith("sklearn.minibatch."):
        return sklearn_minibatch(int(name.rsplit(".", 1)[1]))
    if name in ("sklearn.lloyd", "sklearn.elkan"):
        return sklearn_kmeans(name.split(".", 1)[1])
    if name == "faiss":
        return faiss_full()
    if name == "faiss.subsampled":
        return faiss_subsampled()
    raise ValueError(f"unknown peer {name!r}; choose one of {PEERS}")
