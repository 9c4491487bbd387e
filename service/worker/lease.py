"""The worker's hold on the model: its lease in Redis and the centroid versions reserved under it.

:class:`LeaseKeeper` takes the lease (:class:`WorkerLease`: free, expired, ours already,
or left by a holder whose connection is gone), renews it every third of its expiry from
a companion thread while the worker thread lives (a long iteration on a big store must
not let it expire), notices when another process holds it, and gives it back on stop.
It also reserves centroid versions in blocks (``versions_reserved`` in the meta hash,
written only while the lease is held), so a worker that starts after a crash numbers
its centroids above anything the dead one may have shown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from nmbatch.service.logs import bind_model
from nmbatch.service.storage import ModelRepository, WorkerLease, redis_unavailable
from nmbatch.service.worker.backoff import RedisAwayError, RedisBackoff

__all__ = ["VERSION_BLOCK", "LeaseKeeper"]

log = logging.getLogger(__name__)

VERSION_BLOCK = 1000
"""Centroid versions reserved in Redis at a time (a crash may skip up to this many)."""


class LeaseKeeper:
    """Takes, renews and releases the worker lease; reserves versions under it.

    Parameters
    ----------
    lease : WorkerLease
        The model's worker lease (its own single-connection client, used by the
        renewing thread and the worker thread).
    repository : ModelRepository
        Where versions are reserved (from the worker thread).
    backoff : RedisBackoff
        The worker thread's Redis calls.
    model : str
        The model's name (in the renewing thread's name).
    seconds : float
        The lease's expiry; it is renewed every third of it.
    worker_alive : callable
        True while the worker thread runs: the lease is renewed only then.
    on_lost : callable
        Called (from the renewing thread) when another process turns out to hold the lease.

    Attributes
    ----------
    holding : threading.Event
        Set while we hold the lease, as far as we know.
    lost : threading.Event
        Set when another process holds it: the worker stands down.
    reserved : int
        ``versions_reserved`` as this worker left it in Redis.
    """

    def __init__(
        self,
        lease: WorkerLease,
        repository: ModelRepository,
        backoff: RedisBackoff,
        *,
        model: str,
        seconds: float,
        worker_alive: Callable[[], bool],
        on_lost: Callable[[], None],
    ) -> None:
        self.lease = lease
        self.repository = repository
        self.backoff = backoff
        self.holding = threading.Event()
        self.lost = threading.Event()
        self.reserved = 0
        self._interval = seconds / 3
        self._worker_alive = worker_alive
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._model = model
        self._thread = threading.Thread(
            target=self._keep, name=f"nmbatch-lease-{model}", daemon=True
        )

    # -- the lease ------------------------------------------------------------------------
    @property
    def token(self) -> str:
        """The lease's token: what fenced writes check in Redis."""
        return self.lease.token

    def acquire(self) -> bool:
        """Take the lease if it can be taken; True if held. Raises Redis errors."""
        held = self.lease.acquire()
        if held:
            self.holding.set()
        return held

    def check(self) -> None:
        """A fenced write found the lease not ours: take it again if it merely expired.

        Sets :attr:`lost` (the worker stands down) if another process took it; decides
        nothing while Redis is away (the next write or renewal does).
        """
        try:
            held = self.backoff.call(self.lease.renew)
        except RedisAwayError:
            return
        if not held:
            self.holding.clear()
            self.lost.set()

    def release(self, reserved: int | None) -> None:
        """Give the lease back; ``reserved`` also lowers ``versions_reserved`` to it.

        Raises :class:`RedisAwayError`.
        """
        self.backoff.call(self.lease.release, reserved)

    def drop(self) -> None:
        """Forget the lease on our side (released, or taken by another process)."""
        self.holding.clear()
        self.lost.clear()

    # -- versions -------------------------------------------------------------------------
    def reserve(self, up_to: int) -> int:
        """Raise ``versions_reserved`` to at least ``up_to``; returns it (also :attr:`reserved`).

        Raises Redis errors, and :class:`LeaseLostError` if the lease is not ours.
        """
        self.reserved = self.repository.reserve_versions(self.token, up_to)
        return self.reserved

    # -- the renewing thread --------------------------------------------------------------
    def start(self) -> None:
        """Start renewing (while :attr:`holding` and the worker thread lives)."""
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the thread ends at its next wake-up: :meth:`join` waits for it)."""
        self._stop.set()

    def join(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds for the renewing thread to end, if it runs."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _keep(self) -> None:
        """Renew the lease every third of its expiry while held and the worker lives."""
        bind_model(self._model)
        interval = self._interval
        delay = interval
        while not self._stop.wait(delay):
            delay = interval
            if not self.holding.is_set() or not self._worker_alive():
                continue
            try:
                held = self.lease.renew()
            except redis.RedisError as exc:
                if not redis_unavailable(exc):
                    log.exception("renewing the worker lease failed")
                delay = min(interval, 0.25)  # try again soon: the expiry runs
                continue
            if not held and self.holding.is_set():
                self.holding.clear()
                self.lost.set()
                self._on_lost()
