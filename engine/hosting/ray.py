"""The model hosted on a Ray cluster: an ``EngineHost`` over a streaming coordinator.

:class:`RayEngine` gives its driver (the service's worker) the interface every host
gives (``store``, ``state``, ``ready``, ``feed`` with sample weights, ``rows_of``,
``weights_of``, ``forget``, ``lookup``, ``step``, ``restore``, ``close``;
:class:`~.protocol.EngineHost`), over a
:class:`~nmbatch.engine.distributed.stream.StreamCoordinator`:

- the calling thread is the Ray *driver*: it holds the coordinator (``C``, ``S``, ``v``,
  ``Q``, ``tau``: O(k d) memory and arithmetic), while the rows, their per-row state and
  the distance computations live in the shard actors on the cluster's nodes;
- each ``feed`` (one log entry the worker read from Redis, as the retention policy
  admits it; :func:`~.driver.retire_then_append`) is the retirements it carries
  (:meth:`~nmbatch.engine.distributed.stream.StreamCoordinator.retire`: each shard
  takes back the votes of its own retired rows; a window or an age limit is one id
  threshold for all shards, global in acceptance order) and one
  :meth:`~nmbatch.engine.distributed.stream.StreamCoordinator.append`: the entry's rows
  go to the next shard in turn (by reference, with a ``source``: the shard reads the
  rows from the log itself);
- ``step`` is one distributed round, ``restore`` rebuilds the votes from the centroids
  of the last snapshot after a replay; the :class:`ModelState` they return is published
  by the worker as a local engine's (same ``/centroids``, ``/assign``, ``/stats``);
- ``metric="cosine"`` runs spherical k-means as the local engine does: rows become unit
  rows as they enter the cluster (fed arrays normalised by
  :meth:`~nmbatch.engine.distributed.stream.StreamCoordinator.append` before they are
  sent, a zero row refused there; rows by reference by the shard that reads them), the
  coordinator keeps unit centroids ``S(j)/||S(j)||``
  (:mod:`nmbatch.engine.distributed.coordinator`).

Ray is joined when the engine is built (``ray.init(address)``, unless the process is
connected already) and left when it is closed, so a worker that rebuilds its engine
after a failure connects again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

import numpy as np

from nmbatch.engine.assign import sample_lookup
from nmbatch.engine.rows import RowSource, SourceRows
from nmbatch.engine.state import ModelState, SampleLookup

from .driver import retire_then_append
from .protocol import NO_IDS, EngineConfig

__all__ = ["RayEngine"]


class _CoordinatorStore:
    """The store as the worker sees it: ``dim``, ``n_samples``, ``append`` (one chunk)."""

    def __init__(self, engine: RayEngine, dim: int) -> None:
        self._engine = engine
        self.dim = dim

    @property
    def n_samples(self) -> int:
        return int(self._engine.coordinator.n_samples)

    def append(self, X: np.ndarray) -> int:
        """Append ``X`` ``(m, d)`` float32 under the next stream ids (above every id
        appended so far; unit rows under ``metric="cosine"``, a zero row refused);
        returns ``N``."""
        n = self._engine.coordinator.next_id
        return self._engine.coordinator.append(X, np.arange(n, n + np.shape(X)[0]))


class RayEngine:
    """The worker's engine on the Ray cluster at ``address``, over ``n_shards`` shards.

    Parameters
    ----------
    config : EngineConfig
        ``dim``, ``k``, ``init``, ``rho``, ``batch_size``, ``seed`` and ``metric`` are
        used.
    address : str
        A Ray address, as ``ray.init`` takes it (the head's ``"host:port"``, ``"auto"``).
    n_shards : int
        ``P >= 1``: shard actors, spread over the nodes.
    source : RowSource or None
        Where the shards read rows fed by reference (:class:`~nmbatch.engine.rows.SourceRows`: the
        service's Redis log); None: only arrays are fed, through the object store.
    """

    def __init__(
        self, config: EngineConfig, address: str, n_shards: int, source: RowSource | None = None
    ) -> None:
        import ray

        from nmbatch.engine.distributed.stream import StreamCoordinator

        self._joined = not ray.is_initialized()
        if self._joined:
            ray.init(address=address, log_to_driver=False)
        try:
            self.coordinator = StreamCoordinator(
                n_shards, config.k, config.dim, seed=config.seed, init=config.init,
                rho=config.rho, batch_size=config.batch_size, source=source,
                metric=config.metric,
            )  # fmt: skip
        except BaseException:
            self._leave()
            raise
        self.store = _CoordinatorStore(self, int(config.dim))
        self.state: ModelState = self.coordinator.state()

    def ready(self) -> bool:
        """True once ``step()`` can run (``k`` samples appended, or initialised)."""
        return self.state.initialized or self.store.n_samples >= self.coordinator.n_clusters

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
        """Take out the stored rows with ids in ``retire_ids`` or below ``retire_before``
        (each shard takes back its own rows' votes, exactly), then append the rows of
        ``X`` ``(m, d)`` float32, or those it names (:class:`~nmbatch.engine.rows.SourceRows`, read
        by the shard), under stream ``ids`` ``(m,)`` int64 (any order) to the next
        shard, each weighing its ``weights`` entry (``(m,)`` float64, None: 1; the shard's
        votes are the weights, as one machine's)."""
        coordinator = self.coordinator
        retire_then_append(coordinator.retire,
                           lambda rows, these: coordinator.append(rows, these, weights),
                           X, ids, np.asarray(retire_ids, np.int64), retire_before)  # fmt: skip
        if self.store.n_samples != n_after:
            raise RuntimeError(f"the store holds {self.store.n_samples} rows, not {n_after}")
        self.state = dataclasses.replace(self.state, converged=False)

    def rebase(self, rows: Sequence[SourceRows], ids: Sequence[np.ndarray]) -> None:
        """The stored rows now live where ``rows`` names them, ``ids[e]`` the stream ids
        of ``rows[e]`` (:meth:`~nmbatch.engine.distributed.stream.StreamCoordinator.rebase`)."""
        self.coordinator.rebase(rows, ids)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored rows with stream ids ``ids`` ``(m,)`` int64, ``(m, d)`` float32."""
        return self.coordinator.rows_of(ids)

    def forget(self, ids: np.ndarray) -> np.ndarray:
        """Delete by stream id on the cluster (``EngineHost.forget``): each shard takes back
        its rows' votes, the chunk records remember them (a replacement shard never
        sees them), the changed centroids move at once
        (:meth:`~nmbatch.engine.distributed.stream.StreamCoordinator.forget`)."""
        query = np.asarray(ids, dtype=np.int64).ravel()
        if query.shape[0] and query.min() < 0:
            raise ValueError(f"stream ids are >= 0, got {query.min()}")
        found = self.coordinator.forget(query)
        if found.any():
            self.state = self.coordinator.state()
        return found

    def lookup(self, ids: np.ndarray) -> SampleLookup:
        """Which of the stream ids are stored, their nearest centroid and squared distance
        (``EngineHost.lookup``; the rows read from the shards)."""
        found, rows = self.coordinator.find(np.asarray(ids, dtype=np.int64))
        centroids = self.coordinator.centroids if self.coordinator.initialized else None
        return sample_lookup(found, rows, centroids)

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """The weights of the stored rows with stream ids ``ids``, ``(m,)`` float64 (from
        the coordinator's chunk records: :meth:`~nmbatch.engine.distributed.stream.
        StreamCoordinator.weights_of`)."""
        return self.coordinator.weights_of(np.asarray(ids, dtype=np.int64))

    def step(self) -> ModelState:
        """One distributed round; the new state, with its ``stats``."""
        self.state = self.coordinator.state(self.coordinator.step())
        return self.state

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> ModelState:
        """Start again from ``centroids`` ``(k, d)`` float32 over the first ``batch_size``
        priorities, counting iterations from ``iteration`` (``stats`` None)."""
        self.coordinator.restore(centroids, batch_size, iteration)
        self.state = self.coordinator.state()
        return self.state

    def close(self) -> None:
        """End the shard actors and leave the cluster if this engine joined it."""
        with contextlib.suppress(Exception):
            self.coordinator.close()
        self._leave()

    def _leave(self) -> None:
        if self._joined:
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
            self._joined = False
