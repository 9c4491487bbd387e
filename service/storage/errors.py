"""What storage raises: conflicts with what Redis holds, a lost lease, a refused append.

The use case that appends (``service.usecases.serving.ingest``) translates
:class:`WrongDimensionError`, :class:`IdempotencyKeyReusedError`,
:class:`StoreFullError` and :class:`ModelGoneError` into the application's domain errors
(``service.usecases.errors``), which ``service.problems`` answers;
:func:`redis_unavailable` sorts Redis errors into "retry later" and faults.
"""

from __future__ import annotations

import redis

__all__ = [
    "DuplicateSampleIdError",
    "IdempotencyKeyReusedError",
    "LeaseLostError",
    "ModelConfigError",
    "ModelGoneError",
    "StoreFullError",
    "WrongDimensionError",
    "redis_oom",
    "redis_unavailable",
]


class ModelConfigError(RuntimeError):
    """A setting contradicts what Redis already holds for the model."""


class LeaseLostError(RuntimeError):
    """This process no longer holds the model's worker lease (another one took over)."""


class ModelGoneError(RuntimeError):
    """The model this append was for was deleted (or deleted and created again) since the
    request picked it: its ``generation`` key is gone or names another incarnation.
    Nothing was stored."""


class WrongDimensionError(ValueError):
    """Vectors of ``got`` coordinates for a model whose dimension is ``expected``.

    Raised when a batch of another dimension fixed the model's dimension first.
    """

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(
            f"vectors have {got} coordinates, but this model's dimension is {expected}"
        )
        self.expected = expected
        self.got = got


class DuplicateSampleIdError(ValueError):
    """A sample id of the request is already a sample id of the model; nothing stored.

    Attributes
    ----------
    sample_id : str
        The first such id of the request.
    """

    def __init__(self, sample_id: str) -> None:
        super().__init__(f"sample id {sample_id!r} is already in the model")
        self.sample_id = sample_id


class IdempotencyKeyReusedError(ValueError):
    """An ``Idempotency-Key`` already stored a request with other vectors."""


class StoreFullError(RuntimeError):
    """An append would pass the model's capacity (or Redis's ``maxmemory``); nothing stored.

    Attributes
    ----------
    max_samples : int
        The capacity (``NMBATCH_MAX_SAMPLES``, set or derived).
    n_samples : int
        Samples in the log when the append was refused.
    rejected : int
        Rows of the refused request.
    redis_oom : bool
        Redis refused the write for its memory (``OOM``), not the capacity check.
    """

    def __init__(
        self, max_samples: int, n_samples: int, rejected: int, *, redis_oom: bool = False
    ) -> None:
        if redis_oom:
            reason = "Redis refused the write: its memory (maxmemory) is full"
        else:
            reason = (
                f"the model holds {n_samples:,} samples; {rejected:,} more would pass its "
                f"capacity NMBATCH_MAX_SAMPLES = {max_samples:,}"
            )
        super().__init__(f"{reason}; nothing from this request is stored")
        self.max_samples = max_samples
        self.n_samples = n_samples
        self.rejected = rejected
        self.redis_oom = redis_oom


_UNAVAILABLE_REPLIES = ("LOADING", "MISCONF", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "READONLY")


def redis_oom(exc: BaseException) -> bool:
    """True if Redis refused a write for its memory (``maxmemory`` with ``noeviction``).

    Redis 7 replies ``OOM`` (``OutOfMemoryError``); inside a script, Redis 6.2 wraps the
    same reply in a script error (``Error running script ... -OOM command not allowed``).
    """
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis.ResponseError) and "OOM command not allowed" in str(exc)


def redis_unavailable(exc: BaseException) -> bool:
    """True if ``exc`` means Redis cannot serve now (down, slow, loading, refusing writes).

    Such errors are worth a retry later: the service answers ``503`` with ``Retry-After``
    and the worker backs off. Other Redis errors (wrong type, script bug) are faults.
    """
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
        return True  # BusyLoadingError is a ConnectionError
    if redis_oom(exc):
        return True  # a write refused at maxmemory (noeviction): retried once memory frees
    if isinstance(exc, redis.ResponseError):
        return str(exc).upper().startswith(_UNAVAILABLE_REPLIES)
    return False
