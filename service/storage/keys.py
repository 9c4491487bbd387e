"""Redis key names of one model, and what each key holds.

Keys (``{model}`` is ``NMBATCH_MODEL``, so several models share one Redis):

``nmbatch:{model}:log`` (stream)
    Every accepted sample, in arrival order. An entry holds ``n`` rows of ``d``
    coordinates as raw little-endian ``float32`` bytes (field ``x``, row-major), with
    ``n`` and ``d`` as decimal fields (:mod:`service.storage.codec`). A request is split
    into entries of at most :data:`~service.storage.codec.CHUNK_BYTES` and appended in one
    step together with the counter ``n_samples`` of the meta hash: all of it or nothing
    (:mod:`service.storage.log`).
``nmbatch:{model}:meta`` (hash)
    ``k`` and ``dim`` of the model (a setting that contradicts them stops start-up),
    ``n_samples`` (total rows in the log), ``created_at``; ``versions_reserved`` and
    ``versions_reserved_by`` (:mod:`service.storage.lease`).
``nmbatch:{model}:snapshot`` (hash)
    The latest centroids (``float32`` bytes), counts (``int64`` bytes), batch size
    ``b``, iteration, last log entry id consumed, version, ``k``, ``dim``
    (:mod:`service.storage.snapshot`); written in one WATCH/MULTI/EXEC transaction that
    refuses to replace a newer version (and, for the worker, refuses to write unless it
    still holds the lease below).
``nmbatch:{model}:lock`` (string, with expiry)
    The worker lease: ``{token}:{run id}:{client id}``, set with ``SET NX PX``
    (:mod:`service.storage.lease`).
``nmbatch:{model}:idempotency:{sha256(key)}`` (hash, with expiry)
    The record of one ``Idempotency-Key`` of ``POST /samples``: fields ``fingerprint``
    (:func:`~service.storage.codec.fingerprint` of the vectors), ``accepted`` and
    ``n_samples`` (the first answer). The key itself never becomes part of a key name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["KEY_MAX_LENGTH", "KEY_PATTERN", "ModelKeys"]

KEY_MAX_LENGTH = 255
"""Longest ``Idempotency-Key``."""
#: Visible ASCII (no space, no control character), 1 to 255 characters.
KEY_PATTERN = r"^[!-~]{1,255}$"


@dataclass(frozen=True)
class ModelKeys:
    """Redis key names of one model."""

    model: str

    @property
    def prefix(self) -> str:
        return f"nmbatch:{self.model}:"

    @property
    def log(self) -> str:
        return self.prefix + "log"

    @property
    def meta(self) -> str:
        return self.prefix + "meta"

    @property
    def snapshot(self) -> str:
        return self.prefix + "snapshot"

    @property
    def lock(self) -> str:
        return self.prefix + "lock"

    def idempotency(self, idempotency_key: str) -> str:
        """Key of the record of ``idempotency_key``: ``nmbatch:{model}:idempotency:{sha256}``."""
        digest = hashlib.sha256(idempotency_key.encode("latin-1", errors="replace")).hexdigest()
        return f"{self.prefix}idempotency:{digest}"
