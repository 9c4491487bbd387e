"""Redis key names of one model, and what each key holds.

Keys (``{model}`` is ``NMBATCH_MODEL``, so several models share one Redis):

``nmbatch:{model}:log`` (stream)
    The accepted samples, in arrival order (all of them with retention ``all``; else
    entries wholly outside the retained set are trimmed, and a compaction deletes those up
    to ``base_last_id``: :mod:`service.storage.retained`). An entry holds ``n`` rows of ``d``
    coordinates as raw little-endian ``float32`` bytes (field ``x``, row-major), with
    ``n`` and ``d`` as decimal fields (:mod:`service.storage.codec`). A request is split
    into entries of at most :data:`~service.storage.codec.CHUNK_BYTES` and appended in one
    step together with the counter ``n_samples`` of the meta hash: all of it or nothing
    (:mod:`service.storage.log`).
``nmbatch:{model}:meta`` (hash)
    ``k`` and ``dim`` of the model (a setting that contradicts them stops start-up;
    ``reclustered_at``, once a re-clustering changed ``k``: then its ``k`` is the model's,
    whatever the setting says),
    ``n_samples`` (rows ever appended to the log; trimming and compaction do not lower
    it), ``created_at``; ``versions_reserved`` and ``versions_reserved_by``
    (:mod:`service.storage.lease`). Once a compaction has
    committed (:mod:`service.storage.retained`): ``base_generation`` (``g``, from 1),
    ``base_last_id`` (the base holds the retained samples of the log up to and including
    this entry id; the log holds no entry at or before it), ``base_rows`` and
    ``base_policy`` (JSON state of the retention policy as of ``base_last_id``), all four
    written by one script.
``nmbatch:{model}:base:{g}`` (stream)
    The retained samples of compaction ``g`` (the one ``base_generation`` names), in the
    order the worker holds them: entries with ``n``, ``d`` and ``x`` as in the log, plus
    ``ids``, the samples' ids as raw little-endian ``int64`` bytes. The retained set of
    the model is these rows followed by the log's entries after ``base_last_id``. Entry
    ids are ``{nonce}-{1..m}``, the nonce random per compaction. ``base:{g+1}`` exists
    only while compaction ``g + 1`` writes it (or is left by one that died: the next
    one deletes it first); the commit deletes ``base:{g}``.
``nmbatch:{model}:snapshot`` (hash)
    The latest centroids (``float32`` bytes), counts (``int64`` bytes), batch size
    ``b``, iteration, last log entry id consumed, version, ``k``, ``dim``
    (:mod:`service.storage.snapshot`); written in one WATCH/MULTI/EXEC transaction that
    refuses to replace a newer version (and, for the worker, refuses to write unless it
    still holds the lease below).
``nmbatch:{model}:versions`` (sorted set)
    The kept versions (:mod:`service.storage.versions`): member and score the version
    number. Every snapshot written adds its version, in the same transaction, with its
    record below, and forgets the oldest unpinned versions beyond the model's bound
    (``NMBATCH_KEEP_VERSIONS`` and ``NMBATCH_KEEP_VERSIONS_BYTES``).
``nmbatch:{model}:version:{V}`` (hash)
    Kept version ``V``: the snapshot's fields as it was written (centroids, counts,
    ``b``, ``N``, iteration, energy, time ...).
``nmbatch:{model}:pin`` (string)
    The pinned version, if any: reads serve it while training goes on. Set only while
    that version is kept (checked in the script that sets it); a pinned version is never
    forgotten.
``nmbatch:{model}:events`` (stream)
    The model's events (:mod:`service.storage.events`): fields ``type`` and ``data``
    (JSON), at most ``NMBATCH_EVENTS_KEEP`` entries (``MAXLEN ~``); the entry id is the
    event's id of ``GET /events``.
``nmbatch:{model}:seed`` (hash)
    The centroids the model was seeded with, if it was (``k``, ``dim``, ``x``: raw
    ``float32``; :mod:`service.storage.seed`): written with its registry entry (a named
    model) or at its first start (``NMBATCH_INIT_FILE``), deleted by a re-clustering.
``nmbatch:{model}:lock`` (string, with expiry)
    The worker lease: ``{token}:{run id}:{client id}``, set with ``SET NX PX``
    (:mod:`service.storage.lease`).
``nmbatch:{model}:idempotency:{sha256(key)}`` (hash, with expiry)
    The record of one ``Idempotency-Key`` of ``POST /samples``: fields ``fingerprint``
    (:func:`~service.storage.codec.fingerprint` of the vectors), ``accepted`` and
    ``n_samples`` (the first answer). The key itself never becomes part of a key name.
``nmbatch:{model}:idempotency-index`` (sorted set, with expiry)
    The records above, by the time they were stored (score, ms; member the key's
    ``sha256``): at most ``NMBATCH_IDEMPOTENCY_MAX_KEYS`` are kept, the oldest forgotten
    first (record deleted with its member) when a new one would pass the bound, in the
    same script that stores the new one (:mod:`service.storage.log`).
``nmbatch:{model}:ids`` (hash)
    The sample ids clients sent with ``POST /samples`` (field: the id, at most
    :data:`~nmbatch.service.sampleids.ID_MAX_BYTES` bytes; value: ``"<entry id> <row>"``,
    the log entry and row that hold the sample), written by the script that appends the
    rows, which refuses a request naming an id already there. Ids the log assigns
    (``"<entry id>-<row>"``) are not stored: they name their entry and row themselves.
``nmbatch:{model}:deleted`` (hash)
    The tombstones of deleted samples (:mod:`service.storage.deletions`): field
    ``"<entry id> <row>"``, value the sample's stream id in the engine; consulted on every
    replay, so no restart counts a deleted row again.
``nmbatch:{model}:generation`` (string)
    A random token naming this incarnation of the model: set when ``PUT /models/{name}``
    creates it (the default model's when it first starts), deleted by ``DELETE`` in the
    same step that unregisters it. Every append checks it in the script that appends,
    so a request that picked the model before a ``DELETE`` stores nothing after it, and
    nothing of a deleted model reaches a later model of the same name.
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
    def versions(self) -> str:
        return self.prefix + "versions"

    @property
    def pin(self) -> str:
        return self.prefix + "pin"

    def version(self, version: int) -> str:
        """Key of kept version ``version``: ``nmbatch:{model}:version:{V}``."""
        return f"{self.prefix}version:{int(version)}"

    @property
    def events(self) -> str:
        return self.prefix + "events"

    @property
    def seed(self) -> str:
        return self.prefix + "seed"

    @property
    def lock(self) -> str:
        return self.prefix + "lock"

    @property
    def generation(self) -> str:
        return self.prefix + "generation"

    @property
    def idempotency_index(self) -> str:
        return self.prefix + "idempotency-index"

    @property
    def idempotency_prefix(self) -> str:
        """Prefix of the records: ``{prefix}idempotency:`` + the key's ``sha256``."""
        return self.prefix + "idempotency:"

    @property
    def sample_ids(self) -> str:
        """The id map of the samples clients named: ``nmbatch:{model}:ids``."""
        return self.prefix + "ids"

    @property
    def deleted(self) -> str:
        """The tombstones of deleted samples: ``nmbatch:{model}:deleted``."""
        return self.prefix + "deleted"

    def base(self, generation: int) -> str:
        """Key of the retained samples of compaction ``generation``: ``...:base:{g}``."""
        return f"{self.prefix}base:{int(generation)}"

    def idempotency(self, idempotency_key: str) -> str:
        """Key of the record of ``idempotency_key``: ``nmbatch:{model}:idempotency:{sha256}``."""
        return self.idempotency_prefix + idempotency_digest(idempotency_key)


def idempotency_digest(idempotency_key: str) -> str:
    """The ``sha256`` (hex) naming an ``Idempotency-Key``'s record and index member."""
    return hashlib.sha256(idempotency_key.encode("latin-1", errors="replace")).hexdigest()
