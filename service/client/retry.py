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
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

__all__ = ["RETRY_STATUSES", "Retrier", "RetryPolicy", "retry_after_seconds"]

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


@dataclass
class Retrier:
    """The retry state of one request: call :meth:`after_failure` or :meth:`after_answer`
    after each attempt; a number is the wait before the next one, None means stop.

    ``clock`` is monotonic seconds (``time.monotonic``); ``rng`` draws the jitter.
    """

    policy: RetryPolicy
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic
    attempts: int = 0
    started: float | None = None

    def begin(self) -> None:
        """Record the start of an attempt."""
        if self.started is None:
            self.started = self.clock()
        self.attempts += 1

    def after_failure(self) -> float | None:
        """Wait before retrying after no answer, or None when out of attempts or time."""
        return self._next(None)

    def after_answer(self, status: int, headers: Mapping[str, str]) -> float | None:
        """Wait before retrying an answer with ``status``, or None: the answer is final."""
        if status not in RETRY_STATUSES:
            return None
        return self._next(retry_after_seconds(headers.get("retry-after")))

    def _next(self, retry_after: float | None) -> float | None:
        if self.attempts >= self.policy.attempts:
            return None
        wait = self.policy.backoff_for(self.attempts, self.rng)
        if retry_after is not None:
            wait = max(wait, retry_after)
        assert self.started is not None, "begin() was not called"
        if self.clock() + wait - self.started > self.policy.deadline:
            return None
        return wait
