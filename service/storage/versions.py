"""The kept versions of one model in Redis: their bound, their records, and the pin.

A version is kept when it is snapshotted: :meth:`ModelRepository.write_snapshot
<nmbatch.service.storage.repository.ModelRepository.write_snapshot>` writes, in the
transaction that writes the snapshot, the same fields under
``nmbatch:{model}:version:{V}``, adds ``V`` to the sorted set
``nmbatch:{model}:versions``, and forgets the oldest versions beyond the model's bound
(:func:`plan_keep`, :func:`queue_keep`); there is no other way in. The versions
published between two snapshots (one per iteration) are served for a moment and never
kept.

The bound (:func:`~nmbatch.service.storage.capacity.versions_bound`) is the lower of
``NMBATCH_KEEP_VERSIONS`` and the versions that fit ``NMBATCH_KEEP_VERSIONS_BYTES``
(every version of a model takes the same
:func:`~nmbatch.service.storage.capacity.version_bytes`, its ``k`` and ``d`` being
fixed); how they enter the capacity plan: :mod:`nmbatch.service.storage.capacity`. The
pinned version (``nmbatch:{model}:pin``) counts in the bound and is never forgotten: the oldest
*unpinned* versions go first, so with a bound of one and a pin, no newer version is kept
until the pin is lifted. The snapshot's transaction watches the index and the pin, so a
pin set meanwhile makes it look again; the pin is set by a script that checks the
version is kept (:class:`AsyncKeptVersions`).

The request side (:class:`AsyncKeptVersions`) lists the versions, reads one (decoded
once, then held in a small cache: at most
:data:`~nmbatch.service.storage.capacity.VERSION_CACHE_ENTRIES` per model, each
rechecked against the index after :data:`VERSION_RECHECK_SECONDS`), and sets or lifts
the pin.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import redis
import redis.asyncio

from nmbatch.service.state import PublishedModel
from nmbatch.service.storage.capacity import VERSION_CACHE_ENTRIES
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.storage.snapshot import Snapshot

__all__ = [
    "SUMMARY_FIELDS",
    "VERSION_RECHECK_SECONDS",
    "AsyncKeptVersions",
    "plan_keep",
    "queue_keep",
]

VERSION_RECHECK_SECONDS = 1.0
"""A cached version is answered from memory for this long, then checked against the
index again (one ``ZSCORE``): a forgotten version is served for at most this long."""
SUMMARY_FIELDS = (
    "version", "updated_at", "energy", "n_samples", "n_ingested", "k", "dim", "batch_size",
    "iteration", "converged", "lineage_since", "matching", "origin",
)  # fmt: skip
"""The fields of a kept version that ``GET /versions`` lists (not the centroids and
counts; the lineage's ``5 k`` bytes are)."""

# Sets the pin to ARGV[1] if that version is kept. KEYS: the index, the pin.
# Returns 1 set, 0 not kept.
_PIN = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
return 1
"""


# -- the writer's side (inside the snapshot's transaction) ----------------------------------
def plan_keep(
    pipe: redis.client.Pipeline, keys: ModelKeys, version: int, bound: int
) -> tuple[bool, list[int]]:
    """What keeping ``version`` does, read in the snapshot's WATCH (the index and the pin
    must be watched): whether ``version`` is added, and the versions to forget (the
    oldest unpinned beyond ``bound``, ``version`` counted)."""
    kept = [int(v) for v in pipe.zrange(keys.versions, 0, -1)]
    raw_pin = pipe.get(keys.pin)
    pinned = int(raw_pin) if raw_pin is not None else None
    candidates = sorted({*kept, version})
    excess = len(candidates) - bound
    forget = [v for v in candidates if v != pinned][: max(0, excess)]
    added = version not in kept and version not in forget
    return added, [v for v in forget if v in kept]


def queue_keep(
    pipe: redis.client.Pipeline, keys: ModelKeys, snapshot: Snapshot, added: bool,
    forget: list[int],
) -> None:  # fmt: skip
    """Queue (after ``MULTI``) what :func:`plan_keep` decided."""
    if added:
        version = snapshot.model.version
        pipe.hset(keys.version(version), mapping=snapshot.to_fields())
        pipe.zadd(keys.versions, {str(version): version})
    if forget:
        pipe.delete(*(keys.version(v) for v in forget))
        pipe.zrem(keys.versions, *(str(v) for v in forget))


# -- the request side -----------------------------------------------------------------------
class AsyncKeptVersions:
    """One model's kept versions and pin, through the request handlers' async client.

    The decoded versions read by :meth:`model` are cached (:data:`VERSION_CACHE_ENTRIES`,
    least recently read dropped first); ``clock`` stands for ``time.monotonic`` (tests).
    """

    def __init__(
        self, client: redis.asyncio.Redis, model: str, clock: Any = time.monotonic
    ) -> None:
        self.client = client
        self.keys = ModelKeys(model)
        self.clock = clock
        self._pin = client.register_script(_PIN)
        self.missing_pin: int | None = None  # a pin whose record was missing (logged once)
        # version -> (model, monotonic time it was last found in the index)
        self._cache: OrderedDict[int, tuple[PublishedModel, float]] = OrderedDict()

    async def versions(self) -> list[int]:
        """The kept versions, oldest first."""
        return [int(v) for v in await self.client.zrange(self.keys.versions, 0, -1)]

    async def count(self) -> int:
        """How many versions are kept."""
        return int(await self.client.zcard(self.keys.versions))

    async def summaries(self) -> list[dict[str, bytes | None]]:
        """The :data:`SUMMARY_FIELDS` of every kept version, oldest first (a version
        forgotten between the two reads is left out)."""
        versions = await self.versions()
        if not versions:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for version in versions:
                pipe.hmget(self.keys.version(version), list(SUMMARY_FIELDS))
            rows = await pipe.execute()
        return [dict(zip(SUMMARY_FIELDS, row, strict=True)) for row in rows if row[0] is not None]

    async def summary(self, version: int) -> dict[str, bytes | None] | None:
        """The :data:`SUMMARY_FIELDS` of kept ``version``, or None if it is not kept."""
        row = await self.client.hmget(self.keys.version(version), list(SUMMARY_FIELDS))
        return dict(zip(SUMMARY_FIELDS, row, strict=True)) if row[0] is not None else None

    async def model(self, version: int) -> PublishedModel | None:
        """Kept version ``version`` as served, or None if it is not kept."""
        now = self.clock()
        cached = self._cache.get(version)
        if cached is not None:
            model, seen = cached
            if now - seen < VERSION_RECHECK_SECONDS:
                self._cache.move_to_end(version)
                return model
            if await self.client.zscore(self.keys.versions, str(version)) is not None:
                self._cache[version] = (model, now)
                self._cache.move_to_end(version)
                return model
            del self._cache[version]
            return None
        fields = await self.client.hgetall(self.keys.version(version))
        if not fields:
            return None
        model = Snapshot.from_fields(fields).model
        self._cache[version] = (model, now)
        while len(self._cache) > VERSION_CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return model

    async def pin(self, version: int) -> bool:
        """Pin ``version`` if it is kept (checked in the script that sets it); True if so."""
        return bool(await self._pin(keys=[self.keys.versions, self.keys.pin], args=[version]))

    async def unpin(self) -> bool:
        """Lift the pin; True if there was one."""
        return bool(await self.client.delete(self.keys.pin))

    async def pinned(self) -> int | None:
        """The pinned version, or None."""
        raw = await self.client.get(self.keys.pin)
        return int(raw) if raw is not None else None
