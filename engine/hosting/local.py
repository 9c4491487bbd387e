"""The model hosted in the calling thread: the engine's own store and algorithm."""

from __future__ import annotations

import dataclasses

import numpy as np

from nmbatch.engine.algorithms import KMeansAlgorithm, make_algorithm
from nmbatch.engine.state import ModelState, SampleLookup
from nmbatch.engine.store import NestedBatchStore

from .driver import carry_out
from .protocol import NO_IDS, EngineConfig

__all__ = ["LocalEngine", "build"]


def build(config: EngineConfig) -> tuple[NestedBatchStore, KMeansAlgorithm]:
    """``NestedBatchStore(dim, seed, metric)`` and nmbatch on it, as ``config`` says."""
    store = NestedBatchStore(config.dim, seed=config.seed, metric=config.metric)
    algo = make_algorithm(
        "nmbatch",
        store,
        config.k,
        init=config.init,
        rho=config.rho,
        batch_size=config.batch_size,
        random_state=config.seed,
        swap=config.swap,
        metric=config.metric,
    )
    return store, algo


class LocalEngine:
    """An :class:`~.protocol.EngineHost` over the engine's own objects, used from the
    calling thread: built from an :class:`~.protocol.EngineConfig`, or around a store
    and an algorithm made elsewhere (:meth:`around`: the estimator's)."""

    def __init__(self, config: EngineConfig) -> None:
        self._attach(*build(config))

    @classmethod
    def around(cls, store: NestedBatchStore, algo: KMeansAlgorithm) -> LocalEngine:
        """The host of ``algo`` (any ``KMeansAlgorithm``) on ``store``, its own store."""
        host = cls.__new__(cls)
        host._attach(store, algo)
        return host

    def _attach(self, store: NestedBatchStore, algo: KMeansAlgorithm) -> None:
        self.store, self._algo = store, algo
        self.state = algo.state()

    def ready(self) -> bool:
        return self._algo.ready()

    def feed(
        self,
        X: np.ndarray,
        ids: np.ndarray,
        *,
        n_after: int,
        retire_ids: np.ndarray = NO_IDS,
        retire_before: int = 0,
        any_order: bool = False,
        weights: np.ndarray | None = None,
    ) -> None:
        carry_out(self._algo, X, ids, retire_ids, retire_before, any_order=any_order,
                  weights=weights)
        if self.store.n_samples != n_after:
            raise RuntimeError(f"the store holds {self.store.n_samples} rows, not {n_after}")
        self.state = dataclasses.replace(self.state, converged=False)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        return self.store.rows_of(ids)

    def forget(self, ids: np.ndarray) -> np.ndarray:
        found = self._algo.forget(ids)
        if found.any():
            self.state = self._algo.state()
        return found

    def lookup(self, ids: np.ndarray) -> SampleLookup:
        return self._algo.lookup(ids)

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        return self.store.weights_of(ids)

    def step(self) -> ModelState:
        self.state = self._algo.state(self._algo.step())
        return self.state

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> ModelState:
        self._algo.restore(centroids, batch_size, iteration)
        self.state = self._algo.state()
        return self.state

    def close(self) -> None:
        """Nothing to release."""
