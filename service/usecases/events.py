"""A model's events as a stream: what ``GET /events`` sends, and the per-server bound.

The events are those the worker writes (:mod:`nmbatch.service.storage.events`): every
process serving the model reads the same Redis stream. :func:`stream` yields them from
the one after ``last_id`` (``Last-Event-ID``: the events a reader missed while away, as
many as the stream still keeps), or from the newest on when none is given, and None
after ``heartbeat`` seconds without one (the route sends a comment: proxies keep the
connection, and a reader sees the server alive). :class:`StreamSlots` bounds the
streams one server serves at once (``NMBATCH_EVENTS_MAX_CONNECTIONS``); a stream costs
a task waiting on an event and one Redis read per batch of events (the stream's last id
is polled once per model for all of them, :class:`~nmbatch.service.storage.events.
AsyncEventFeed`).

Refusals: :class:`TooManyEventStreamsError` past the bound.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from nmbatch.service.storage.events import Event
from nmbatch.service.usecases.errors import TooManyEventStreamsError
from nmbatch.service.usecases.serving import ModelHandle

__all__ = ["CLOSE_TICK", "StreamSlots", "start", "stream"]

CLOSE_TICK = 0.5  # seconds a stream waits at most between looks at StreamSlots.closing


class StreamSlots:
    """The event streams one server serves at once: ``open`` (counted by the stream
    while it runs), refused past ``limit`` (streams accepted in the same moment may pass
    it by their number until they start)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.closing = False  # the server is stopping: every stream ends at its next tick

    def close(self) -> None:
        """The server is stopping (SIGINT/SIGTERM): the open streams end within
        :data:`CLOSE_TICK` seconds, before uvicorn's graceful shutdown would cancel them."""
        self.closing = True

    def check(self) -> None:
        """:class:`TooManyEventStreamsError` if ``limit`` streams are open."""
        if self.open >= self.limit:
            raise TooManyEventStreamsError(self.limit)

    def give_back(self) -> None:
        """A stream ended."""
        self.open -= 1


async def start(handle: ModelHandle, last_id: str | None) -> str:
    """Where a stream starts: ``last_id`` if given, else the newest event's id (so a new
    reader gets what comes next). Reads Redis: a Redis error is raised before any byte
    of the answer is sent."""
    return last_id if last_id is not None else await handle.events.last_id()


async def stream(
    handle: ModelHandle, last_id: str, heartbeat: float, slots: StreamSlots
) -> AsyncIterator[Event | None]:
    """The events after ``last_id``, oldest first, until the server stops
    (``slots.closing``); None after ``heartbeat`` seconds without one. Waits in ticks of
    at most :data:`CLOSE_TICK` seconds, so a stopping server's streams end promptly."""
    feed = handle.events
    quiet = 0.0
    while not slots.closing:
        events = await feed.read_after(last_id)
        if events:
            for event in events:
                yield event
            last_id = events[-1][0]
            quiet = 0.0
            continue
        tick = min(CLOSE_TICK, max(heartbeat - quiet, 0.0))
        if await feed.wait_after(last_id, tick):
            continue
        quiet += tick
        if quiet >= heartbeat:
            quiet = 0.0
            yield None
