"""The retained samples of a model read back from Redis, chunk by chunk (``POST /sweep``).

The retained set is the rows of the committed base (if a compaction made one,
:mod:`~nmbatch.service.storage.retained`) followed by the log's entries after the base's
``base_last_id``; with retention ``all`` and no compaction, the whole log. The log may
also hold entries a retention has retired but not yet trimmed (a window's oldest entry,
until the worker's next trim): a reader sees them too. Pages of :data:`PAGE_ENTRIES`
entries (at most 1 MiB of rows each) are read through the request handlers' async
client, so a reader holds one page at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import redis.asyncio

from nmbatch.service.storage.codec import as_str, decode_chunk
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.storage.retained_base import BaseChangedError

__all__ = ["PAGE_ENTRIES", "retained_chunks"]

PAGE_ENTRIES = 4
"""Entries read per round trip (as the worker's log pages)."""


async def _pages(
    client: redis.asyncio.Redis, key: str, start: str
) -> AsyncIterator[tuple[str, np.ndarray]]:
    """``(entry id, rows)`` of the stream ``key`` from ``start`` (an id, ``(id`` or ``-``)."""
    while True:
        entries = await client.xrange(key, start, "+", count=PAGE_ENTRIES)
        for entry_id, fields in entries:
            yield as_str(entry_id), decode_chunk(fields)
        if len(entries) < PAGE_ENTRIES:
            return
        start = "(" + as_str(entries[-1][0])


async def retained_chunks(
    client: redis.asyncio.Redis, keys: ModelKeys
) -> AsyncIterator[np.ndarray]:
    """The rows of model ``keys``'s retained samples, ``(n, d)`` float32 per entry
    (read-only views), base first, then the log. Raises :class:`BaseChangedError` if a
    compaction replaced the base while it was read (read again then)."""
    generation, last_id, n_rows = await client.hmget(
        keys.meta, ["base_generation", "base_last_id", "base_rows"]
    )
    start = "-"
    if generation is not None:
        seen = 0
        async for _, X in _pages(client, keys.base(int(generation)), "-"):
            seen += X.shape[0]
            yield X
        if seen != int(n_rows):
            raise BaseChangedError(f"base generation {int(generation)} gave {seen} rows, "
                                   f"not {int(n_rows)}: replaced while read")  # fmt: skip
        start = "(" + as_str(last_id)
    async for _, X in _pages(client, keys.log, start):
        yield X
