"""The worker's answers about single samples: where one stands, and exact deletion.

The engine is the worker thread's alone (a child process or Ray actors behind one
pipe), so the HTTP side does not call it: it hands a request to :class:`SampleDesk`
(:meth:`~SampleDesk.lookup`, :meth:`~SampleDesk.forget`), which queues it, wakes the
worker and returns a :class:`concurrent.futures.Future`; the worker thread serves the
queue after each pull of the log, between iterations (:meth:`~SampleDesk.serve_samples`),
so a sample appended before the request is in the engine when it is answered.

A deletion is persisted first: the tombstones are written, with the client ids freed,
in one script (:class:`~nmbatch.service.storage.deletions.Tombstones`); only then is it
carried out on the engine (``EngineHost.forget`` and the policy's ``forget``) and the
model after it published. A crash in between leaves the tombstones, which the next
replay carries out. A sample whose entry a reservoir's base covers and that is not in
the engine is not found: nothing can bring it back, so no tombstone is written.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from nmbatch.engine.hosting import EngineHost
from nmbatch.engine.state import ModelState, SampleLookup
from nmbatch.service.storage.deletions import SampleRef, Tombstones
from nmbatch.service.worker.backoff import RedisBackoff
from nmbatch.service.worker.retention import LogRetention

__all__ = ["SampleDesk", "WorkerGoneError"]

log = logging.getLogger(__name__)


class WorkerGoneError(RuntimeError):
    """The worker stopped serving sample requests (it stopped, or stands by) before it
    answered this one."""


class SampleDesk:
    """Sample requests queued for the worker thread (a part of
    :class:`~nmbatch.service.worker.loop.Worker`, which sets these attributes)."""

    engine: EngineHost | None
    retention: LogRetention | None
    tombstones: Tombstones
    backoff: RedisBackoff
    _sample_requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]

    def notify(self) -> None:  # the Worker's
        raise NotImplementedError

    def _publish(self, state: ModelState) -> None:  # the Worker's
        raise NotImplementedError

    # -- any thread ---------------------------------------------------------------------
    def lookup(self, refs: list[SampleRef]) -> Future[tuple[np.ndarray, SampleLookup]]:
        """Where the samples of ``refs`` stand, answered by the worker thread:
        ``(known, lookup)``, ``known`` ``(m,)`` bool (the worker holds a stream id for the
        sample's entry and row) and the engine's :class:`SampleLookup` of the known ones,
        in order."""
        return self._submit(lambda: self._lookup(refs))

    def forget(self, refs: list[SampleRef]) -> Future[np.ndarray]:
        """Delete the samples of ``refs`` exactly (see the module); answered with ``(m,)``
        bool, True where this request deleted the sample (False: unknown to the worker,
        or already deleted)."""
        return self._submit(lambda: self._forget(refs))

    def _submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._sample_requests.put((fn, future))
        self.notify()
        return future

    # -- the worker thread --------------------------------------------------------------
    def serve_samples(self) -> None:
        """Answer every queued request (the worker thread, its engine ready)."""
        while True:
            try:
                fn, future = self._sample_requests.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue  # the caller gave up
            try:
                future.set_result(fn())
            except BaseException as exc:  # the caller's error to answer; the worker goes on
                future.set_exception(exc)

    def refuse_samples(self) -> None:
        """Fail every queued request (the worker stops serving them)."""
        while True:
            try:
                _, future = self._sample_requests.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(WorkerGoneError("the model's worker stopped or stands by"))

    def _lookup(self, refs: list[SampleRef]) -> tuple[np.ndarray, SampleLookup]:
        engine, retention = self.engine, self.retention
        assert engine is not None and retention is not None
        ids = retention.stream_ids(refs)
        known = ids >= 0
        return known, engine.lookup(ids[known])

    def _forget(self, refs: list[SampleRef]) -> np.ndarray:
        engine, retention = self.engine, self.retention
        assert engine is not None and retention is not None
        ids = retention.stream_ids(refs)
        # A row of an entry the base covers, not in the engine: in no base and no log
        # entry (deleted before, its tombstone pruned; or it left the reservoir).
        covered = np.flatnonzero((ids >= 0) & ~retention.replayable(refs))
        if covered.shape[0]:
            ids[covered[~engine.lookup(ids[covered]).present]] = -1
        known = np.flatnonzero(ids >= 0)
        deleted = np.zeros(len(refs), dtype=bool)
        if not known.shape[0]:
            return deleted
        chosen = [refs[i] for i in known]
        fresh = self.backoff.call(self.tombstones.write, chosen, ids[known])  # persisted first
        deleted[known[fresh]] = True
        found = retention.forget(engine, ids[known[fresh]])
        if found.any():
            self._publish(engine.state)  # the model without them, at once
        log.info("deleted %d samples (%d of them stored in the engine)", int(fresh.sum()),
                 int(found.sum()))  # fmt: skip
        return deleted
