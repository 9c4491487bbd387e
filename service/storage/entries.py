"""Log entries by reference: their heads for the worker, their rows for the shards.

On a Ray cluster (``NMBATCH_RAY_ADDRESS``) the rows of the log do not pass through the
worker. The worker reads only each entry's *head* (its id, ``n``, ``d`` and, in a base,
its stream ids; :func:`read_heads`, one script per page that leaves the rows in Redis)
and hands the engine :class:`~nmbatch.engine.distributed.source.SourceRows` naming the
entry by ``(stream key, entry id)``. Each shard actor reads the entries of its own
partition (the ones the coordinator sent it) with :class:`RedisRows`, from its own
node, and a shard that replaces a lost one reads the same entries again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis

from nmbatch.engine.distributed.source import SourceRows
from nmbatch.service.storage.codec import as_str, decode_chunk

__all__ = ["HEADS", "EntryHead", "RedisRows", "read_heads"]

HEADS = """
-- KEYS[1] a stream of entries (the log, a base); ARGV[1] XRANGE start ('-', '(<id>'),
-- ARGV[2] most entries, ARGV[3] '1': also the field 'ids' (a base's stream ids).
-- Per entry: {id, n, d, ids or false}; the rows (field x) stay in Redis.
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
local out = {}
for i, entry in ipairs(entries) do
  local f = entry[2]
  local n, d, ids = false, false, false
  for j = 1, #f, 2 do
    if f[j] == 'n' then n = f[j + 1]
    elseif f[j] == 'd' then d = f[j + 1]
    elseif f[j] == 'ids' and ARGV[3] == '1' then ids = f[j + 1] end
  end
  out[i] = {entry[1], n, d, ids}
end
return out
"""


class EntryHead:
    """One entry's head: ``entry_id``, ``rows`` (the :class:`SourceRows` naming all its
    ``n`` rows of ``d``) and, in a base, ``ids`` ``(n,)`` int64 (else None)."""

    __slots__ = ("entry_id", "ids", "rows")

    def __init__(self, key: str, entry_id: str, n: int, d: int, ids: np.ndarray | None) -> None:
        self.entry_id = entry_id
        self.rows = SourceRows.whole((key, entry_id), n, d)
        self.ids = ids


def read_heads(
    client: redis.Redis, key: str, after: str | None, count: int, *, with_ids: bool = False
) -> list[EntryHead]:
    """Up to ``count`` heads of the entries of stream ``key`` after entry id ``after``
    (None: from the first), in order. Raises ``ValueError`` for an entry without ``n``
    and ``d`` (not a log or base entry) or whose ``ids`` do not match ``n``."""
    start = "-" if after is None else f"({after}"
    reply = client.eval(HEADS, 1, key, start, int(count), "1" if with_ids else "0")
    heads = []
    for raw_id, n, d, ids in reply:
        entry_id = as_str(raw_id)
        if n is None or d is None:
            raise ValueError(f"entry {entry_id} of {key} has no n and d fields")
        stream_ids = None
        if with_ids:
            stream_ids = np.frombuffer(ids or b"", dtype="<i8").astype(np.int64)
            if stream_ids.shape[0] != int(n):
                raise ValueError(f"entry {entry_id} of {key}: {stream_ids.shape[0]} ids, n={n}")
        heads.append(EntryHead(key, entry_id, int(n), int(d), stream_ids))
    return heads


class RedisRows:
    """The :class:`~nmbatch.engine.distributed.source.RowSource` of the service's Redis:
    a reference is ``(stream key, entry id)``, its array the entry's rows ``(n, d)``
    float32.

    Picklable (it carries the URL, and connects on first use in each process). A read
    retries while Redis is unreachable, for up to ``retry_seconds``, then raises; an
    entry that is not there raises ``KeyError`` (the caller holds no row it cannot read).
    """

    def __init__(self, url: str, *, retry_seconds: float = 30.0) -> None:
        self.url = url
        self.retry_seconds = float(retry_seconds)
        self._client: redis.Redis | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "retry_seconds": self.retry_seconds}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], retry_seconds=state["retry_seconds"])  # type: ignore[misc]

    def read(self, refs: Sequence[tuple[str, str]]) -> list[np.ndarray]:
        """The rows of each entry ``(key, entry id)`` of ``refs``, one pipeline."""
        deadline = time.monotonic() + self.retry_seconds
        pause = 0.05
        while True:
            try:
                return self._read(refs)
            except (redis.ConnectionError, redis.TimeoutError):
                self._client = None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                time.sleep(min(pause, remaining))
                pause = min(2 * pause, 1.0)

    def _read(self, refs: Sequence[tuple[str, str]]) -> list[np.ndarray]:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url, socket_timeout=30.0)
        with self._client.pipeline(transaction=False) as pipe:
            for key, entry_id in refs:
                pipe.xrange(key, entry_id, entry_id, count=1)
            replies = pipe.execute()
        out = []
        for (key, entry_id), entries in zip(refs, replies, strict=True):
            if not entries:
                raise KeyError(f"entry {entry_id} of {key} is not in Redis")
            out.append(np.array(decode_chunk(entries[0][1]), dtype=np.float32))
        return out
