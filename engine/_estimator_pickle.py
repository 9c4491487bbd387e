"""Pickling of a ``NestedMiniBatchKMeans``: the samples kept, the store and algorithm rebuilt.

``PicklingMixin`` needs from its class ``_make_store(d, seed, capacity)`` and
``_make_algorithm(store, init, seed)``, the fitted
attributes (``cluster_centers_``, ``batch_size_``, ``n_iter_``) once fitted, and the
parameters ``init``, ``n_clusters``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nmbatch.engine._estimator_checks import check_init, spawn_seeds

__all__ = ["PicklingMixin"]


class PicklingMixin:
    """``__getstate__``/``__setstate__`` and the rebuild on the next ``partial_fit``."""

    def __getstate__(self) -> dict[str, Any]:
        # The store holds a lock and the algorithm holds the store; keep the samples in
        # insertion order instead and rebuild both on the next partial_fit (the restart
        # path of the engine: same centroids, same b, one exact pass over the prefix).
        state = self.__dict__.copy()
        store = state.pop("_store", None)
        state.pop("_algorithm", None)
        if store is not None:
            samples, ids = store.samples(), store.ids()
            order = np.argsort(ids, kind="stable")
            state["_pickled_samples"], state["_pickled_ids"] = samples[order], ids[order]
            if store.weighted:
                state["_pickled_weights"] = store.weights()[order]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _resume_after_unpickling(self) -> None:
        """Rebuild the store and algorithm dropped by pickling (see ``__getstate__``)."""
        samples = self.__dict__.pop("_pickled_samples")
        ids = self.__dict__.pop("_pickled_ids", None)
        weights = self.__dict__.pop("_pickled_weights", None)
        store_seed, algo_seed = spawn_seeds(np.random.SeedSequence(self._algo_seed), 2)
        # Unit rows under cosine come back as they were (unit_rows keeps a unit row).
        store = self._make_store(samples.shape[1], store_seed, len(samples))
        store.append(samples, ids=ids, weights=weights)
        fitted = hasattr(self, "cluster_centers_")
        init = (
            self.cluster_centers_
            if fitted
            else check_init(self.init, self.n_clusters, samples.shape[1])
        )
        algo = self._make_algorithm(store, init, algo_seed)
        if fitted and hasattr(algo, "restore"):
            algo.restore(self.cluster_centers_, self.batch_size_, self.n_iter_)
        elif fitted:
            # No restore for this algorithm: it restarts from the centroids; keep the count.
            algo.iteration = int(self.n_iter_)
        self._store, self._algorithm, self._algo_seed = store, algo, algo_seed

