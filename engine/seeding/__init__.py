"""Initial centroids from the first batch: the ``init`` methods of the engine.

``initial_centroids(init, X, k, rng)`` returns the starting centroids ``(k, d)`` float32
(copies of rows of the first batch ``X``, or ``init`` itself when it is an array). The
methods (:data:`SEEDINGS`; their costs and when to pick which: docs/library.md, measured
in docs/benchmarks/seeding.md):

- ``"auto"`` (the estimator's default): ``"k-means++.sub"`` while its work
  ``4 k^2 (2 + ln k) d`` is at most :data:`AUTO_WORK`, else ``"random"``
  (:func:`auto_method`);
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
    "AUTO_WORK",
    "DEFAULT_SEEDING",
    "SEEDINGS",
    "SUBSAMPLE_PER_CLUSTER",
    "afkmc2",
    "auto_method",
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
SEEDINGS = ("auto", *_METHODS)
DEFAULT_SEEDING = "auto"  # the estimator's default (docs/benchmarks/seeding.md)

# Float32 distance terms (rows x centroids x trials x d) "auto" lets k-means++ on 4 k rows
# spend: some 20 s of one core. Measured (docs/benchmarks/seeding.md): from random rows
# the fit on image patches never reached 2% of the best energy (k = 256, 1,024) or 5%
# (k = 4,096: work 7.2e10, where k-means++.sub reached 1% at 74 s); on MNIST it was the
# fastest (k = 1,024: work 2.6e10, 1.8x faster than k-means++.sub; k = 4,096: work
# 5.3e11, k-means++.sub seeded for 326 s). Robustness first: random only above this.
AUTO_WORK = 1e11


def auto_method(k: int, d: int) -> str:
    """The seeding ``"auto"`` runs for ``k`` centroids of dimension ``d``."""
    work = SUBSAMPLE_PER_CLUSTER * float(k) * float(k) * n_trials(max(k, 1)) * float(d)
    return "k-means++.sub" if work <= AUTO_WORK else "random"


def seed_rows(init: str, X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (k,) int64 of the rows of ``X`` (n, d) float32 that method ``init`` picks."""
    if init == "auto":
        init = auto_method(k, X.shape[1])
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
