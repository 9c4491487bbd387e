"""``Idempotency-Key`` of ``POST /samples``: a retried request is stored once.

A client that did not get an answer (timeout, dropped connection) cannot know whether
its samples were stored. If it sends an ``Idempotency-Key`` header (any 1 to 255 visible
ASCII characters, e.g. a UUID; see :data:`KEY_PATTERN`), a retry with the same key and
the same vectors is answered with the first answer (same ``202`` body, plus
``Idempotent-Replayed: true``) and stores nothing; the same key with other vectors is a
``409`` problem (``idempotency-key-reused``). A key is remembered for
``NMBATCH_IDEMPOTENCY_SECONDS`` after its request was stored.

"Same vectors" means the same ``float32`` matrix after parsing (shape and values), so a
retry that re-encodes the batch (JSON instead of ``.npy``) is still a retry.

Atomicity: the check of the key, the append of the entries to the sample log and the
record of the key are one Lua script (:data:`APPEND_ONCE`), so two concurrent requests
with one key store the samples once, whatever their timing. The log entries are the
ones :func:`service.redis_log.encode_chunks` makes, written with the same fields (``n``,
``d``, ``x``), and the meta counter ``n_samples`` is incremented in the same step, exactly
as :meth:`service.redis_log.AsyncSampleLog.append` does. The record is the hash
``nmbatch:{model}:idempotency:{sha256(key)}`` (fields ``fingerprint``, ``accepted``,
``n_samples``), with a Redis expiry: the key itself never becomes part of a Redis key
name.

A request refused before the script (bad body, wrong dimension ...) leaves no record:
the client may fix it and retry under the same key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from nmbatch.service.context import ServiceContext, off_loop
from nmbatch.service.problems import ProblemError
from nmbatch.service.redis_log import ModelKeys, encode_chunks

__all__ = [
    "APPEND_ONCE",
    "KEY_MAX_LENGTH",
    "KEY_PATTERN",
    "AppendOutcome",
    "append_once",
    "fingerprint",
    "record_key",
]

KEY_MAX_LENGTH = 255
#: Visible ASCII (no space, no control character), 1 to 255 characters.
KEY_PATTERN = r"^[!-~]{1,255}$"

APPEND_ONCE = """
-- KEYS[1] idempotency record (hash), KEYS[2] sample log (stream), KEYS[3] meta (hash)
-- ARGV[1] fingerprint, ARGV[2] expiry in ms, ARGV[3] rows in the request,
-- then (n, d, x) of every log entry, as service.redis_log.encode_chunks makes them.
local stored = redis.call('HMGET', KEYS[1], 'fingerprint', 'accepted', 'n_samples')
if stored[1] then
  return {0, stored[1], stored[2], stored[3]}
end
for i = 4, #ARGV, 3 do
  redis.call('XADD', KEYS[2], '*', 'n', ARGV[i], 'd', ARGV[i + 1], 'x', ARGV[i + 2])
end
local total = redis.call('HINCRBY', KEYS[3], 'n_samples', ARGV[3])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'accepted', ARGV[3], 'n_samples', total)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, ARGV[1], ARGV[3], total}
"""


@dataclass(frozen=True)
class AppendOutcome:
    """What :func:`append_once` did.

    Attributes
    ----------
    stored : bool
        True if this call appended the samples; False for a replay of an earlier request.
    accepted : int
        Vectors accepted by the (first) request.
    n_samples : int
        Total samples in the log right after the (first) request was stored.
    """

    stored: bool
    accepted: int
    n_samples: int


def record_key(model: str, idempotency_key: str) -> str:
    """Redis key of the record of ``idempotency_key``: ``nmbatch:{model}:idempotency:{sha256}``."""
    digest = hashlib.sha256(idempotency_key.encode("latin-1", errors="replace")).hexdigest()
    return f"{ModelKeys(model).prefix}idempotency:{digest}"


def fingerprint(X: np.ndarray) -> str:
    """SHA-256 of the shape and ``float32`` values of ``X`` (``(n, d)``), as hex."""
    X = np.ascontiguousarray(X, dtype="<f4")
    digest = hashlib.sha256(f"{X.shape[0]}x{X.shape[1]}:".encode())
    digest.update(memoryview(X).cast("B"))
    return digest.hexdigest()


def _payload(X: np.ndarray) -> tuple[str, list[bytes | int]]:
    """Fingerprint and flat script arguments (n, d, x per log entry) of ``X``."""
    args: list[bytes | int] = []
    for fields in encode_chunks(X):
        args += [fields["n"], fields["d"], fields["x"]]
    return fingerprint(X), args


async def append_once(
    context: ServiceContext, X: np.ndarray, idempotency_key: str
) -> AppendOutcome:
    """Append ``X`` (``(m, d)`` float32, validated) unless ``idempotency_key`` was used.

    Raises a 409 problem if the key was used for other vectors, and a 422 one if ``X``
    contradicts the model's dimension (as :meth:`ServiceContext.append_samples`).
    """
    d = int(X.shape[1])
    if context.dim is None:  # the first batch fixes the dimension (as append_samples does)
        stored_dim = await context.sample_log.fix_dim(d)
        context.dim = stored_dim
        if stored_dim != d:
            raise ProblemError(
                422,
                "wrong-dimension",
                f"vectors have {d} coordinates, but this model's dimension is {stored_dim}",
                expected_dim=stored_dim,
                got_dim=d,
            )
    settings = context.settings
    mine, args = await off_loop(X.size, _payload, X)
    keys = ModelKeys(settings.model)
    ttl_ms = max(1, round(settings.idempotency_seconds * 1000))
    script = context.sample_log.client.register_script(APPEND_ONCE)
    reply = await script(
        keys=[record_key(settings.model, idempotency_key), keys.log, keys.meta],
        args=[mine, ttl_ms, int(X.shape[0]), *args],
    )
    stored, their_print, accepted, total = (
        int(reply[0]),
        _text(reply[1]),
        int(reply[2]),
        int(reply[3]),
    )
    if not stored and their_print != mine:
        raise ProblemError(
            409,
            "idempotency-key-reused",
            "this Idempotency-Key was used for a request with other vectors; use a new key "
            "for new samples",
            title="Idempotency-Key reused",
        )
    if stored:
        context.metrics.samples_ingested.inc(accepted)
        context.worker.notify()
    return AppendOutcome(stored=bool(stored), accepted=accepted, n_samples=total)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
