"""Redis calls of the worker thread, retried with exponential backoff while Redis is away.

The worker goes on iterating on the samples it holds while Redis does not answer: each
Redis operation of its loop goes through :meth:`RedisBackoff.call`, which raises
:class:`RedisAwayError` (the caller skips the operation and tries at its next turn)
instead of blocking or failing the thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.storage import redis_unavailable

__all__ = ["BACKOFF_MAX", "BACKOFF_MIN", "RedisAwayError", "RedisBackoff"]

log = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF_MIN, BACKOFF_MAX = 0.05, 2.0
"""Seconds between attempts while Redis is away: doubling from the first to the second."""


class RedisAwayError(Exception):
    """Redis did not answer; the caller skips the operation (backoff is running)."""


class RedisBackoff:
    """Runs the worker's Redis calls; skips them while backing off after an outage.

    ``ok`` is False from the first failure until a call succeeds again; the metrics
    ``nmbatch_redis_up`` and ``nmbatch_redis_unavailable{where="worker"}`` follow it.
    """

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics
        self.ok = True
        self._backoff = 0.0
        self._retry_at = 0.0

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``; raises :class:`RedisAwayError` if Redis is unavailable or backing off.

        While Redis is away, calls are skipped until the backoff (doubling from 50 ms to
        2 s) has passed; the first failure and the recovery are logged once. Errors other
        than Redis being unavailable are raised as they are.
        """
        now = time.monotonic()
        if now < self._retry_at:
            raise RedisAwayError
        try:
            result = fn(*args)
        except redis.RedisError as exc:
            if not redis_unavailable(exc):
                raise
            self._backoff = min(max(2 * self._backoff, BACKOFF_MIN), BACKOFF_MAX)
            self._retry_at = time.monotonic() + self._backoff
            self.metrics.redis_errors.labels("worker").inc()
            if self.ok:
                self.ok = False
                self.metrics.redis_up.set(0)
                log.warning("Redis unavailable in the worker (%s); retrying with backoff", exc)
            raise RedisAwayError from exc
        if not self.ok:
            self.ok = True
            self.metrics.redis_up.set(1)
            log.warning("Redis reachable again: the worker resumes reading and snapshots")
        self._backoff = 0.0
        return result

    def seconds_to_retry(self) -> float:
        """Seconds until the next attempt is allowed (0 or less: now)."""
        return self._retry_at - time.monotonic()

    def retry_now(self) -> None:
        """Allow the next call at once, even during a backoff (one last attempt)."""
        self._retry_at = 0.0
