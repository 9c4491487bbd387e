"""The worker's retention: log entries offered to the policy, the log kept to what it keeps.

:class:`LogRetention` stands between the sample log and the engine. Every log entry read
is offered to the model's retention policy (:mod:`nmbatch.engine.retention`, made from
``NMBATCH_RETENTION`` and its sizes) as one batch, at the entry's time (the milliseconds
of its stream id: Redis's clock when it was accepted), and the policy's answer is
carried out on the engine by the engine's streaming driver
(:func:`nmbatch.engine.hosting.offer`: ``EngineHost.feed``, retirements with their
votes taken back exactly, then the appends). Stream ids count the samples offered
since the replay began (a reservoir continues the count of its base).

Redis keeps what the model keeps, and no more than a bounded excess
(:class:`~nmbatch.service.storage.RetainedLog`):

- ``window`` and ``age``: entries whose samples have all left the model are trimmed
  (``XTRIM MINID`` of the first entry still holding a retained sample), after each
  round of reads; ``age`` also retires by Redis's clock (``TIME``) when no entry comes.
- ``reservoir``: the log grows by what was accepted since the last compaction; once that
  reaches the reservoir's size (or :data:`MIN_COMPACTION` samples, the larger), the
  retained rows (from the engine, in slot order, with their stream ids) and the policy's
  state (count and generator) are written as a new *base*, and the log entries it covers
  are trimmed, in one atomic commit. Redis then holds at most a base, a log of one
  reservoir's size and, during a compaction, the next base.
- ``all``: nothing leaves (the capacity, checked when samples are appended, bounds it).

A restart (or a new engine process) replays exactly what is retained: the base, if any,
then every log entry after it, through a new policy. Window and age replay the trimmed
log, whose first entries may still hold samples that left: the policy retires them again.

Deleted samples (:mod:`~nmbatch.service.storage.deletions`): the tombstones read before
a replay (:attr:`LogRetention.tombstones`) are carried out as the replay goes: a log
entry's tombstoned rows are forgotten (``EngineHost.forget``, then the policy's
``forget``) right after the entry is offered, so its other rows keep the stream ids they
had, and a reservoir's base is cleared of the tombstoned stream ids once loaded. The
stream id of a sample is its entry's first stream id (:meth:`LogRetention.stream_ids`,
remembered for every entry offered since the replay began) plus its row. A tombstone is
pruned once nothing can replay its row (:meth:`~nmbatch.service.storage.deletions.
Tombstones.prune`): after a trim, those of the entries trimmed (but for the entries of
a base kept from another policy); after a compaction, those of every entry the new
base covers (written without the deleted rows). A sample of an entry a base covers that
is not in the engine any more (deleted, or left the reservoir) is not deleted again:
nothing can bring it back (:meth:`LogRetention.replayable`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterator

import numpy as np
import redis

from nmbatch.engine.hosting import NO_IDS, EngineHost, offer
from nmbatch.engine.retention import ReservoirRetention, RetentionPolicy, make_retention
from nmbatch.engine.rows import SourceRows
from nmbatch.service.config import Settings
from nmbatch.service.storage.capacity import MIN_COMPACTION, REDIS_SAMPLES, plan_capacity
from nmbatch.service.storage.codec import id_key, next_id
from nmbatch.service.storage.deletions import SampleRef, Tombstones
from nmbatch.service.storage.errors import redis_oom
from nmbatch.service.storage.retained import RetainedLog
from nmbatch.service.storage.retained_base import Base

__all__ = ["MIN_COMPACTION", "REDIS_SAMPLES", "LogRetention", "retention_size"]

log = logging.getLogger(__name__)

# MIN_COMPACTION and REDIS_SAMPLES size the embedded Redis too, where the worker is not
# loaded: they live with the capacity figures.


def retention_size(
    settings: Settings, dim: int, *, memory: tuple[int, str], with_redis: bool
) -> int | None:
    """The size of the model's retention policy for dimension ``dim``: None for ``all``
    (its capacity is checked on append), ``NMBATCH_MAX_SAMPLES`` if set, else (``age``)
    the capacity derived from ``memory`` (:func:`~nmbatch.service.storage.capacity.
    plan_capacity`), so that an age window never outgrows the machine."""
    if settings.retention == "all":
        return None
    if settings.max_samples is not None:
        return settings.max_samples
    keep = (settings.keep_versions, settings.keep_versions_bytes)
    return plan_capacity(
        None, dim, settings.k, memory=memory, with_redis=with_redis, keep=keep
    ).max_samples


class LogRetention:
    """Carries a retention policy out on the engine and keeps the log in step with it.

    Parameters
    ----------
    settings : Settings
        ``retention``, ``k``, ``seed``, ``max_age_seconds``.
    max_samples : int or None
        The policy's size: the window or reservoir size, the cap of ``age`` (with no
        ``NMBATCH_MAX_SAMPLES``: the memory-derived capacity), None for ``all`` (its
        capacity is enforced where samples are appended).
    storage : RetainedLog
        The model's log and base in Redis (synchronous client).
    by_reference : bool
        The engine is fed rows by reference (the Ray engine, whose shards read them from
        Redis): a base is read by its entries' heads, and a new base is named to the
        engine (``engine.rebase``) once committed.

    Attributes
    ----------
    policy : RetentionPolicy
    weighted : bool
        True once rows with sample weights were fed to the engine (from the log or a
        base): a compaction then writes each row's weight with it.
    trimmed_entries : int
        Log entries trimmed or compacted away by this object.
    compactions : int
        Reservoir bases written by this object.
    """

    def __init__(
        self,
        settings: Settings,
        max_samples: int | None,
        storage: RetainedLog,
        *,
        by_reference: bool = False,
    ) -> None:
        self.name = settings.retention
        self.storage = storage
        self.by_reference = by_reference
        self.policy: RetentionPolicy = make_retention(
            self.name,
            n_clusters=settings.k,
            max_samples=None if self.name == "all" else max_samples,
            max_age_seconds=settings.max_age_seconds,
            seed=settings.seed,
        )
        # Groups of consecutive entries read and not trimmed: (first entry id, last entry
        # id, stream id one past the group's last sample). A group closes once it holds
        # 1/1024 of the policy's size, so about 1,024 groups cover a window, whatever the
        # entry sizes.
        self._groups: deque[tuple[str, str, int]] = deque()
        self._group_samples = max(1, (max_samples or 0) // 1024)
        self._group_start = 0  # stream id of the first sample of the last group
        self._since_base = 0  # samples offered since the reservoir's base
        self.weighted = False  # rows with sample weights were fed to the engine
        self.trimmed_entries = 0
        self.compactions = 0
        # Entry id -> (its first stream id, its rows), for every entry offered since the
        # replay began (in log order; window and age drop the trimmed ones from the front:
        # an OrderedDict, whose first item is found at once however many were dropped).
        self._firsts: OrderedDict[str, tuple[int, int]] = OrderedDict()
        # The tombstones (storage.deletions.Tombstones.read): rows by entry, stream ids.
        self.tombstones: tuple[dict[str, np.ndarray], np.ndarray] = ({}, NO_IDS)
        # Where tombstones are pruned once their entries are trimmed or compacted (the
        # worker's Tombstones; None: never pruned).
        self.deletions: Tombstones | None = None
        self.covered = "0-0"  # the last entry id the base covers ("0-0": no base)

    @property
    def trims(self) -> bool:
        """True for the policies whose log is trimmed by entry (window and age)."""
        return self.name in ("window", "age")

    # -- the engine ---------------------------------------------------------------------
    def load_base(self, engine: EngineHost) -> str:
        """Put the stored base, if any, into the engine (a new one); returns the log id
        it covers (``"0-0"`` without a base). A reservoir continues from the base's
        state; another policy takes the base's rows as samples (the retention was
        changed). A next base half written by a crashed compaction is dropped first."""
        storage = self.storage
        storage.discard_partial()
        base = storage.read_base()
        self.covered = "0-0" if base is None else base.last_id
        if base is None:
            return "0-0"
        pages: list[np.ndarray] = []
        for ids, X, weights in self._base_pages(base):
            if isinstance(self.policy, ReservoirRetention):
                pages.append(ids)
                engine.feed(X, ids, n_after=engine.store.n_samples + X.shape[0], any_order=True,
                            weights=self._weighs(weights))  # fmt: skip
            else:
                self.offer(engine, X, None, weights)
        if isinstance(self.policy, ReservoirRetention):
            slots = np.concatenate(pages) if pages else NO_IDS
            holes = np.asarray(base.policy.get("holes", []), dtype=np.int64)
            if holes.shape[0]:  # the slots deleted samples emptied, in slot order
                full = np.full(slots.shape[0] + holes.shape[0], -1, dtype=np.int64)
                full[np.setdiff1d(np.arange(full.shape[0]), holes)] = slots
                slots = full
            self.policy.load_state(base.policy, slots)
            for entry, first, n in base.policy.get("entries", []):
                self._firsts[entry] = (int(first), int(n))
            self._forget(engine, self.tombstones[1])  # deleted since the base was written
        log.info("base %d of the log: %d retained samples up to entry %s", base.generation,
                 base.n_rows, base.last_id)  # fmt: skip
        return base.last_id

    def _base_pages(
        self, base: Base
    ) -> Iterator[tuple[np.ndarray, np.ndarray | SourceRows, np.ndarray | None]]:
        """``(ids, rows, weights)`` of the base, page by page (by reference: entry by
        entry, the rows named, not read); ``weights`` None where the rows weigh 1."""
        if not self.by_reference:
            yield from self.storage.base_rows(base)
            return
        for head in self.storage.base_heads(base):
            assert head.ids is not None
            yield head.ids, head.rows, head.weights

    def _weighs(self, weights: np.ndarray | None) -> np.ndarray | None:
        """``weights``, noting that the engine now holds weighted rows (a compaction
        then stores the weights with the rows)."""
        if weights is not None:
            self.weighted = True
        return weights

    def offer(
        self,
        engine: EngineHost,
        X: np.ndarray | SourceRows,
        entry_id: str | None,
        weights: np.ndarray | None = None,
    ) -> None:
        """Offer the rows of one log entry (``(n, d)`` float32, or the
        :class:`SourceRows` naming them; ``weights``: their ``(n,)`` float64 sample
        weights, None: 1) to the policy at the entry's time and carry out its answer on
        ``engine`` (the admitted rows with their weights)."""
        now = id_key(entry_id)[0] / 1000.0 if entry_id is not None else None
        first = self.policy.n_offered
        offer(self.policy, engine, X, now, self._weighs(weights))
        if entry_id is not None:
            self._firsts[entry_id] = (first, X.shape[0])
            deleted = self.tombstones[0].get(entry_id)
            if deleted is not None:  # tombstoned rows: out again at once, ids kept
                self._forget(engine, first + deleted)
        if self.trims and entry_id is not None:
            end = self.policy.n_offered
            groups = self._groups
            if groups and groups[-1][2] - self._group_start < self._group_samples:
                groups[-1] = (groups[-1][0], entry_id, end)  # the last group is not full
            else:
                self._group_start = end - X.shape[0]
                groups.append((entry_id, entry_id, end))
        self._since_base += X.shape[0]

    def _forget(self, engine: EngineHost, ids: np.ndarray) -> np.ndarray:
        """Delete the stored samples of stream ids ``ids`` (``(m,)`` int64) from the
        engine and count them out of the policy; returns ``(m,)`` bool, which were stored."""
        if not ids.shape[0]:
            return np.zeros(0, dtype=bool)
        found = engine.forget(ids)
        self.policy.forget(ids[found])
        return found

    def forget(self, engine: EngineHost, ids: np.ndarray) -> np.ndarray:
        """:meth:`_forget` of samples whose tombstones were just written."""
        return self._forget(engine, np.asarray(ids, dtype=np.int64))

    def replayable(self, refs: list[SampleRef]) -> np.ndarray:
        """``(m,)`` bool: True where the entry of ``refs[i]`` is after the base's (a log
        entry a replay reads); False where the base covers it (its row is in the base,
        or nowhere)."""
        covered = id_key(self.covered)
        return np.asarray([id_key(ref.entry_id) > covered for ref in refs], dtype=bool)

    def stream_ids(self, refs: list[SampleRef]) -> np.ndarray:
        """The stream id of each sample of ``refs`` (``(m,)`` int64), -1 where its entry
        was not offered since the replay began (unknown, trimmed, not yet read) or it has
        no such row."""
        out = np.full(len(refs), -1, dtype=np.int64)
        for i, ref in enumerate(refs):
            first, n = self._firsts.get(ref.entry_id, (-1, 0))
            if 0 <= ref.row < n:
                out[i] = first + ref.row
        return out

    def tick(self, engine: EngineHost, now: float) -> None:
        """Retire what time alone retires (``age``, at ``now``, seconds of Redis's clock)."""
        if self.name != "age":
            return
        adm = self.policy.admit(0, now)
        if adm.retires:
            engine.feed(np.empty((0, engine.store.dim), np.float32), NO_IDS,
                        n_after=self.policy.retained, retire_before=adm.retire_before)  # fmt: skip

    # -- the log ------------------------------------------------------------------------
    def trim_point(self) -> str | None:
        """``MINID`` that trims every entry read whose samples have all left (window,
        age), or None when no entry has left since the last call."""
        if not self.trims:
            return None
        threshold = self.policy.threshold
        last = None
        while self._groups and self._groups[0][2] <= threshold:
            last = self._groups.popleft()[1]
        if last is None:
            return None
        return self._groups[0][0] if self._groups else next_id(last)

    def maintain(self, engine: EngineHost, last_id: str, lease_token: str | None) -> None:
        """After a round of reads (the last entry offered: ``last_id``): retire what time
        retires (``age``, by Redis's ``TIME``), trim the log (window, age), compact a
        reservoir when due (refused by Redis for its memory: logged, tried again later).
        Raises Redis errors, and ``LeaseLostError`` if the lease is gone."""
        if self.name == "age":
            seconds, micros = self.storage.client.time()
            self.tick(engine, seconds + micros / 1e6)
        self.trim()
        if self.compaction_due():
            try:
                self.compact(engine, last_id, lease_token)
            except redis.ResponseError as exc:
                if not redis_oom(exc):
                    raise
                log.warning("reservoir compaction refused by Redis for its memory: %s", exc)

    def trim(self) -> int:
        """Trim the log to :meth:`trim_point`; returns the entries removed."""
        min_id = self.trim_point()
        if min_id is None:
            return 0
        removed = self.storage.trim_log(min_id)
        self.trimmed_entries += removed
        if self.deletions is not None:  # the base's entries (another policy's) stay
            self.deletions.prune(min_id, above=self.covered)
        bound = id_key(min_id)
        firsts = self._firsts
        while firsts:  # the trimmed entries' ids are forgotten too (log order)
            oldest = next(iter(firsts))
            if id_key(oldest) >= bound:
                break
            firsts.popitem(last=False)
        return removed

    def _holding(self, ids: np.ndarray) -> OrderedDict[str, tuple[int, int]]:
        """The entries of :attr:`_firsts` that hold a sample of stream ids ``ids``
        (``(m,)`` int64), in log order."""
        if not self._firsts or not ids.shape[0]:
            return OrderedDict()
        entries = list(self._firsts.items())
        starts = np.asarray([first for _, (first, _) in entries], dtype=np.int64)
        ends = starts + np.asarray([n for _, (_, n) in entries], dtype=np.int64)
        at = np.searchsorted(starts, ids, side="right") - 1
        inside = (at >= 0) & (ids < ends[np.maximum(at, 0)])
        return OrderedDict(entries[i] for i in np.unique(at[inside]).tolist())

    def compaction_due(self) -> bool:
        """True when a reservoir has taken enough samples since its base to compact."""
        if not isinstance(self.policy, ReservoirRetention):
            return False
        return self._since_base >= max(int(self.policy.max_samples), MIN_COMPACTION)

    def compact(self, engine: EngineHost, last_id: str, lease_token: str | None) -> None:
        """Write the reservoir (rows of the engine, in slot order) as the new base covering
        the log up to ``last_id`` (the last entry offered), and trim what it covers."""
        assert isinstance(self.policy, ReservoirRetention)
        policy = self.policy
        filled = policy.slots[: min(policy.n_offered, int(policy.max_samples))]
        slots = filled[filled >= 0].copy()  # a deleted sample's slot is empty (-1)
        state = policy.state_dict()
        state["holes"] = np.flatnonzero(filled < 0).tolist()  # restored by load_base
        # The entries still holding a kept row, with their first stream ids: the ids of
        # the base's samples resolve to stream ids after a restart too.
        self._firsts = self._holding(slots)
        state["entries"] = [[entry, first, n] for entry, (first, n) in self._firsts.items()]
        # The rows come from the engine a pipeline trip at a time (16 MiB), never the
        # whole reservoir in one message: each copy holds the GIL the event loop needs.
        weights = engine.weights_of if self.weighted else None  # unweighted: entries as ever
        base = self.storage.compact(slots, engine.rows_of, last_id=last_id,
                                    policy=state, lease_token=lease_token,
                                    dim=engine.store.dim, weights=weights)  # fmt: skip
        if self.by_reference:  # the log entries of the reservoir's rows are gone
            rebase = engine.rebase  # type: ignore[attr-defined]  # engines fed by reference
            rebase(*self.storage.base_layout(base, slots, engine.store.dim))
        self._since_base = 0
        self.compactions += 1
        self.covered = last_id
        if self.deletions is not None:  # the base has no deleted row, the log no entry
            self.deletions.prune(next_id(last_id))
        log.info("reservoir compacted: base %d, %d samples up to entry %s", base.generation,
                 base.n_rows, last_id)  # fmt: skip
