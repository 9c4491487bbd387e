"""Redis persistence of one model: the sample log, the snapshot and the meta record.

Keys (``{model}`` is ``NMBATCH_MODEL``, so several models share one Redis):

``nmbatch:{model}:log`` (stream)
    Every accepted sample, in arrival order. An entry holds ``n`` rows of ``d``
    coordinates as raw little-endian ``float32`` bytes (field ``x``, row-major), with
    ``n`` and ``d`` as decimal fields. A request is split into entries of at most
    :data:`CHUNK_BYTES` and appended in one MULTI/EXEC transaction, together with the
    counter ``n_samples`` of the meta hash: all of it or nothing.
``nmbatch:{model}:meta`` (hash)
    ``k`` and ``dim`` of the model (a setting that contradicts them stops start-up),
    ``n_samples`` (total rows in the log), ``created_at``.
``nmbatch:{model}:snapshot`` (hash)
    The latest centroids (``float32`` bytes), counts (``int64`` bytes), batch size
    ``b``, iteration, last log entry id consumed, version, ``k``, ``dim``; written in one
    WATCH/MULTI/EXEC transaction that refuses to replace a newer version.

:class:`AsyncSampleLog` is what request handlers use (``redis.asyncio``);
:class:`ModelRepository` is the synchronous side used by the worker thread and at
start-up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import redis
import redis.asyncio

__all__ = [
    "CHUNK_BYTES",
    "AsyncSampleLog",
    "LogChunk",
    "ModelConfigError",
    "ModelKeys",
    "ModelRepository",
    "Snapshot",
    "decode_chunk",
    "encode_chunks",
]

CHUNK_BYTES = 1 << 20
"""Largest ``float32`` payload of one log entry (a request may span several)."""


class ModelConfigError(RuntimeError):
    """A setting contradicts what Redis already holds for the model."""


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


# -- codecs --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogChunk:
    """One decoded log entry: its stream id and rows ``X``, shape ``(n, d)``, float32."""

    entry_id: str
    X: np.ndarray


def encode_chunks(X: np.ndarray) -> list[dict[str, bytes | int]]:
    """Split ``X`` (``(n, d)`` float32) into log entry field maps of <= CHUNK_BYTES each."""
    X = np.ascontiguousarray(X, dtype="<f4")
    n, d = X.shape
    rows = max(1, CHUNK_BYTES // (4 * d))
    return [
        {"n": int(min(rows, n - start)), "d": int(d), "x": X[start : start + rows].tobytes()}
        for start in range(0, n, rows)
    ]


def decode_chunk(fields: dict[bytes, bytes]) -> np.ndarray:
    """Rows of one log entry, shape ``(n, d)``, float32 (read-only view of the bytes)."""
    n, d = int(fields[b"n"]), int(fields[b"d"])
    X = np.frombuffer(fields[b"x"], dtype="<f4")
    if X.size != n * d:
        raise ValueError(f"corrupt log entry: {X.size} values for {n} x {d}")
    return X.reshape(n, d)


def _entry_id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class Snapshot:
    """A persisted state of the model.

    Attributes
    ----------
    version : int
        Increases with every published centroid update; never decreases.
    centroids : ndarray (k, d) float32
    counts : ndarray (k,) int64
        ``v(j)``: prefix samples assigned to centroid ``j``.
    batch_size : int
        ``b``, the nested batch (prefix) size.
    iteration : int
    last_id : str
        Id of the last log entry read into the store when the snapshot was taken.
    n_samples : int
        Samples in the store then.
    converged : bool
    updated_at : float
        Unix time of the centroid update.
    """

    version: int
    centroids: np.ndarray
    counts: np.ndarray
    batch_size: int
    iteration: int
    last_id: str
    n_samples: int
    converged: bool
    updated_at: float

    @property
    def k(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    def to_fields(self) -> dict[str, bytes | int | float | str]:
        return {
            "version": self.version,
            "k": self.k,
            "dim": self.dim,
            "centroids": np.ascontiguousarray(self.centroids, dtype="<f4").tobytes(),
            "counts": np.ascontiguousarray(self.counts, dtype="<i8").tobytes(),
            "batch_size": self.batch_size,
            "iteration": self.iteration,
            "last_id": self.last_id,
            "n_samples": self.n_samples,
            "converged": int(self.converged),
            "updated_at": repr(float(self.updated_at)),
        }

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Snapshot:
        k, dim = int(fields[b"k"]), int(fields[b"dim"])
        centroids = np.frombuffer(fields[b"centroids"], dtype="<f4").reshape(k, dim)
        counts = np.frombuffer(fields[b"counts"], dtype="<i8").reshape(k)
        return cls(
            version=int(fields[b"version"]),
            centroids=centroids.astype(np.float32),
            counts=counts.astype(np.int64),
            batch_size=int(fields[b"batch_size"]),
            iteration=int(fields[b"iteration"]),
            last_id=fields[b"last_id"].decode(),
            n_samples=int(fields[b"n_samples"]),
            converged=bool(int(fields[b"converged"])),
            updated_at=float(fields[b"updated_at"]),
        )


# -- synchronous side: start-up and the worker --------------------------------------------
class ModelRepository:
    """Synchronous access to one model's keys (start-up checks, log reading, snapshots).

    Used from one thread at a time (the worker); ``client`` must return bytes
    (``decode_responses=False``).
    """

    def __init__(self, client: redis.Redis, model: str) -> None:
        self.client = client
        self.keys = ModelKeys(model)

    def check_meta(self, k: int, dim: int | None) -> int | None:
        """Record ``k`` (and ``dim`` when given) or check them against what Redis holds.

        Returns the model's dimension if known (from the setting or Redis), else None.
        Raises :class:`ModelConfigError` naming the conflict when a setting differs.
        """
        key = self.keys.meta
        self.client.hsetnx(key, "k", k)
        self.client.hsetnx(key, "created_at", repr(time.time()))
        if dim is not None:
            self.client.hsetnx(key, "dim", dim)
        stored_k, stored_dim = self.client.hmget(key, ["k", "dim"])
        where = f"Redis model '{self.keys.model}' (key {key})"
        if int(stored_k) != k:
            raise ModelConfigError(
                f"NMBATCH_K={k} but {where} was created with k={int(stored_k)}: use "
                f"NMBATCH_K={int(stored_k)}, or another NMBATCH_MODEL for a new model"
            )
        if dim is not None and int(stored_dim) != dim:
            raise ModelConfigError(
                f"NMBATCH_DIM={dim} but {where} holds vectors of dimension {int(stored_dim)}: "
                f"use NMBATCH_DIM={int(stored_dim)} (or unset it), or another NMBATCH_MODEL"
            )
        snapshot = self.read_snapshot()
        if snapshot is not None and (
            snapshot.k != k or (stored_dim and snapshot.dim != int(stored_dim))
        ):
            raise ModelConfigError(
                f"{where}: its snapshot has k={snapshot.k}, dim={snapshot.dim}, which contradicts "
                f"its meta record (k={int(stored_k)}, dim={stored_dim and int(stored_dim)})"
            )
        return int(stored_dim) if stored_dim is not None else None

    def dim(self) -> int | None:
        """The model's dimension, once fixed."""
        raw = self.client.hget(self.keys.meta, "dim")
        return int(raw) if raw is not None else None

    def log_length(self) -> int:
        """Number of entries (not rows) in the sample log."""
        return int(self.client.xlen(self.keys.log))

    def read_log(self, after_id: str, max_entries: int = 256) -> list[LogChunk]:
        """Up to ``max_entries`` log entries after ``after_id`` (``"0-0"``: from the start)."""
        reply = self.client.xread({self.keys.log: after_id}, count=max_entries)
        if not reply:
            return []
        _, entries = reply[0]
        return [LogChunk(_entry_id(eid), decode_chunk(fields)) for eid, fields in entries]

    def iter_log(self, after_id: str = "0-0", max_entries: int = 256) -> Iterator[LogChunk]:
        """All log entries after ``after_id``, in order, read in pages."""
        while True:
            chunks = self.read_log(after_id, max_entries)
            yield from chunks
            if len(chunks) < max_entries:
                return
            after_id = chunks[-1].entry_id

    def read_snapshot(self) -> Snapshot | None:
        """The stored snapshot, or None."""
        fields = self.client.hgetall(self.keys.snapshot)
        return Snapshot.from_fields(fields) if fields else None

    def write_snapshot(self, snapshot: Snapshot) -> bool:
        """Store ``snapshot`` atomically unless Redis holds a version >= its version.

        Returns True when written.
        """
        key = self.keys.snapshot
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    stored = pipe.hget(key, "version")
                    if stored is not None and int(stored) >= snapshot.version:
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    pipe.hset(key, mapping=snapshot.to_fields())
                    pipe.execute()
                    return True
                except redis.WatchError:  # another writer in between: look again
                    continue


# -- asynchronous side: request handlers ---------------------------------------------------
class AsyncSampleLog:
    """What request handlers need: append samples, fix the dimension, count samples."""

    def __init__(self, client: redis.asyncio.Redis, model: str) -> None:
        self.client = client
        self.keys = ModelKeys(model)

    async def append(self, entries: list[dict[str, bytes | int]], n_rows: int) -> int:
        """Append encoded entries (:func:`encode_chunks`) in one transaction.

        Returns the total number of samples in the log afterwards.
        """
        async with self.client.pipeline(transaction=True) as pipe:
            for fields in entries:
                pipe.xadd(self.keys.log, fields)
            pipe.hincrby(self.keys.meta, "n_samples", n_rows)
            reply = await pipe.execute()
        return int(reply[-1])

    async def fix_dim(self, dim: int) -> int:
        """Set the model's dimension to ``dim`` unless already set; returns the stored one."""
        await self.client.hsetnx(self.keys.meta, "dim", dim)
        return int(await self.client.hget(self.keys.meta, "dim"))

    async def dim(self) -> int | None:
        """The model's dimension, once fixed."""
        raw = await self.client.hget(self.keys.meta, "dim")
        return int(raw) if raw is not None else None

    async def n_samples(self) -> int:
        """Total number of samples in the log."""
        raw = await self.client.hget(self.keys.meta, "n_samples")
        return int(raw) if raw is not None else 0
