"""The worker's publication side: each model shown, ``/stats``, and the snapshots kept.

A part of :class:`~nmbatch.service.worker.loop.Worker`: the engine's states go to its
:class:`~nmbatch.service.worker.publisher.Publisher` (numbered and put on the board, the
iteration counted, the statistics shown), and every ``snapshot_seconds`` (and on stop)
the newest model shown is written to Redis as the snapshot, at the log position read so
far, under the lease. A standby shows the snapshots in Redis instead
(:meth:`~Publication._follow`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from nmbatch.engine.hosting import EngineHost
from nmbatch.engine.state import ModelState
from nmbatch.service.config import Settings
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.state import ModelBoard
from nmbatch.service.storage import LeaseLostError, ModelRepository, Snapshot
from nmbatch.service.storage.capacity import versions_bound
from nmbatch.service.storage.retained import RetainedLog
from nmbatch.service.tracing import span
from nmbatch.service.worker.backoff import RedisAwayError, RedisBackoff
from nmbatch.service.worker.lease import LeaseKeeper
from nmbatch.service.worker.publisher import Publisher
from nmbatch.service.worker.roles import Phase, Role
from nmbatch.service.worker.signals import Signals

__all__ = ["Publication"]

log = logging.getLogger(__name__)


class Publication:
    """Models, statistics and snapshots published by the worker thread (a part of
    :class:`~nmbatch.service.worker.loop.Worker`, which sets these attributes)."""

    settings: Settings
    repository: ModelRepository
    board: ModelBoard
    metrics: ServiceMetrics
    lease: LeaseKeeper
    backoff: RedisBackoff
    publisher: Publisher
    signals: Signals
    retained_log: RetainedLog
    engine: EngineHost | None
    role: Role
    phase: Phase
    last_id: str
    n_ingested: int
    _snapshot_version: int
    _last_snapshot: float

    # -- models and statistics ------------------------------------------------------------
    def _count_and_publish(self, state: ModelState) -> None:
        assert state.stats is not None
        self.publisher.count(state.stats)
        self._publish(state)
        model = self.board.model
        if model is not None and model.state is not None and model.state.stats is state.stats:
            self.signals.stepped(model)  # it was published

    def _publish(self, state: ModelState) -> None:
        state = dataclasses.replace(state, n_ingested=max(self.n_ingested, state.n_ingested))
        if self.publisher.publish(state):
            self._publish_stats()

    def _publish_stats(self) -> None:
        engine = self.engine
        if self.role == Role.STANDBY or engine is None:
            self.publisher.show_stats(self.phase)  # a standby shows the snapshot it serves
        else:
            self.publisher.show_stats(
                self.phase, engine.state, engine.store.n_samples, drift=self.signals.drift
            )

    # -- snapshots ------------------------------------------------------------------------
    def _snapshot(self, *, measure: bool = False) -> None:
        """:meth:`_write_snapshot` (and, with ``measure``, the log's bytes in the
        metrics); Redis away: the next cadence tries again."""
        try:
            with span("nmbatch.worker.snapshot", self.settings.model):
                self._write_snapshot()
            self.signals.flush()
            if measure:
                log_bytes = self.backoff.call(self.retained_log.log_bytes)
                self.metrics.log_bytes.set(log_bytes if log_bytes is not None else -1)
        except RedisAwayError:
            pass
        except LeaseLostError:
            self.lease.check()

    def _follow(self) -> None:
        """Publish the snapshot in Redis if newer than the served model (standby)."""
        version = self.backoff.call(self.repository.snapshot_version)
        model = self.board.model
        if version is None or (model is not None and version <= model.version):
            return
        snapshot = self.backoff.call(self.repository.read_snapshot)
        if snapshot is not None and self.publisher.show(snapshot.model):
            self._publish_stats()

    def _write_snapshot(self) -> None:
        """Store the published model in Redis if it is newer than the last snapshot.

        Raises :class:`RedisAwayError` (try at the next cadence) and :class:`LeaseLostError`.
        """
        self._last_snapshot = time.monotonic()
        model = self.board.model
        if model is None or model.version <= self._snapshot_version:
            return
        snapshot = Snapshot(model, self.last_id)  # at the log position read so far
        s = self.settings  # the version is kept with it, within the model's bound
        keep = versions_bound(s.keep_versions, s.keep_versions_bytes, s.k, model.state.dim)
        write = self.repository.write_snapshot
        written = self.backoff.call(write, snapshot, self.lease.token, keep)
        self._snapshot_version = model.version
        if written:
            self.metrics.snapshot_written()
            if model is self.board.model:  # nothing shown since: the lineage restarts here
                self.publisher.snapshotted(model)
            self.signals.kept(model)
        else:
            log.warning("Redis holds a snapshot newer than version %d: not replaced", model.version)
