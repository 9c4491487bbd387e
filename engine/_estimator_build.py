"""How a ``NestedMiniBatchKMeans``'s parameters become a model, and what it publishes.

``ModelBuildMixin`` makes the store (its ``metric`` the estimator's), the algorithm and
the retention policy from the parameters, names the parameters a running model keeps
(``_fit_key``), and sets the fitted attributes after a step (``_publish``). It needs from
its class the estimator's parameters and, once started, ``_retention``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nmbatch.engine.algorithms import IterationStats, make_algorithm
from nmbatch.engine.algorithms.swap import swap_wanted
from nmbatch.engine.assign import nearest
from nmbatch.engine.metric import dissimilarity
from nmbatch.engine.retention import RetentionPolicy, make_retention
from nmbatch.engine.store import NestedBatchStore

__all__ = ["ModelBuildMixin", "weighted_sum"]


def weighted_sum(values: np.ndarray, weights: np.ndarray | None) -> float:
    """``sum(w * values)`` (``values`` and ``weights`` ``(n,)``; None: ``sum(values)``)."""
    if weights is None:
        return float(np.sum(values))
    return float(np.dot(weights, np.asarray(values, dtype=np.float64)))


class ModelBuildMixin:
    """The store, the algorithm and the retention policy of the estimator's parameters;
    the fitted attributes after a step."""

    def _make_store(self, d: int, seed: int, capacity: int) -> NestedBatchStore:
        """An empty store of ``d`` features for the estimator's ``metric``."""
        return NestedBatchStore(d, seed=seed, capacity=capacity, metric=self.metric)

    def _make_algorithm(self, store: NestedBatchStore, init: str | np.ndarray, seed: int) -> Any:
        return make_algorithm(
            self.algorithm,
            store,
            int(self.n_clusters),
            init=init,
            rho=float(self.rho),
            batch_size=int(self.batch_size),
            random_state=seed,
            relocate_empty=bool(self.relocate_empty),
            bounds=self.bounds,
            swap=swap_wanted(self.swap_clusters, self.retention,
                             n_clusters=int(self.n_clusters), batch_size=int(self.batch_size)),
            metric=self.metric,
        )

    def _make_retention(self, seed: int) -> RetentionPolicy:
        return make_retention(
            self.retention,
            n_clusters=int(self.n_clusters),
            max_samples=self.max_samples,
            max_age_seconds=self.max_age_seconds,
            seed=seed,
        )

    def _fit_key(self) -> tuple[Any, ...]:
        """Parameters a running model was built with; ``partial_fit`` may not change them."""
        return (
            self.n_clusters,
            self.algorithm,
            self.rho,
            self.batch_size,
            self.retention,
            self.max_samples,
            self.max_age_seconds,
            self.relocate_empty,
            self.swap_clusters,
            self.bounds,
            self.metric,
        )

    def _publish(
        self,
        algo: Any,
        stats: IterationStats,
        store: NestedBatchStore,
        X: np.ndarray,
        weights: np.ndarray | None = None,
    ) -> None:
        """Set the fitted attributes after the step ``stats``; labels and inertia are of
        ``X`` (``(n, d)`` float32, as the store keeps rows: unit under cosine), the
        inertia weighted by ``weights`` (``(n,)`` float64 or None: 1), as scikit-learn's."""
        centers = np.array(algo.centroids, dtype=np.float32, copy=True)
        labels, sqdist = nearest(X, centers, projection=algo.subspace.projection)
        self.cluster_centers_ = centers
        self.labels_ = labels
        self.inertia_ = weighted_sum(dissimilarity(sqdist, self.metric), weights)
        self.n_iter_ = int(algo.iteration)
        self.batch_size_ = int(stats.batch_size)
        self._count_samples(store)

    def _count_samples(self, store: NestedBatchStore) -> None:
        self.n_samples_seen_ = int(self._retention.n_offered)
        self.n_samples_retained_ = int(store.n_samples)
