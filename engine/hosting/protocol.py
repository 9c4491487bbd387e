"""The one interface every host of a model gives its driver, and what builds a model.

A *host* holds a store and an algorithm on it, somewhere: in the calling thread
(:class:`~nmbatch.engine.hosting.local.LocalEngine`), in a child process
(:class:`~nmbatch.engine.hosting.child.EngineProcess`) or on a Ray cluster
(:class:`~nmbatch.engine.hosting.ray.RayEngine`). The driver of the streaming loop
(:mod:`nmbatch.engine.hosting.driver`) and the service's worker see only
:class:`EngineHost`: ``store`` (``dim``, ``n_samples``, ``append``), ``state`` (the
model after the last ``step()`` or ``restore()``, a :class:`~nmbatch.engine.state.
ModelState`), ``ready()``, ``feed()`` (a retention policy's admission carried out:
retirements, then appends under stream ids), ``rows_of()``, ``weights_of()``,
``forget()`` (exact deletion by stream id), ``lookup()``, ``step()``, ``restore()`` and
``close()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from nmbatch.engine.rows import SourceRows
from nmbatch.engine.state import ModelState, SampleLookup

__all__ = ["NO_IDS", "EngineConfig", "EngineHost", "StoreView"]

NO_IDS = np.empty(0, dtype=np.int64)
"""No stream ids: ``(0,)`` int64 (read-only by convention; never written to)."""


@dataclass(frozen=True)
class EngineConfig:
    """What builds a hosted model: ``NestedBatchStore(dim, seed)`` and nmbatch on it.

    ``threads`` bounds BLAS and numba in the engine's process; ``nice`` is the
    niceness of a child process (0: unchanged; unused in the thread); ``idle`` puts
    the child in Linux's ``SCHED_IDLE`` class (see :func:`~nmbatch.engine.hosting.child.
    lower_priority`); ``swap`` turns on nmbatch's cluster swaps
    (``nmbatch.engine.algorithms.swap``), which the service asks for with the
    retentions that follow a moving stream; ``metric``: ``"euclidean"`` or ``"cosine"``
    (spherical k-means: unit rows and centroids, :mod:`nmbatch.engine.metric`);
    ``init``: a seeding method or the ``(k, dim)`` float32 starting centroids.
    """

    dim: int
    k: int
    init: str | np.ndarray
    rho: float
    batch_size: int
    seed: int | None
    threads: int = 1
    nice: int = 0
    idle: bool = False
    swap: bool = False
    metric: str = "euclidean"


class StoreView(Protocol):
    """The store as a driver sees it: its dimension, its size, appending rows."""

    dim: int

    @property
    def n_samples(self) -> int: ...

    def append(self, X: np.ndarray) -> int: ...


class EngineHost(Protocol):
    """A store and nmbatch on it, driven from one thread.

    ``state`` is the model after the last ``step()`` or ``restore()`` (before the first
    one: zero centroids, ``batch_size`` and ``iteration`` 0, not initialised).
    """

    store: StoreView
    state: ModelState

    def ready(self) -> bool:
        """True once ``step()`` can run (``k`` samples appended, or initialised)."""
        ...

    def feed(
        self,
        X: np.ndarray | SourceRows,
        ids: np.ndarray,
        *,
        n_after: int,
        retire_ids: np.ndarray = NO_IDS,
        retire_before: int = 0,
        any_order: bool = False,
        weights: np.ndarray | None = None,
    ) -> None:
        """Take out the stored samples with ids in ``retire_ids`` or below
        ``retire_before`` (their votes removed exactly), then append the rows of ``X``
        (``(m, d)`` float32; a host fed by reference also takes the
        :class:`~nmbatch.engine.rows.SourceRows` naming them) under the stream ids
        ``ids`` (``(m,)`` int64, increasing unless ``any_order``); ``n_after`` is ``N``
        afterwards (the policy's count). ``weights``: ``(m,)`` float64 sample weights
        of the rows (None: 1): every host takes them, a sample's vote is its weight."""
        ...

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored rows with stream ids ``ids``, in that order, ``(m, d)`` float32."""
        ...

    def forget(self, ids: np.ndarray) -> np.ndarray:
        """Delete the stored samples with stream ids ``ids`` (``(m,)`` int64, each >= 0)
        exactly (``KMeansAlgorithm.forget``: their votes out of ``S`` and ``v``, the rows
        out of the store, the changed clusters' centroids recomputed at once); ids not
        stored are skipped. ``state`` becomes the model after the deletion (``stats``
        None) and ``store.n_samples`` drops by the number deleted; the caller tells its
        retention policy (``RetentionPolicy.forget``). Returns ``(m,)`` bool: which ids
        were deleted."""
        ...

    def lookup(self, ids: np.ndarray) -> SampleLookup:
        """Which of the stream ids ``ids`` (``(m,)`` int64) are stored, their nearest
        centroid now and its squared distance (``KMeansAlgorithm.lookup``)."""
        ...

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """The weights of the stored rows with stream ids ``ids``, in that order, ``(m,)``
        float64 (ones for rows fed without weights)."""
        ...

    def step(self) -> ModelState:
        """Run one iteration; the new state, with ``stats`` of the iteration."""
        ...

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> ModelState:
        """Start again from ``centroids`` (``(k, d)`` float32) over the first ``batch_size``
        samples, counting iterations from ``iteration``; the new state (``stats`` None)."""
        ...

    def close(self) -> None:
        """Release the engine (end its process or its actors, if any)."""
        ...
