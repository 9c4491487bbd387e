"""Synchronous access to one model's keys: start-up checks, log reading, snapshots.

Used at start-up and by the worker thread (``redis.Redis``); the request handlers'
side is :mod:`service.storage.log`.
"""

from __future__ import annotations

import time

import numpy as np
import redis

from nmbatch.engine.rows import SourceRows
from nmbatch.service.storage.codec import LogChunk, as_str, decode_entry
from nmbatch.service.storage.errors import LeaseLostError, ModelConfigError
from nmbatch.service.storage.handoff import LocalEntries
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.storage.lease import held_by, reserve_versions, reserved_versions
from nmbatch.service.storage.seed import decode_seed, encode_seed
from nmbatch.service.storage.snapshot import Snapshot
from nmbatch.service.storage.versions import plan_keep, queue_keep

__all__ = ["ModelRepository"]


class ModelRepository:
    """Synchronous access to one model's keys (start-up checks, log reading, snapshots).

    Used from one thread at a time (the worker); ``client`` must return bytes
    (``decode_responses=False``).
    """

    def __init__(self, client: redis.Redis, model: str, local: LocalEntries | None = None) -> None:
        self.client = client
        self.keys = ModelKeys(model)
        self.local = local

    def check_meta(self, k: int, dim: int | None, metric: str = "euclidean") -> int | None:
        """Record ``k`` and ``metric`` (and ``dim`` when given) or check them against what
        Redis holds.

        A new model's ``k``, ``metric`` and creation time are written in one transaction,
        so whoever sees its ``k`` sees its metric; a model recorded before the metric
        existed has none and is Euclidean (its log holds the rows as they came). Returns the
        model's dimension if known (from the setting or Redis), else None. Raises
        :class:`ModelConfigError` naming the conflict when a setting differs; a ``k``
        that a re-clustering set (``reclustered_at`` in the meta) is the model's whatever
        ``k`` says (:meth:`reclustered_k`).
        """
        key = self.keys.meta
        if not self.client.hexists(key, "k"):
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hsetnx(key, "k", k)
                pipe.hsetnx(key, "metric", metric)
                pipe.hsetnx(key, "created_at", repr(time.time()))
                pipe.execute()
        if dim is not None:
            self.client.hsetnx(key, "dim", dim)
        stored_k, stored_dim, stored_metric, reclustered = self.client.hmget(
            key, ["k", "dim", "metric", "reclustered_at"]
        )
        stored_metric = as_str(stored_metric) if stored_metric is not None else "euclidean"
        where = f"Redis model '{self.keys.model}' (key {key})"
        if reclustered is not None:
            k = int(stored_k)  # a re-clustering chose it: the setting's k no longer applies
        if int(stored_k) != k:
            raise ModelConfigError(
                f"NMBATCH_K={k} but {where} was created with k={int(stored_k)}: use "
                f"NMBATCH_K={int(stored_k)}, or another NMBATCH_MODEL for a new model"
            )
        if stored_metric != metric:
            raise ModelConfigError(
                f"NMBATCH_METRIC={metric} but {where} was created with metric={stored_metric}: "
                f"use NMBATCH_METRIC={stored_metric}, or another NMBATCH_MODEL for a new model"
            )
        if dim is not None and int(stored_dim) != dim:
            raise ModelConfigError(
                f"NMBATCH_DIM={dim} but {where} holds vectors of dimension {int(stored_dim)}: "
                f"use NMBATCH_DIM={int(stored_dim)} (or unset it), or another NMBATCH_MODEL"
            )
        snapshot = self.read_snapshot()
        state = snapshot.model.state if snapshot is not None else None
        if state is not None and (state.k != k or (stored_dim and state.dim != int(stored_dim))):
            raise ModelConfigError(
                f"{where}: its snapshot has k={state.k}, dim={state.dim}, which contradicts "
                f"its meta record (k={int(stored_k)}, dim={stored_dim and int(stored_dim)})"
            )
        return int(stored_dim) if stored_dim is not None else None

    def reclustered_k(self) -> int | None:
        """The model's ``k`` if a re-clustering set it (it then overrides the setting's),
        else None."""
        k, reclustered = self.client.hmget(self.keys.meta, ["k", "reclustered_at"])
        return int(k) if reclustered is not None and k is not None else None

    def read_seed(self) -> np.ndarray | None:
        """The centroids the model was seeded with (``(k, d)`` float32), or None."""
        return decode_seed(self.client.hgetall(self.keys.seed))

    def keep_seed(self, centroids: np.ndarray) -> np.ndarray:
        """Keep ``centroids`` as the model's seed unless it has one; returns the one kept
        (``centroids``, or the seed Redis held)."""
        fields = encode_seed(centroids)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self.keys.seed, "x", fields["x"])
            pipe.hsetnx(self.keys.seed, "k", fields["k"])
            pipe.hsetnx(self.keys.seed, "dim", fields["dim"])
            pipe.execute()
        kept = self.read_seed()
        return kept if kept is not None else centroids

    def dim(self) -> int | None:
        """The model's dimension, once fixed."""
        raw = self.client.hget(self.keys.meta, "dim")
        return int(raw) if raw is not None else None

    def n_samples(self) -> int:
        """Samples ever accepted into the log (the meta's ``n_samples``)."""
        raw = self.client.hget(self.keys.meta, "n_samples")
        return int(raw) if raw is not None else 0

    def read_log_heads(self, after_id: str, max_entries: int = 256) -> list[LogChunk]:
        """:meth:`read_log` by reference: each chunk's ``X`` is the
        :class:`~nmbatch.engine.rows.SourceRows` naming the entry's rows in
        the log (:mod:`~nmbatch.service.storage.entries`), the rows read dropped (their
        weights kept: the engine refuses them, rather than count the rows as 1)."""
        log = self.keys.log
        return [
            LogChunk(c.entry_id, SourceRows.whole((log, c.entry_id), c.X.shape[0], c.X.shape[1]),
                     c.weights)
            for c in self.read_log(after_id, max_entries)
        ]  # fmt: skip

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
        return [decode_entry(eid, fields) for eid, fields in entries]

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
            for entry_id, _, _ in pending:
                pipe.xrange(self.keys.log, f"({previous}", f"({entry_id}", count=1)
                previous = entry_id
            gaps = pipe.execute()
        chunks = []
        for (entry_id, X, weights), gap in zip(pending, gaps, strict=True):
            if gap:
                break
            chunks.append(LogChunk(entry_id, X, weights))
        return chunks

    def read_snapshot(self) -> Snapshot | None:
        """The stored snapshot, or None."""
        fields = self.client.hgetall(self.keys.snapshot)
        return Snapshot.from_fields(fields) if fields else None

    def snapshot_version(self) -> int | None:
        """Version of the stored snapshot (one field read), or None."""
        raw = self.client.hget(self.keys.snapshot, "version")
        return int(raw) if raw is not None else None

    def write_snapshot(
        self, snapshot: Snapshot, lease_token: str | None = None, keep: int = 0
    ) -> bool:
        """Store ``snapshot`` atomically unless Redis holds a version >= its version.

        With ``lease_token`` (a :attr:`WorkerLease.token`), the write happens only while
        that lease is held, checked in the same transaction; otherwise
        :class:`LeaseLostError` is raised. In the same transaction the version is kept,
        and the oldest unpinned versions beyond ``keep`` forgotten
        (:mod:`~nmbatch.service.storage.versions`). Returns True when written; False
        when Redis holds a newer snapshot, or the model's ``k`` is no longer the
        snapshot's (re-clustered meanwhile: the script that changes ``k`` deletes the
        snapshot, so the watch sees it).
        """
        key = self.keys.snapshot
        watched = [key, self.keys.versions, self.keys.pin]
        if lease_token is not None:
            watched.append(self.keys.lock)
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(*watched)
                    if lease_token is not None and not held_by(
                        pipe.get(self.keys.lock), lease_token
                    ):
                        pipe.unwatch()
                        raise LeaseLostError("the worker lease is held by another process")
                    stored = pipe.hget(key, "version")
                    model_k = pipe.hget(self.keys.meta, "k")
                    if (stored is not None and int(stored) >= snapshot.model.version) or (
                        model_k is not None and int(model_k) != snapshot.model.state.k
                    ):
                        pipe.unwatch()
                        return False
                    added, forget = plan_keep(pipe, self.keys, snapshot.model.version, keep)
                    pipe.multi()
                    pipe.hset(key, mapping=snapshot.to_fields())
                    queue_keep(pipe, self.keys, snapshot, added, forget)
                    pipe.execute()
                    return True
                except redis.WatchError:  # another writer in between: look again
                    continue

    def reserved_versions(self) -> int:
        """:func:`service.storage.lease.reserved_versions` of this model."""
        return reserved_versions(self.client, self.keys)

    def reserve_versions(self, lease_token: str, up_to: int) -> int:
        """:func:`service.storage.lease.reserve_versions` of this model (fenced by the lease)."""
        return reserve_versions(self.client, self.keys, lease_token, up_to)
