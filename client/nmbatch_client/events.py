"""A model's events (``GET /events``, Server-Sent Events): what both clients share.

:meth:`Client.events <nmbatch_client._sync.Client.events>` and
:meth:`AsyncClient.events <nmbatch_client._async.AsyncClient.events>` iterate the
events of the model as :class:`Event` objects, and reconnect when the connection drops
or the service answers "later" (``429``/``502``/``503``/``504``), with the id of the last
event seen as ``Last-Event-ID``: the service replays the events missed meanwhile (as
many as it keeps). :class:`EventParser` reads the ``text/event-stream`` lines (the
WHATWG rules: ``id``, ``event``, ``data``, ``retry``; comments are heartbeats);
:class:`Reconnect` holds the last id and the wait before the next attempt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EVENTS_READ_TIMEOUT",
    "RECONNECT_STATUSES",
    "Event",
    "EventParser",
    "Reconnect",
    "events_headers",
]

EVENTS_READ_TIMEOUT = 60.0
"""Seconds without a byte before a stream counts as dropped (the service sends a
heartbeat every ``NMBATCH_EVENTS_HEARTBEAT_SECONDS``, 15 by default)."""
RECONNECT_STATUSES = frozenset((429, 502, 503, 504))
"""Answers after which :meth:`Client.events` reconnects (later) rather than raising."""


@dataclass(frozen=True)
class Event:
    """One event of a model.

    Attributes
    ----------
    id : str or None
        Its id (``Last-Event-ID`` resumes after it).
    type : str
        ``version``, ``doubling``, ``relocation``, ``retention`` or ``drift``
        (docs/api.md, "Events").
    data : Any
        Its data, decoded from JSON (the text itself if it is not JSON).
    """

    id: str | None
    type: str
    data: Any


class EventParser:
    """Lines of a ``text/event-stream`` in, :class:`Event` objects out."""

    def __init__(self) -> None:
        self.retry: float | None = None  # the stream's `retry:` in seconds, if it sent one
        self._id: str | None = None
        self._type = ""
        self._data: list[str] = []

    def line(self, line: str) -> Event | None:
        """Take one line (without its end); returns the event a blank line completes."""
        if not line:
            if not self._data:
                self._type = ""
                return None
            text = "\n".join(self._data)
            try:
                data: Any = json.loads(text)
            except ValueError:
                data = text
            event = Event(self._id, self._type or "message", data)
            self._type, self._data = "", []
            return event
        if line.startswith(":"):
            return None  # a comment: the heartbeat
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._type = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry = int(value) / 1000.0
        return None


class Reconnect:
    """Where a stream resumes and how long to wait before it does: ``last_id`` (the last
    event seen), a wait doubling from ``delay`` to ``max_delay`` while attempts fail,
    back to ``delay`` once an event arrives; the service's ``retry:`` or ``Retry-After``
    when longer."""

    def __init__(self, last_id: str | None, delay: float = 0.5, max_delay: float = 30.0) -> None:
        self.last_id = last_id
        self.delay, self.max_delay = delay, max_delay
        self._wait = delay

    def seen(self, event: Event) -> None:
        """An event arrived: resume after it; the next wait is the shortest again."""
        if event.id is not None:
            self.last_id = event.id
        self._wait = self.delay

    def next_wait(self, hint: float | None = None) -> float:
        """Seconds to wait before the next attempt (``hint``: the service's)."""
        wait = max(self._wait, hint or 0.0)
        self._wait = min(self.max_delay, self._wait * 2)
        return wait


def events_headers(last_id: str | None) -> dict[str, str]:
    """The headers of a ``GET /events``: the media type, and where to resume."""
    headers = {"accept": "text/event-stream", "cache-control": "no-cache"}
    if last_id is not None:
        headers["last-event-id"] = last_id
    return headers
