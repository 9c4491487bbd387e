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
    WATCH/MULTI/EXEC transaction that refuses to replace a newer version (and, for the
    worker, refuses to write unless it still holds the lease below).
``nmbatch:{model}:lock`` (string, with expiry)
    The worker lease: ``{token}:{run id}:{client id}``, set with ``SET NX PX``. ``token``
    is random per process; ``run id`` (``INFO server``) and ``client id`` (``CLIENT ID``)
    name the Redis server run and the connection of the holder's lease, so a contender
    can see that the holder is gone (its connection closed: the process died; or Redis
    restarted since) before the expiry. Renewed and released by compare-and-set Lua
    scripts.

The meta hash also holds ``versions_reserved``: the highest centroid version a worker may
have shown. A worker reserves versions in blocks before publishing them (fenced by the
lease), so a worker that starts after a crash numbers its centroids above anything the
dead one served, although the last snapshot may be older. A clean stop lowers it to the
version of the last snapshot. ``versions_reserved_by`` names the lease that reserved
last: a worker whose lease merely expired (Redis frozen) takes it again only if nobody
reserved since.

:class:`AsyncSampleLog` is what request handlers use (``redis.asyncio``);
:class:`ModelRepository` is the synchronous side used by the worker thread and at
start-up; :class:`WorkerLease` is the lease.

Entries appended by this process are also handed to its worker in memory
(:class:`LocalEntries`): reading every sample back from Redis costs Redis more than
storing it (it sends a reply of many MiB in 64 KiB pieces per event-loop turn, between
the writes it serves), so a worker reading the log back falls behind a fast stream. The
log stays the one source of truth: :meth:`ModelRepository.read_log` serves a local
entry only after Redis confirms (an exclusive ``XRANGE`` of the gap, empty) that no
other entry lies between the last one consumed and it; otherwise it reads Redis as
before. Entries written by other processes, or not handed over, are read from Redis.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import redis
import redis.asyncio

__all__ = [
    "CHUNK_BYTES",
    "AsyncSampleLog",
    "LeaseLostError",
    "LocalEntries",
    "LogChunk",
    "ModelConfigError",
    "ModelKeys",
    "ModelRepository",
    "Snapshot",
    "WorkerLease",
    "decode_chunk",
    "encode_chunks",
    "redis_unavailable",
]

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
"""Largest ``float32`` payload of one log entry (a request may span several)."""


class ModelConfigError(RuntimeError):
    """A setting contradicts what Redis already holds for the model."""


class LeaseLostError(RuntimeError):
    """This process no longer holds the model's worker lease (another one took over)."""


_UNAVAILABLE_REPLIES = ("LOADING", "MISCONF", "MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "READONLY")


def redis_unavailable(exc: BaseException) -> bool:
    """True if ``exc`` means Redis cannot serve now (down, slow, loading, refusing writes).

    Such errors are worth a retry later: the service answers ``503`` with ``Retry-After``
    and the worker backs off. Other Redis errors (wrong type, script bug) are faults.
    """
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
        return True  # BusyLoadingError is a ConnectionError
    if isinstance(exc, redis.ResponseError):
        return str(exc).upper().startswith(_UNAVAILABLE_REPLIES)
    return False


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


def _id_key(entry_id: str) -> tuple[int, int]:
    """A stream id ``"<ms>-<seq>"`` as a tuple that sorts like Redis sorts ids."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class LocalEntries:
    """Log entries this process appended, kept for its worker so it need not read them back.

    Request handlers :meth:`put` the rows of each entry they appended (with the id Redis
    gave it); the worker's :meth:`ModelRepository.read_log` takes them in id order once
    Redis confirmed there is no other entry in between. Entries the worker has passed
    are dropped at each read; so are entries older than ``max_age`` seconds (a worker
    that is away or standing by) and entries beyond ``max_bytes`` (never put): the
    worker then reads them from Redis, as any entry of another process. Thread-safe.

    Parameters
    ----------
    max_bytes : int
        Most bytes of rows held.
    max_age : float
        Seconds after which an entry is dropped.
    """

    def __init__(self, max_bytes: int = 256 << 20, max_age: float = 30.0) -> None:
        self.max_bytes = int(max_bytes)
        self.max_age = float(max_age)
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, int], tuple[str, np.ndarray, float]] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of rows held."""
        return self._bytes

    def put(self, entry_ids: Sequence[str], arrays: Sequence[np.ndarray]) -> None:
        """Hold ``arrays[i]`` (``(n_i, d)`` float32, never modified) as entry ``entry_ids[i]``."""
        now = time.monotonic()
        size = sum(a.nbytes for a in arrays)
        with self._lock:
            self._drop_old(now)
            if self._bytes + size > self.max_bytes:
                return
            for entry_id, X in zip(entry_ids, arrays, strict=True):
                self._entries[_id_key(entry_id)] = (entry_id, X, now)
            self._bytes += size

    def after(self, after_id: str, limit: int) -> list[tuple[str, np.ndarray]]:
        """Up to ``limit`` held entries with ids above ``after_id``, in id order.

        Entries at or below ``after_id`` (consumed) are dropped.
        """
        floor = _id_key(after_id)
        with self._lock:
            self._drop_old(time.monotonic())
            passed = [key for key in self._entries if key <= floor]
            for key in passed:
                self._bytes -= self._entries.pop(key)[1].nbytes
            keys = sorted(self._entries)[:limit]
            return [self._entries[key][:2] for key in keys]

    def _drop_old(self, now: float) -> None:
        if not self._entries:
            return
        limit = now - self.max_age
        old = [key for key, (_, _, at) in self._entries.items() if at < limit]
        for key in old:
            self._bytes -= self._entries.pop(key)[1].nbytes


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

    def __init__(self, client: redis.Redis, model: str, local: LocalEntries | None = None) -> None:
        self.client = client
        self.keys = ModelKeys(model)
        self.local = local

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
        """Up to ``max_entries`` log entries after ``after_id`` (``"0-0"``: from the start).

        The entries come in log order, with no gap after ``after_id``: from
        :attr:`local` when Redis confirms the next ones are those, else from Redis.
        """
        if self.local is not None:
            chunks = self._read_local(after_id, max_entries)
            if chunks:
                return chunks
        reply = self.client.xread({self.keys.log: after_id}, count=max_entries)
        if not reply:
            return []
        _, entries = reply[0]
        return [LogChunk(_entry_id(eid), decode_chunk(fields)) for eid, fields in entries]

    def _read_local(self, after_id: str, max_entries: int) -> list[LogChunk]:
        """The longest run of held entries that directly follows ``after_id`` in the log.

        One round trip: for each held entry, an exclusive ``XRANGE`` from the previous one
        must be empty (nothing of another writer, nor an entry not handed over, between).
        """
        assert self.local is not None
        pending = self.local.after(after_id, max_entries)
        if not pending:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            previous = after_id
            for entry_id, _ in pending:
                pipe.xrange(self.keys.log, f"({previous}", f"({entry_id}", count=1)
                previous = entry_id
            gaps = pipe.execute()
        chunks = []
        for (entry_id, X), gap in zip(pending, gaps, strict=True):
            if gap:
                break
            chunks.append(LogChunk(entry_id, X))
        return chunks

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

    def snapshot_version(self) -> int | None:
        """Version of the stored snapshot (one field read), or None."""
        raw = self.client.hget(self.keys.snapshot, "version")
        return int(raw) if raw is not None else None

    def write_snapshot(self, snapshot: Snapshot, lease_token: str | None = None) -> bool:
        """Store ``snapshot`` atomically unless Redis holds a version >= its version.

        With ``lease_token`` (a :attr:`WorkerLease.token`), the write happens only while
        that lease is held, checked in the same transaction; otherwise
        :class:`LeaseLostError` is raised. Returns True when written.
        """
        key = self.keys.snapshot
        watched = [key] if lease_token is None else [key, self.keys.lock]
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(*watched)
                    if lease_token is not None and not _held_by(
                        pipe.get(self.keys.lock), lease_token
                    ):
                        pipe.unwatch()
                        raise LeaseLostError("the worker lease is held by another process")
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

    def reserved_versions(self) -> int:
        """``versions_reserved`` of the meta hash: no version shown so far is above it."""
        raw = self.client.hget(self.keys.meta, "versions_reserved")
        return int(raw) if raw is not None else 0

    def reserve_versions(self, lease_token: str, up_to: int) -> int:
        """Raise ``versions_reserved`` to at least ``up_to`` while holding the lease.

        Returns the reservation now stored; raises :class:`LeaseLostError` if the lease
        with ``lease_token`` is not held.
        """
        reply = self.client.eval(
            _RESERVE, 2, self.keys.lock, self.keys.meta, lease_token + ":", int(up_to)
        )
        if int(reply) < 0:
            raise LeaseLostError("the worker lease is held by another process")
        return int(reply)


# -- the worker lease ----------------------------------------------------------------------
def _held_by(value: bytes | str | None, token: str) -> bool:
    if value is None:
        return False
    text = value.decode() if isinstance(value, bytes) else value
    return text.startswith(token + ":")


# KEYS[1] lock, KEYS[2] meta; ARGV[1] "token:"; ARGV[2] wanted reservation.
_RESERVE = """
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return -1 end
local current = tonumber(redis.call('HGET', KEYS[2], 'versions_reserved') or '0')
local wanted = tonumber(ARGV[2])
if wanted > current then
  redis.call('HSET', KEYS[2], 'versions_reserved', ARGV[2])
  current = wanted
end
redis.call('HSET', KEYS[2], 'versions_reserved_by', ARGV[1])
return current
"""

# KEYS[1] lock, KEYS[2] meta; ARGV[1] "token:", ARGV[2] new value, ARGV[3] ms.
# 1: renewed; 2: had expired and is taken again, as nobody reserved versions since (so
# nobody else worked); 0: lost.
_RENEW = """
local v = redis.call('GET', KEYS[1])
if not v then
  if redis.call('HGET', KEYS[2], 'versions_reserved_by') ~= ARGV[1] then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 2
end
if string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS[1] lock; ARGV[1] value seen, ARGV[2] new value, ARGV[3] ms.
_STEAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

# KEYS[1] lock, KEYS[2] meta; ARGV[1] "token:", ARGV[2] reservation to leave ('' : keep).
_RELEASE = """
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], 'versions_reserved', ARGV[2]) end
redis.call('HDEL', KEYS[2], 'versions_reserved_by')
redis.call('DEL', KEYS[1])
return 1
"""


class WorkerLease:
    """The lease that makes one process the worker of a model (``nmbatch:{model}:lock``).

    ``SET NX PX`` with a random token, renewed before it expires, released by a
    compare-and-delete script. A contender also takes the lease over at once when the
    holder's lease connection is gone from ``CLIENT LIST`` (the holder process died;
    the kernel closed its sockets), else when it expires (host lost, process frozen).

    Parameters
    ----------
    client : redis.Redis
        Created with ``single_connection_client=True``: its ``CLIENT ID`` names the holder.
    model : str
    seconds : float
        Expiry of the lease; renew it well within (a third of it).
    """

    def __init__(self, client: redis.Redis, model: str, seconds: float) -> None:
        self.client = client
        self.keys = ModelKeys(model)
        self.token = secrets.token_hex(16)
        self.ms = max(1, round(seconds * 1000))
        self._prefix = self.token + ":"
        self._check_holder = True

    def _run_id(self) -> str:
        """The Redis server's ``run_id`` (new at every start), or "-" if INFO is refused."""
        try:
            return str(self.client.info("server")["run_id"])
        except redis.ResponseError:  # INFO refused (ACL): restarts go unnoticed
            return "-"

    def _value(self) -> str:
        return f"{self.token}:{self._run_id()}:{self.client.client_id()}"

    def holder(self) -> str | None:
        """The stored lease value, or None when nobody holds it."""
        raw = self.client.get(self.keys.lock)
        return raw.decode() if isinstance(raw, bytes) else raw

    def held(self) -> bool:
        """True if this process holds the lease now."""
        return _held_by(self.holder(), self.token)

    def acquire(self) -> bool:
        """Take the lease if free, ours already, or left by a dead holder; True if held."""
        value = self._value()
        if self.client.set(self.keys.lock, value, nx=True, px=self.ms):
            return True
        current = self.holder()
        if current is None:
            return bool(self.client.set(self.keys.lock, value, nx=True, px=self.ms))
        if current.startswith(self._prefix):
            return bool(self.client.eval(_STEAL, 1, self.keys.lock, current, value, self.ms))
        if self._holder_gone(current):
            taken = bool(self.client.eval(_STEAL, 1, self.keys.lock, current, value, self.ms))
            if taken:
                log.warning(
                    "took over the worker lease: its holder's connection (client id %s) is gone",
                    current.rpartition(":")[2],
                )
            return taken
        return False

    def _holder_gone(self, value: str) -> bool:
        """True if the holder's lease connection is not connected to Redis any more."""
        parts = value.split(":")
        if not self._check_holder or len(parts) != 3 or not parts[2].isdigit():
            return False
        run_id, client_id = parts[1], int(parts[2])
        try:
            current = self._run_id()
            if "-" not in (run_id, current) and run_id != current:
                return True  # Redis restarted since: that connection cannot be alive
            return not self.client.client_list(client_id=[client_id])
        except redis.ResponseError as exc:  # CLIENT LIST refused (ACL): wait for expiry
            log.warning("cannot look up the lease holder (%s); relying on expiry only", exc)
            self._check_holder = False
            return False

    def renew(self) -> bool:
        """Extend the lease; False if another process holds it now (we lost it).

        If it expired meanwhile (Redis was frozen or away longer than the expiry) and
        nobody else reserved versions since (``versions_reserved_by`` is still this
        lease), it is taken again.
        """
        reply = self.client.eval(
            _RENEW, 2, self.keys.lock, self.keys.meta, self._prefix, self._value(), self.ms
        )
        return int(reply) > 0

    def release(self, reserved: int | None = None) -> bool:
        """Delete the lease if held; ``reserved`` also resets ``versions_reserved``."""
        arg = "" if reserved is None else str(int(reserved))
        reply = self.client.eval(_RELEASE, 2, self.keys.lock, self.keys.meta, self._prefix, arg)
        return bool(reply)


# -- asynchronous side: request handlers ---------------------------------------------------
class AsyncSampleLog:
    """What request handlers need: append samples, fix the dimension, count samples."""

    def __init__(
        self, client: redis.asyncio.Redis, model: str, local: LocalEntries | None = None
    ) -> None:
        self.client = client
        self.keys = ModelKeys(model)
        self.local = local

    async def append(
        self,
        entries: list[dict[str, bytes | int]],
        n_rows: int,
        rows: np.ndarray | None = None,
    ) -> int:
        """Append encoded entries (:func:`encode_chunks`) in one transaction.

        ``rows``: the ``(n_rows, d)`` float32 matrix the entries encode (not modified
        afterwards); given, and with :attr:`local` set, the entries are also handed to
        the worker in memory. Returns the total number of samples in the log afterwards.
        """
        async with self.client.pipeline(transaction=True) as pipe:
            for fields in entries:
                pipe.xadd(self.keys.log, fields)
            pipe.hincrby(self.keys.meta, "n_samples", n_rows)
            reply = await pipe.execute()
        if rows is not None and self.local is not None:
            ids = [_entry_id(raw) for raw in reply[:-1]]
            parts, start = [], 0
            for fields in entries:
                n = int(fields["n"])
                parts.append(rows[start : start + n])
                start += n
            self.local.put(ids, parts)
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
