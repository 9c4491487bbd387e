"""Log entries by reference: their heads for the worker, their rows for the shards.

On a Ray cluster (``NMBATCH_RAY_ADDRESS``) the rows of the log do not go through the
worker to the shards. The worker learns each entry's *head* (its id, ``n``, ``d`` and,
in a base, its stream ids: :func:`read_heads`, or
:meth:`~nmbatch.service.storage.ModelRepository.read_log_heads`) and hands the engine
:class:`~nmbatch.engine.rows.SourceRows` naming the entry by ``(stream
key, entry id)``. Each shard actor reads the entries of its own partition (the ones the
coordinator sent it) with :class:`RedisRows`, from its own node, and a shard that
replaces a lost one reads the same entries again.

Entries this process appended reach its worker in memory (the hand-off of
:class:`~nmbatch.service.storage.LocalEntries`: Redis only confirms there is no gap).
Others are read whole and their rows dropped at once: Redis streams have no read of
some fields only. A server-side script that returned the heads alone was measured and
rejected: Redis builds every entry, rows included, into the script's memory, which kept
it busy about 3 ms an entry of 1 MiB against 0.3-0.4 ms to send the entry
(``benchmarks/log_read_bytes.py``), and a script blocks every other client meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import redis

from nmbatch.engine.rows import SourceRows
from nmbatch.service.storage.codec import as_str, decode_chunk, decode_weights

__all__ = ["PIPELINE_ENTRIES", "EntryHead", "RedisRows", "read_heads"]

PIPELINE_ENTRIES = 16
"""Entries a shard asks for per round trip: Redis holds the replies of a round trip in
its output buffer at once (up to 16 MiB here), not those of a whole replay."""


class EntryHead:
    """One entry's head: ``entry_id``, ``rows`` (the :class:`SourceRows` naming all its
    ``n`` rows of ``d``), in a base ``ids`` ``(n,)`` int64 (else None), and ``weights``
    ``(n,)`` float64 if the entry has any (else None: its rows weigh 1)."""

    __slots__ = ("entry_id", "ids", "rows", "weights")

    def __init__(
        self,
        key: str,
        entry_id: str,
        n: int,
        d: int,
        ids: np.ndarray | None,
        weights: np.ndarray | None = None,
    ) -> None:
        self.entry_id = entry_id
        self.rows = SourceRows.whole((key, entry_id), n, d)
        self.ids = ids
        self.weights = weights


def read_heads(
    client: redis.Redis, key: str, after: str | None, count: int, *, with_ids: bool = False
) -> list[EntryHead]:
    """Up to ``count`` heads of the entries of stream ``key`` after entry id ``after``
    (None: from the first), in order; ``with_ids``: with a base's stream ids. Raises
    ``ValueError`` for an entry without ``n`` and ``d`` (not a log or base entry) or
    whose ``ids`` do not match ``n``."""
    start = "-" if after is None else f"({after}"
    heads = []
    for raw_id, fields in client.xrange(key, start, "+", count=int(count)):
        entry_id = as_str(raw_id)
        n, d = fields.get(b"n"), fields.get(b"d")
        if n is None or d is None:
            raise ValueError(f"entry {entry_id} of {key} has no n and d fields")
        stream_ids = None
        if with_ids:
            stream_ids = np.frombuffer(fields.get(b"ids", b""), dtype="<i8").astype(np.int64)
            if stream_ids.shape[0] != int(n):
                raise ValueError(f"entry {entry_id} of {key}: {stream_ids.shape[0]} ids, n={n}")
        heads.append(EntryHead(key, entry_id, int(n), int(d), stream_ids, decode_weights(fields)))
    return heads


class RedisRows:
    """The :class:`~nmbatch.engine.rows.RowSource` of the service's Redis:
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
        """The rows of each entry ``(key, entry id)`` of ``refs``, pipelined
        :data:`PIPELINE_ENTRIES` at a time."""
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
        replies = []
        for start in range(0, len(refs), PIPELINE_ENTRIES):
            with self._client.pipeline(transaction=False) as pipe:
                for key, entry_id in refs[start : start + PIPELINE_ENTRIES]:
                    pipe.xrange(key, entry_id, entry_id, count=1)
                replies += pipe.execute()
        out = []
        for (key, entry_id), entries in zip(refs, replies, strict=True):
            if not entries:
                raise KeyError(f"entry {entry_id} of {key} is not in Redis")
            out.append(np.array(decode_chunk(entries[0][1]), dtype=np.float32))
        return out
