"""A model's events in Redis: the stream ``nmbatch:{model}:events``, written and read.

The worker writes what happened to the model (:data:`EVENT_TYPES`) as entries of one
Redis stream, capped at ``NMBATCH_EVENTS_KEEP`` entries (``XADD ... MAXLEN ~``: Redis
trims whole nodes, so a few dozen more may stay) of at most :data:`EVENT_MAX_BYTES` of
data each; every process serving the model reads the same stream, so each sees every
event whichever process is the worker, and the stream id is the event's id: a reader
that names the last id it saw (``Last-Event-ID``) gets what came after it. A stream
survives a restart (Redis persists it) and is deleted with the model.

- :class:`EventWriter` (the worker thread, synchronous client): :meth:`~EventWriter.emit`
  queues an event in memory (at most :data:`PENDING_EVENTS`, the oldest dropped first),
  :meth:`~EventWriter.flush` writes the queue in one pipeline. A flush that fails
  (Redis away) keeps the queue for the next one.
- :class:`AsyncEventFeed` (the request handlers): one poll of the stream's last id per
  :data:`POLL_SECONDS` per model and process, however many readers wait
  (:meth:`~AsyncEventFeed.wait_after`), then each reader reads what it has not seen
  (:meth:`~AsyncEventFeed.read_after`, at most :data:`READ_COUNT` a call).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from typing import Any

import redis
import redis.asyncio

from nmbatch.service.storage.keys import ModelKeys

__all__ = [
    "EVENT_MAX_BYTES",
    "EVENT_TYPES",
    "ID_PATTERN",
    "PENDING_EVENTS",
    "POLL_SECONDS",
    "READ_COUNT",
    "AsyncEventFeed",
    "Event",
    "EventWriter",
]

log = logging.getLogger(__name__)

EVENT_TYPES = ("version", "doubling", "relocation", "retention", "drift")
"""``version``: a new kept version (a snapshot written); ``doubling``: the nested batch
grew; ``relocation``: clusters relocated or swapped by a step; ``retention``: samples
retired by the retention policy; ``drift``: the drift figure reached the alarm
threshold (``NMBATCH_DRIFT_ALARM``)."""
EVENT_MAX_BYTES = 1024
"""Most bytes of an event's JSON data: lists of clusters are cut to fit (their full
count is given beside them)."""
PENDING_EVENTS = 256
"""Most events the worker holds while it cannot write them (the oldest dropped first)."""
POLL_SECONDS = 0.25
"""Seconds between two reads of the stream's last id while somebody waits for events."""
READ_COUNT = 100
"""Most events one read returns (a reader catching up reads again at once)."""
ID_PATTERN = re.compile(r"^\d{1,20}-\d{1,20}$")
"""A stream id, as ``Last-Event-ID`` must give it."""

Event = tuple[str, str, str]
"""``(id, type, data)``: the stream id, one of :data:`EVENT_TYPES`, and JSON text."""


def encode(data: dict[str, Any]) -> str:
    """``data`` as compact JSON of at most :data:`EVENT_MAX_BYTES`: its longest list is
    cut in half until it fits (the caller gives the full counts beside the lists)."""
    text = json.dumps(data, separators=(",", ":"))
    while len(text) > EVENT_MAX_BYTES:
        lists = [k for k, v in data.items() if isinstance(v, list) and v]
        if not lists:
            raise ValueError(f"an event of {len(text)} bytes with no list to cut")
        longest = max(lists, key=lambda k: len(data[k]))
        data = {**data, longest: data[longest][: len(data[longest]) // 2]}
        text = json.dumps(data, separators=(",", ":"))
    return text


class EventWriter:
    """The worker's side: queue events, write them in one pipeline."""

    def __init__(self, client: redis.Redis, model: str, keep: int) -> None:
        self.client = client
        self.key = ModelKeys(model).events
        self.keep = keep
        self.pending: deque[tuple[str, str]] = deque(maxlen=PENDING_EVENTS)
        self.dropped = 0  # events dropped from a full queue

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Queue an event of type ``kind`` (one of :data:`EVENT_TYPES`) with ``data``."""
        assert kind in EVENT_TYPES, kind
        if not self.keep:
            return
        if len(self.pending) == PENDING_EVENTS:
            self.dropped += 1
        self.pending.append((kind, encode(data)))

    def flush(self) -> int:
        """Write the queued events (one pipeline); returns how many. Raises what Redis
        raises (the queue is kept then)."""
        if not self.pending:
            return 0
        batch = list(self.pending)
        with self.client.pipeline(transaction=False) as pipe:
            for kind, data in batch:
                pipe.xadd(self.key, {"type": kind, "data": data}, maxlen=self.keep,
                          approximate=True)  # fmt: skip
            pipe.execute()
        for _ in batch:
            self.pending.popleft()
        return len(batch)


class AsyncEventFeed:
    """The request side of one model's events: the stream's last id, polled once for all
    the readers of this process, and the events after a given id."""

    def __init__(self, client: redis.asyncio.Redis, model: str) -> None:
        self.client = client
        self.key = ModelKeys(model).events
        self._newest: str | None = None
        self._changed = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self.waiting = 0  # readers in wait_after

    async def last_id(self) -> str:
        """The id of the newest event (``0-0`` when there is none)."""
        entries = await self.client.xrevrange(self.key, count=1)
        return entries[0][0].decode() if entries else "0-0"

    async def read_after(self, last_id: str) -> list[Event]:
        """The events after ``last_id`` (oldest first, at most :data:`READ_COUNT`)."""
        entries = await self.client.xrange(self.key, min=f"({last_id}", count=READ_COUNT)
        return [
            (eid.decode(), fields[b"type"].decode(), fields[b"data"].decode())
            for eid, fields in entries
        ]

    async def wait_after(self, last_id: str, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for an event after ``last_id``; True if one may
        have come (read it with :meth:`read_after`)."""
        self.waiting += 1
        try:
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll())
            deadline = asyncio.get_running_loop().time() + timeout
            while self._newest is None or not _after(self._newest, last_id):
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    return False
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except TimeoutError:
                    return False
            return True
        finally:
            self.waiting -= 1

    async def _poll(self) -> None:
        """While readers wait: the stream's last id every :data:`POLL_SECONDS`, waking
        them when it changes. Redis away: tried again at the next poll."""
        while self.waiting:
            try:
                newest = await self.last_id()
            except (redis.RedisError, OSError) as exc:
                log.debug("events of %s not polled: %s", self.key, exc)
            else:
                if newest != self._newest:
                    self._newest = newest
                    changed, self._changed = self._changed, asyncio.Event()
                    changed.set()
            await asyncio.sleep(POLL_SECONDS)


def _after(a: str, b: str) -> bool:
    """Stream id ``a`` is after ``b``."""
    am, _, aseq = a.partition("-")
    bm, _, bseq = b.partition("-")
    return (int(am), int(aseq)) > (int(bm), int(bseq))
