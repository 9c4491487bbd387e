"""Initial centroids from the first batch: the ``init`` methods of the engine.

``initial_centroids(init, X, k, rng)`` returns the starting centroids ``(k, d)`` float32
(copies of rows of the first batch ``X``, or ``init`` itself when it is an array). The
methods (:data:`SEEDINGS`; their costs and when to pick which: docs/library.md, measured
in docs/benchmarks/seeding.md):

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
from nmbatch.engine.seeding.scalable import afkmc2, kmeans_parallel, random_rows

__all__ = [
    "DEFAULT_SEEDING",
    "SEEDINGS",
    "SUBSAMPLE_PER_CLUSTER",
    "afkmc2",
    "initial_centroids",
    "kmeans_parallel",
    "kmeans_plusplus",
    "kmeans_plusplus_subsample",
    "n_trials",
    "random_rows",
    "seed_rows",
]


def _first(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(k, dtype=np.int64)


_METHODS: dict[str, Callable[[np.ndarray, int, np.random.Generator], np.ndarray]] = {
    "k-means++": kmeans_plusplus,
    "k-means++.sub": kmeans_plusplus_subsample,
    "k-means||": kmeans_parallel,
    "afk-mc2": afkmc2,
    "random": random_rows,
    "first": _first,
}
SEEDINGS = tuple(_METHODS)
DEFAULT_SEEDING = "k-means++.sub"  # the estimator's default (docs/benchmarks/seeding.md)


def seed_rows(init: str, X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (k,) int64 of the rows of ``X`` (n, d) float32 that method ``init`` picks."""
    if init not in _METHODS:
        raise ValueError(f"init must be one of {SEEDINGS} or an array, got {init!r}")
    if X.shape[0] < k:
        raise ValueError(f"{init} seeding needs at least k={k} samples, got {X.shape[0]}")
    return _METHODS[init](np.ascontiguousarray(X, dtype=np.float32), k, rng)


def initial_centroids(
    init: str | np.ndarray, X: np.ndarray, k: int, rng: np.random.Generator
) -> np.ndarray:
    """The starting centroids ``(k, d)`` float32 (C-contiguous, a new array) from the
    first batch ``X`` ``(b, d)`` float32: ``init`` itself if an array, else the rows
    :func:`seed_rows` picks with ``rng``."""
    if isinstance(init, np.ndarray):
        return np.array(init, dtype=np.float32, order="C")
    return np.array(X[seed_rows(init, X, k, rng)], dtype=np.float32, order="C")
