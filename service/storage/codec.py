"""Bytes of the sample log: float32 rows in stream entries, stream ids, row fingerprints.

A log entry holds ``n`` rows of ``d`` coordinates as raw little-endian ``float32`` bytes
(field ``x``, row-major), with ``n`` and ``d`` as decimal fields; a request is split into
entries of at most :data:`CHUNK_BYTES` of rows. A request with sample weights other than
1 adds to each of its entries the field ``w``: the ``n`` weights as little-endian
``float64`` bytes (and its entries hold ``4 d + 8`` bytes per row); an entry without
``w`` is what it always was, its rows weighing 1.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from nmbatch.engine.rows import SourceRows

__all__ = [
    "CHUNK_BYTES",
    "LogChunk",
    "as_str",
    "decode_chunk",
    "decode_entry",
    "decode_weights",
    "encode_chunks",
    "fingerprint",
    "id_key",
    "next_id",
]

CHUNK_BYTES = (1 << 20) - (4 << 10)
"""Largest payload of one log entry (a request may span several): 1 MiB less 4 KiB.

Redis stores a large entry as one allocation (a listpack of its own: the payload plus a
header of about a hundred bytes), which jemalloc rounds up to its next size class. 1 MiB
is a size class and the next is 1.25 MiB, so a full entry of exactly 1 MiB of rows took
1.25 MiB; 4 KiB under it, a full entry takes 1 MiB (``benchmarks/redis_bytes.py`` measures
it)."""


@dataclass(frozen=True)
class LogChunk:
    """One decoded log entry: its stream id and rows ``X``, shape ``(n, d)``, float32
    (or the :class:`~nmbatch.engine.rows.SourceRows` naming them)."""

    entry_id: str
    X: np.ndarray | SourceRows
    weights: np.ndarray | None = None
    """The rows' sample weights, ``(n,)`` float64; None: every row weighs 1."""


def encode_chunks(
    X: np.ndarray, weights: np.ndarray | None = None
) -> list[dict[str, bytes | int]]:
    """Split ``X`` (``(n, d)`` float32) into log entry field maps of <= CHUNK_BYTES each;
    with ``weights`` (``(n,)`` float64, checked) each entry also holds its rows' ``w``."""
    X = np.ascontiguousarray(X, dtype="<f4")
    n, d = X.shape
    if weights is None:
        rows = max(1, CHUNK_BYTES // (4 * d))
        return [
            {"n": int(min(rows, n - start)), "d": int(d), "x": X[start : start + rows].tobytes()}
            for start in range(0, n, rows)
        ]
    w = np.ascontiguousarray(weights, dtype="<f8")
    rows = max(1, CHUNK_BYTES // (4 * d + 8))
    return [
        {"n": int(min(rows, n - start)), "d": int(d), "x": X[start : start + rows].tobytes(),
         "w": w[start : start + rows].tobytes()}
        for start in range(0, n, rows)
    ]  # fmt: skip


def decode_chunk(fields: dict[bytes, bytes]) -> np.ndarray:
    """Rows of one log entry, shape ``(n, d)``, float32 (read-only view of the bytes)."""
    n, d = int(fields[b"n"]), int(fields[b"d"])
    X = np.frombuffer(fields[b"x"], dtype="<f4")
    if X.size != n * d:
        raise ValueError(f"corrupt log entry: {X.size} values for {n} x {d}")
    return X.reshape(n, d)


def decode_weights(fields: dict[bytes, bytes]) -> np.ndarray | None:
    """The sample weights of one log (or base) entry, ``(n,)`` float64 (read-only view of
    the bytes), or None for an entry without ``w`` (its rows weigh 1)."""
    raw = fields.get(b"w")
    if raw is None:
        return None
    w = np.frombuffer(raw, dtype="<f8")
    if w.size != int(fields[b"n"]):
        raise ValueError(f"corrupt log entry: {w.size} weights for {int(fields[b'n'])} rows")
    return w


def decode_entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> LogChunk:
    """One log entry as a :class:`LogChunk`: its rows and, if it has any, its weights."""
    return LogChunk(as_str(entry_id), decode_chunk(fields), decode_weights(fields))


def as_str(raw: bytes | str) -> str:
    """A Redis reply (stream id, lease value, fingerprint), bytes or str, as ``str``."""
    return raw.decode() if isinstance(raw, bytes) else raw


def id_key(stream_id: str) -> tuple[int, int]:
    """A stream id ``"<ms>-<seq>"`` as a tuple that sorts like Redis sorts ids."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


_MAX_SEQ = (1 << 64) - 1  # the largest sequence part of a stream id


def next_id(stream_id: str) -> str:
    """The smallest stream id greater than ``stream_id`` (``"<ms>-<seq>"``).

    ``XTRIM ... MINID next_id(x)`` removes every entry up to and including ``x``.
    """
    ms, seq = id_key(stream_id)
    if seq == _MAX_SEQ:
        return f"{ms + 1}-0"
    return f"{ms}-{seq + 1}"


def fingerprint(
    X: np.ndarray, weights: np.ndarray | None = None, ids: list[str] | None = None
) -> str:
    """SHA-256 of the shape and ``float32`` values of ``X`` (``(n, d)``), of the
    ``float64`` ``weights`` (``(n,)``) if any, and of the sample ``ids`` if any, as hex.

    Rows that parse to the same ``float32`` matrix have one fingerprint, whatever the
    encoding they came in (JSON or ``.npy``); unweighted, it is what it always was, and
    the same rows with weights have another.
    """
    X = np.ascontiguousarray(X, dtype="<f4")
    digest = hashlib.sha256(f"{X.shape[0]}x{X.shape[1]}:".encode())
    digest.update(memoryview(X).cast("B"))
    if weights is not None:
        digest.update(b"w:")
        digest.update(memoryview(np.ascontiguousarray(weights, dtype="<f8")).cast("B"))
    if ids is not None:  # ids hold no space (service.sampleids): joined unambiguously
        digest.update(b"ids:" + " ".join(ids).encode())
    return digest.hexdigest()
