"""Initial centroids from the first batch: the ``init`` methods of the engine.

``initial_centroids(init, X, k, rng)`` returns the starting centroids ``(k, d)`` float32
(copies of rows of the first batch ``X``, or ``init`` itself when it is an array). The
methods (:data:`SEEDINGS`; their costs and when to pick which: docs/library.md, measured
in docs/benchmarks/seeding.md):

- ``"auto"`` (the estimator's default): greedy k-means++ on ``max(5000, 16 k)`` rows of
  the first batch while that is cheap, else k-means++ with one trial per centroid on
  ``4 k`` rows of it (:func:`auto_plan`);
- ``"first"``: the first ``k`` rows (the store is shuffled: ``k`` uniform rows);
- ``"random"``: ``k`` distinct rows drawn uniformly with ``rng``;
- ``"k-means++"``: greedy k-means++ on the whole first batch (:mod:`.greedy`);
- ``"k-means++.sub"``: greedy k-means++ on ``4 k`` uniform rows of it;
- ``"k-means||"``: k-means‖ (:mod:`.scalable`);
- ``"afk-mc2"``: AFK-MC² (:mod:`.scalable`).

Every method draws only from ``rng`` and gives the same rows with any thread count.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nmbatch.engine.seeding.greedy import (
    SUBSAMPLE_PER_CLUSTER,
    kmeans_plusplus,
    kmeans_plusplus_subsample,
    n_trials,
)
from nmbatch.engine.seeding.rejection import kmeans_plusplus_rejection
from nmbatch.engine.seeding.scalable import afkmc2, kmeans_parallel, random_rows

__all__ = [
    "AUTO_GREEDY_ROWS",
    "AUTO_GREEDY_ROWS_PER_CLUSTER",
    "AUTO_GREEDY_WORK",
    "AUTO_ROWS_PER_CLUSTER",
    "DEFAULT_SEEDING",
    "SEEDINGS",
    "SUBSAMPLE_PER_CLUSTER",
    "afkmc2",
    "auto_plan",
    "initial_centroids",
    "kmeans_parallel",
    "kmeans_plusplus",
    "kmeans_plusplus_auto",
    "kmeans_plusplus_rejection",
    "kmeans_plusplus_subsample",
    "n_trials",
    "random_rows",
    "seed_rows",
]


# "auto" (measured: docs/benchmarks/seeding.md, one idle core, seeding inside the clock).
# Greedy k-means++ on m = min(b_0, max(AUTO_GREEDY_ROWS, AUTO_GREEDY_ROWS_PER_CLUSTER k))
# rows of the first batch while its work m k (2 + ln k) d is at most AUTO_GREEDY_WORK
# float32 multiply-adds (some 0.3 s of one core): image patches need its draws (k = 50:
# 1% of the best energy in 0.15 s, where k-means++ on 4 k rows and random rows never
# reach it; k = 256, on 16 k rows: 0.5% in 0.84-0.97 s, never from 4 k rows). Above that
# work, k-means++ with one trial per centroid on AUTO_ROWS_PER_CLUSTER k rows: cheap and
# as good at large k (1% on MNIST k = 1,024 in 3.2 s, greedy on 4 k rows 5.7 s, on 16 k
# rows 7.5 s; patches k = 4,096: 7.1 s against 15.7 s greedy on 4 k rows).
AUTO_GREEDY_ROWS = 5000
AUTO_GREEDY_ROWS_PER_CLUSTER = 16
AUTO_GREEDY_WORK = 6e9
AUTO_ROWS_PER_CLUSTER = 4


def auto_plan(n: int, k: int, d: int) -> tuple[int, int | None]:
    """What ``"auto"`` runs on a first batch of ``n`` rows of dimension ``d`` for ``k``
    centroids: ``(rows, trials)`` of k-means++ on uniform rows of it (``trials`` None:
    greedy's ``2 + floor(ln k)``; 1: plain k-means++)."""
    m = min(n, max(AUTO_GREEDY_ROWS, AUTO_GREEDY_ROWS_PER_CLUSTER * k))
    if float(m) * k * n_trials(max(k, 1)) * d <= AUTO_GREEDY_WORK:
        return m, None
    return min(n, AUTO_ROWS_PER_CLUSTER * k), 1


def kmeans_plusplus_auto(
    X: np.ndarray, k: int, rng: np.random.Generator, *, weights: np.ndarray | None = None
) -> np.ndarray:
    """Indices ``(k,)`` int64 of the rows of ``X`` ``(n, d)`` float32 that ``"auto"``
    picks (:func:`auto_plan`); ``weights`` (n,) float64 or None, as k-means++ takes them."""
    n, d = X.shape
    m, trials = auto_plan(n, k, d)
    rows = np.arange(n) if m >= n else np.sort(rng.choice(n, size=m, replace=False))
    Xm = X if m >= n else X[rows]
    w = weights if weights is None or m >= n else weights[rows]
    if trials == 1:  # one trial: the same law by rejection, a BLAS product per batch
        return rows[kmeans_plusplus_rejection(Xm, k, rng, weights=w)]
    return rows[kmeans_plusplus(Xm, k, rng, trials=trials, weights=w)]


def _random_weighted(
    X: np.ndarray, k: int, rng: np.random.Generator, *, weights: np.ndarray
) -> np.ndarray:
    """``k`` distinct rows drawn with probability proportional to their weight (uniform
    rows when fewer than ``k`` weights are positive)."""
    n = X.shape[0]
    if np.count_nonzero(weights) < k:
        return random_rows(X, k, rng)
    return np.sort(rng.choice(n, size=k, replace=False, p=weights / weights.sum())).astype(
        np.int64
    )


def _first(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(k, dtype=np.int64)


_METHODS: dict[str, Callable[[np.ndarray, int, np.random.Generator], np.ndarray]] = {
    "auto": kmeans_plusplus_auto,
    "k-means++": kmeans_plusplus,
    "k-means++.sub": kmeans_plusplus_subsample,
    "k-means||": kmeans_parallel,
    "afk-mc2": afkmc2,
    "random": random_rows,
    "first": _first,
}
# With sample weights: the methods that draw rows by weight (a weight of w as w copies,
# in distribution); the others ("first", "k-means||", "afk-mc2") ignore the weights.
_WEIGHTED: dict[str, Callable[..., np.ndarray]] = {
    "auto": kmeans_plusplus_auto,
    "k-means++": kmeans_plusplus,
    "k-means++.sub": kmeans_plusplus_subsample,
    "random": _random_weighted,
}
SEEDINGS = tuple(_METHODS)
DEFAULT_SEEDING = "auto"  # the estimator's default (docs/benchmarks/seeding.md)

def seed_rows(
    init: str, X: np.ndarray, k: int, rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Indices (k,) int64 of the rows of ``X`` (n, d) float32 that method ``init`` picks.

    ``weights`` (n,) float64 or None: the rows' sample weights; "auto", "k-means++",
    "k-means++.sub" and "random" draw by them (a weight of w as w copies, in
    distribution), the other methods ignore them. None: unweighted (the draws of before).
    """
    if init not in _METHODS:
        raise ValueError(f"init must be one of {SEEDINGS} or an array, got {init!r}")
    if X.shape[0] < k:
        raise ValueError(f"{init} seeding needs at least k={k} samples, got {X.shape[0]}")
    X = np.ascontiguousarray(X, dtype=np.float32)
    if weights is not None and init in _WEIGHTED:
        return _WEIGHTED[init](X, k, rng, weights=weights)
    return _METHODS[init](X, k, rng)


def initial_centroids(
    init: str | np.ndarray, X: np.ndarray, k: int, rng: np.random.Generator,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """The starting centroids ``(k, d)`` float32 (C-contiguous, a new array) from the
    first batch ``X`` ``(b, d)`` float32: ``init`` itself if an array, else the rows
    :func:`seed_rows` picks with ``rng`` (and ``weights``, (b,) float64 or None)."""
    if isinstance(init, np.ndarray):
        return np.array(init, dtype=np.float32, order="C")
    return np.array(X[seed_rows(init, X, k, rng, weights)], dtype=np.float32, order="C")
