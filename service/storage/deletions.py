"""Samples by id in Redis: an id resolved to its log entry and row, and the tombstones of
deleted samples.

A sample is named by the id a client sent (the id map ``nmbatch:{model}:ids``:
id -> ``"<entry id> <row>"``) or by the id the log assigned it, ``"<entry id>-<row>"``
(:func:`~nmbatch.service.storage.log.assigned_ids`), which names its entry and row
itself: :func:`parse_assigned`, :func:`resolve`.

A deleted sample leaves a *tombstone* in ``nmbatch:{model}:deleted`` (hash: field
``"<entry id> <row>"``, value the sample's stream id in the engine when it was
deleted), written by :data:`TOMBSTONE` in one script with the removal of its client id
from the id map: once the script ran, the id answers 404 and no replay ever counts the
row again. The worker consults the tombstones on every replay (:meth:`Tombstones.read`):
a log entry's tombstoned rows are deleted from the engine right after the entry is
offered (the stream ids of the other rows are those the entry had before), and a
reservoir's base is cleared of the tombstoned stream ids right after it is loaded
(a reservoir's stream ids continue across its bases). The rows' bytes stay in the log
entry until retention trims it (window, age) or a compaction drops it (reservoir); with
``all`` until the model is deleted (README, "What deleted means").

What a tombstone protects is the replay of its row: a log entry still in Redis, or a
reservoir's base written before the deletion. Once neither can hold the row any more the
tombstone is *pruned* (:meth:`Tombstones.prune`, called by the worker's retention,
:mod:`nmbatch.service.worker.retention`): ``window`` and ``age`` prune the tombstones of
the entries a trim removed (``XTRIM MINID``), a reservoir those of every entry its new
base covers (the base was written without the deleted rows, and the entries it covers
are gone). ``all`` trims nothing, so its tombstones stay as long as their entries, until
the model is deleted. A restart reads the tombstones left (a crash between a trim and its
pruning leaves some; the next trim or compaction prunes them).

Bytes: a tombstone is a hash field of about 30 bytes and a value of up to 20, about
100 bytes of Redis memory with the hash's overhead
(:data:`~nmbatch.service.storage.capacity.TOMBSTONE_BYTES`, measured 83); at most one per
sample of the retained entries. The worker keeps an index of the tombstones it may prune
(entry id and row, 24 bytes each, :meth:`Tombstones.track`) while the retention prunes.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass

import numpy as np
import redis
import redis.asyncio

from nmbatch.service.storage.codec import as_str, id_key
from nmbatch.service.storage.keys import ModelKeys

__all__ = ["TOMBSTONE", "SampleRef", "Tombstones", "parse_assigned", "resolve"]

_ASSIGNED = re.compile(r"^([0-9]+-[0-9]+)-([0-9]+)$")

TOMBSTONE = """
-- KEYS[1] tombstones (hash), KEYS[2] the id map (hash)
-- ARGV: triples (entry id .. ' ' .. row, stream id, client id or '')
-- Returns, per triple, 1 if this call tombstoned the sample, 0 if it already was.
local out = {}
for i = 1, #ARGV, 3 do
  out[#out + 1] = redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  if ARGV[i + 2] ~= '' then
    redis.call('HDEL', KEYS[2], ARGV[i + 2])
  end
end
return out
"""
"""Tombstone samples and free their client ids, all or nothing (one script)."""


@dataclass(frozen=True)
class SampleRef:
    """Where a sample is: ``row`` of log entry ``entry_id``; ``sample_id`` the client's
    id (to free on deletion), None for an assigned id."""

    entry_id: str
    row: int
    sample_id: str | None = None

    @property
    def field(self) -> str:
        """The sample's field in the tombstones: ``"<entry id> <row>"``."""
        return f"{self.entry_id} {self.row}"


def parse_assigned(sample_id: str) -> SampleRef | None:
    """The entry and row an assigned id ``"<entry id>-<row>"`` names, or None if
    ``sample_id`` is not of that form."""
    match = _ASSIGNED.match(sample_id)
    if match is None:
        return None
    return SampleRef(match.group(1), int(match.group(2)))


async def resolve(
    client: redis.asyncio.Redis, keys: ModelKeys, sample_ids: list[str]
) -> list[SampleRef | None]:
    """Each id's :class:`SampleRef`, or None for a client id not in the id map (never
    stored, or deleted). Assigned ids are parsed, not looked up: whether their sample
    exists is the worker's to say. One ``HMGET`` for the client ids."""
    refs: list[SampleRef | None] = [parse_assigned(i) for i in sample_ids]
    named = [i for i, ref in zip(sample_ids, refs, strict=True) if ref is None]
    if not named:
        return refs
    values = iter(await client.hmget(keys.sample_ids, named))
    for n, ref in enumerate(refs):
        if ref is None:
            raw = next(values)
            if raw is not None:
                entry, _, row = as_str(raw).partition(" ")
                refs[n] = SampleRef(entry, int(row), sample_ids[n])
    return refs


class Tombstones:
    """The worker's side: write tombstones, read them back for a replay.

    Parameters
    ----------
    client : redis.Redis
        Synchronous, returning bytes.
    keys : ModelKeys
    """

    _PRUNE_BATCH = 10_000  # fields per HDEL

    def __init__(self, client: redis.Redis, keys: ModelKeys) -> None:
        self.client = client
        self.keys = keys
        self._script = client.register_script(TOMBSTONE)
        self.tracking = False  # keep the index of prunable tombstones (set by the worker)
        # The index: each tracked tombstone's entry id (ms, seq) and row, in three arrays.
        self._ms, self._seq, self._row = array("q"), array("Q"), array("q")
        self.pruned = 0  # tombstones pruned by this object

    def track(self, entry_ids: list[str], rows: list[int]) -> None:
        """Add tombstones (of ``rows[i]`` of entry ``entry_ids[i]``) to the index of the
        ones :meth:`prune` may delete; nothing unless :attr:`tracking`."""
        if not self.tracking:
            return
        for entry, row in zip(entry_ids, rows, strict=True):
            ms, seq = id_key(entry)
            self._ms.append(ms)
            self._seq.append(seq)
            self._row.append(int(row))

    @property
    def tracked(self) -> int:
        """Tombstones in the index."""
        return len(self._ms)

    def prune(self, below: str, above: str | None = None) -> int:
        """Delete the tracked tombstones of the entries with ids below ``below`` (and
        above ``above``, if given): entries no replay reads any more. Returns how many
        were deleted; the index forgets them only once Redis did."""
        if not self._ms:
            return 0
        ms = np.frombuffer(self._ms, dtype=np.int64)
        seq = np.frombuffer(self._seq, dtype=np.uint64)
        b_ms, b_seq = id_key(below)
        out = (ms < b_ms) | ((ms == b_ms) & (seq < np.uint64(b_seq)))
        if above is not None:
            a_ms, a_seq = id_key(above)
            out &= (ms > a_ms) | ((ms == a_ms) & (seq > np.uint64(a_seq)))
        chosen = np.flatnonzero(out)
        if not chosen.shape[0]:
            return 0
        rows = np.frombuffer(self._row, dtype=np.int64)
        parts = zip(ms[chosen].tolist(), seq[chosen].tolist(), rows[chosen].tolist(), strict=True)
        fields = [f"{m}-{q} {r}" for m, q, r in parts]
        for start in range(0, len(fields), self._PRUNE_BATCH):
            self.client.hdel(self.keys.deleted, *fields[start : start + self._PRUNE_BATCH])
        keep = ~out
        self._ms = array("q", ms[keep].tobytes())
        self._seq = array("Q", seq[keep].tobytes())
        self._row = array("q", rows[keep].tobytes())
        self.pruned += len(fields)
        return len(fields)

    def write(self, refs: list[SampleRef], stream_ids: np.ndarray) -> np.ndarray:
        """Tombstone ``refs`` (their stream ids ``(m,)`` int64) and free their client ids;
        returns ``(m,)`` bool: True where this call tombstoned the sample."""
        if not refs:
            return np.zeros(0, dtype=bool)
        args: list[str | int] = []
        for ref, stream_id in zip(refs, stream_ids.tolist(), strict=True):
            args += [ref.field, int(stream_id), ref.sample_id or ""]
        reply = self._script(keys=[self.keys.deleted, self.keys.sample_ids], args=args)
        fresh = np.asarray([int(r) for r in reply], dtype=bool)
        written = [refs[i] for i in np.flatnonzero(fresh).tolist()]
        self.track([ref.entry_id for ref in written], [ref.row for ref in written])
        return fresh

    def read(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Every tombstone: the rows of each entry (entry id -> ``(r,)`` int64, sorted)
        and all the stream ids ``(t,)`` int64. The index (:meth:`track`) is made anew
        from them."""
        rows: dict[str, list[int]] = {}
        stream_ids = []
        for field, value in self.client.hscan_iter(self.keys.deleted, count=1000):
            entry, _, row = as_str(field).partition(" ")
            rows.setdefault(entry, []).append(int(row))
            stream_ids.append(int(value))
        by_entry = {entry: np.sort(np.asarray(r, dtype=np.int64)) for entry, r in rows.items()}
        self._ms, self._seq, self._row = array("q"), array("Q"), array("q")
        for entry, r in by_entry.items():
            self.track([entry] * r.shape[0], r.tolist())
        return by_entry, np.asarray(stream_ids, dtype=np.int64)

    def exists(self, ref: SampleRef) -> bool:
        """True if ``ref``'s sample was deleted."""
        return bool(self.client.hexists(self.keys.deleted, ref.field))
