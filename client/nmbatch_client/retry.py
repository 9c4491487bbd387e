"""When to retry a request and how long to wait: bounded exponential backoff with jitter.

A request is retried when no answer came (connection refused or reset, a timeout) and
when the answer says "later": ``429``, ``502``, ``503``, ``504``. Every request of the
client may be retried: reads change nothing, and each ``POST /samples`` carries an
``Idempotency-Key``, so the service stores its vectors once however many times it
arrives (:mod:`service.storage.log`).

The wait before retry ``n`` (``n = 1, 2, ...``) is ``min(max_backoff, backoff * 2**(n-1))``
scaled by a random factor in ``[1 - jitter, 1]`` (clients that failed together do not
come back together), and never less than the answer's ``Retry-After``. Retries stop
after ``attempts`` requests in all, or when the next one would start more than
``deadline`` seconds after the first; the last failure is then raised.

:meth:`RetryPolicy.retrying` gives the loop of one request under these rules:
:class:`Retrying` for :class:`~nmbatch_client.Client`, :class:`AsyncRetrying` (awaited)
for :class:`~nmbatch_client.AsyncClient`.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

__all__ = [
    "RETRIED_ERRORS",
    "RETRY_STATUSES",
    "AsyncRetrying",
    "RetryPolicy",
    "Retrying",
    "retry_after_seconds",
]

RETRIED_ERRORS: tuple[type[Exception], ...] = (
    httpx.NetworkError,  # connect, read, write, close
    httpx.TimeoutException,
    httpx.RemoteProtocolError,  # the server closed the connection mid-answer
)
"""Transport errors after which a request is repeated (no answer came)."""

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers that mean "not now": the request is retried."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retries of one request.

    Parameters
    ----------
    attempts : int
        Most requests in all (1: no retry).
    deadline : float
        Seconds after the first request past which no retry starts.
    backoff : float
        Wait before the first retry, in seconds (doubling after each).
    max_backoff : float
        Longest wait computed from the backoff (a longer ``Retry-After`` is honoured).
    jitter : float
        In ``[0, 1]``: each wait is scaled by a uniform factor in ``[1 - jitter, 1]``.
    """

    attempts: int = 8
    deadline: float = 60.0
    backoff: float = 0.2
    max_backoff: float = 5.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if not (self.deadline >= 0 and self.backoff >= 0 and self.max_backoff >= 0):
            raise ValueError("deadline, backoff and max_backoff must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    @classmethod
    def never(cls) -> RetryPolicy:
        """One attempt, no retry."""
        return cls(attempts=1)

    def backoff_for(self, retry: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (1-based), jitter included."""
        base = min(self.max_backoff, self.backoff * 2.0 ** min(retry - 1, 60))
        return base * (1.0 - self.jitter * rng.random())

    def retrying(
        self,
        *,
        asynchronous: bool = False,
        rng: random.Random | None = None,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> Retrying | AsyncRetrying:
        """The retry loop of one request under this policy.

        ``retrying(request, ...)`` (awaited with ``asynchronous=True``) calls ``request``
        until it returns an answer that is not in :data:`RETRY_STATUSES` or raises an
        error other than :data:`RETRIED_ERRORS`; when the attempts or the deadline run out
        it returns the last answer or raises the last error. ``statistics
        ["attempt_number"]`` then counts the requests. ``rng`` draws the jitter;
        ``sleep`` replaces ``time.sleep`` (``asyncio.sleep``) and ``clock``
        ``time.monotonic`` in tests.
        """
        rng = rng if rng is not None else random.Random()
        if asynchronous:
            return AsyncRetrying(self, rng, sleep or asyncio.sleep, clock)
        return Retrying(self, rng, sleep or time.sleep, clock)


class Retrying:
    """The retry loop of one request (:meth:`RetryPolicy.retrying`)."""

    def __init__(
        self,
        policy: RetryPolicy,
        rng: random.Random,
        sleep: Callable[[float], Any],
        clock: Callable[[], float],
    ) -> None:
        self.policy = policy
        self.rng = rng
        self.sleep = sleep
        self.clock = clock
        self.statistics: dict[str, int] = {"attempt_number": 0}
        self._start = 0.0

    def _next_wait(self, response: httpx.Response | None) -> float | None:
        """Seconds to wait before the next attempt, or None when none may follow.

        After attempt ``n`` (``statistics["attempt_number"]``): the backoff of retry
        ``n``, at least the answer's ``Retry-After``; None past ``attempts`` or when the
        next attempt would start ``deadline`` seconds or more after the first.
        """
        attempt = self.statistics["attempt_number"]
        if attempt >= self.policy.attempts:
            return None
        seconds = self.policy.backoff_for(attempt, self.rng)
        if response is not None:
            after = retry_after_seconds(response.headers.get("retry-after"))
            seconds = seconds if after is None else max(seconds, after)
        if self.clock() - self._start + seconds >= self.policy.deadline:
            return None
        return seconds

    def __call__(self, request: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._start = self.clock()
        while True:
            self.statistics["attempt_number"] += 1
            try:
                response = request(*args, **kwargs)
            except RETRIED_ERRORS:
                if (wait := self._next_wait(None)) is None:
                    raise
            else:
                if not _says_later(response) or (wait := self._next_wait(response)) is None:
                    return response
            self.sleep(wait)


class AsyncRetrying(Retrying):
    """:class:`Retrying` for coroutines: ``await retrying(request, ...)``."""

    async def __call__(self, request: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._start = self.clock()
        while True:
            self.statistics["attempt_number"] += 1
            try:
                response = await request(*args, **kwargs)
            except RETRIED_ERRORS:
                if (wait := self._next_wait(None)) is None:
                    raise
            else:
                if not _says_later(response) or (wait := self._next_wait(response)) is None:
                    return response
            await self.sleep(wait)


def _says_later(response: httpx.Response) -> bool:
    return response.status_code in RETRY_STATUSES


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delay-seconds or an HTTP date.

    None when absent or unreadable; a date in the past gives 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
