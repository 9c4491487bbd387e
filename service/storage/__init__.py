"""Redis storage of one model: key schema, codecs, sample log, repository, lease, snapshot.

=================  ==============================================================
``keys``           :class:`ModelKeys`: key names and what each key holds
``codec``          float32 rows in log entries, stream ids, row fingerprints
``errors``         storage's exceptions, :func:`redis_unavailable`
``handoff``        :class:`LocalEntries`: appended rows handed to the worker in memory
``log``            :class:`AsyncSampleLog`: the request handlers' one ``append``
``repository``     :class:`ModelRepository`: start-up checks, log reading, snapshots
``lease``          :class:`WorkerLease` and the version reservation
``snapshot``       :class:`Snapshot`: the persisted state of the model
``capacity``       :class:`Capacity`: ``NMBATCH_MAX_SAMPLES``, its default from memory
``retained``       :class:`RetainedLog`: log trimming, crash-safe compaction into a base
``retained_base``  :class:`Base`: the base's record and entries, read back
=================  ==============================================================
"""

from nmbatch.service.storage.codec import (
    CHUNK_BYTES,
    LogChunk,
    decode_chunk,
    encode_chunks,
    fingerprint,
    next_id,
)
from nmbatch.service.storage.errors import (
    DuplicateSampleIdError,
    IdempotencyKeyReusedError,
    LeaseLostError,
    ModelConfigError,
    ModelGoneError,
    StoreFullError,
    WrongDimensionError,
    redis_unavailable,
)
from nmbatch.service.storage.handoff import LocalEntries
from nmbatch.service.storage.keys import KEY_MAX_LENGTH, KEY_PATTERN, ModelKeys
from nmbatch.service.storage.lease import WorkerLease
from nmbatch.service.storage.log import AppendOutcome, AsyncSampleLog
from nmbatch.service.storage.repository import ModelRepository
from nmbatch.service.storage.retained import RetainedLog
from nmbatch.service.storage.retained_base import Base, BaseChangedError
from nmbatch.service.storage.snapshot import Snapshot

__all__ = [
    "CHUNK_BYTES",
    "KEY_MAX_LENGTH",
    "KEY_PATTERN",
    "AppendOutcome",
    "AsyncSampleLog",
    "Base",
    "BaseChangedError",
    "DuplicateSampleIdError",
    "IdempotencyKeyReusedError",
    "LeaseLostError",
    "LocalEntries",
    "LogChunk",
    "ModelConfigError",
    "ModelGoneError",
    "ModelKeys",
    "ModelRepository",
    "RetainedLog",
    "Snapshot",
    "StoreFullError",
    "WorkerLease",
    "WrongDimensionError",
    "decode_chunk",
    "encode_chunks",
    "fingerprint",
    "next_id",
    "redis_unavailable",
]
