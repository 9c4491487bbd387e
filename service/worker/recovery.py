"""What the worker does when its engine fails: rebuild it from the log.

Two kinds of failure, one remedy. The engine's process died
(:class:`~nmbatch.engine.hosting.EngineProcessError`: killed, out of memory): wait
a second and rebuild. Any other unexpected error of the worker: not ready while it waits
(1 s, doubling with each failure less than 10 minutes after the previous one, at most
60 s), then rebuild. Rebuilding is what a restart of the service does: the next
``_prepare`` replays the retained log into a new engine and restores the centroids
published last (versions go on increasing). The log holds every acknowledged sample, so
nothing is lost, and a persistent fault retries slowly instead of in a tight loop.
"""

from __future__ import annotations

import logging
import threading
import time

from nmbatch.engine.hosting import EngineHost, EngineProcessError
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.state import ModelBoard
from nmbatch.service.storage import Snapshot
from nmbatch.service.worker.roles import Phase

__all__ = ["FAILURE_MEMORY_SECONDS", "MAX_RETRY_SECONDS", "EngineRecovery"]

log = logging.getLogger(__name__)

FAILURE_MEMORY_SECONDS = 600.0
"""A failure this long after the previous one starts the waits from 1 s again."""

MAX_RETRY_SECONDS = 60.0
"""Longest wait before rebuilding after an unexpected error."""


class EngineRecovery:
    """The worker's engine lifecycle after faults (a part of
    :class:`~nmbatch.service.worker.loop.Worker`, which sets these attributes)."""

    engine: EngineHost | None
    board: ModelBoard
    snapshot: Snapshot | None
    last_id: str
    metrics: ServiceMetrics
    phase: Phase
    error: BaseException | None
    _stopping: threading.Event
    _failures: int
    _failed_at: float

    def _publish_stats(self) -> None:
        raise NotImplementedError

    def _restart_engine(self, exc: EngineProcessError) -> None:
        """The engine's process died: rebuild it from the log and the served centroids.

        The next :meth:`_prepare` replays the whole log into a new process and restores
        the centroids published last (versions go on increasing). Waits a second first,
        so a process that cannot start is not restarted in a tight loop.
        """
        log.error("%s: restarting the engine (log replay, restore from version %s)", exc,
                  self.board.model.version if self.board.model else None)  # fmt: skip
        self.metrics.engine_restarts.inc()
        self._drop_engine()
        self._stopping.wait(1.0)

    def _recover(self, exc: Exception) -> None:
        """An unexpected error: not ready (``/readyz`` names it) while waiting, then
        rebuild (see the module)."""
        self.error = exc
        self.phase = Phase.FAILED
        log.error("worker failed, rebuilding its engine: %r", exc, exc_info=exc)
        self.metrics.worker_failures.inc()
        now = time.monotonic()
        if now - self._failed_at > FAILURE_MEMORY_SECONDS:
            self._failures = 0
        self._failed_at, self._failures = now, self._failures + 1
        self._publish_stats()
        self._drop_engine()
        self._stopping.wait(min(MAX_RETRY_SECONDS, 2.0 ** (self._failures - 1)))

    def _drop_engine(self) -> None:
        """Close the engine; the next :meth:`_prepare` replays the log into a new one and
        restores the centroids published last (versions go on increasing)."""
        self._close_engine()
        model = self.board.model
        if model is not None and model.state.n_samples > 0:
            self.snapshot = Snapshot(model, self.last_id)

    def _close_engine(self) -> None:
        """Drop the engine (and end its process, if any)."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
