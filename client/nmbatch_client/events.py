"""A model's events (``GET /events``, Server-Sent Events): what both clients share.

:meth:`Client.events <nmbatch_client._sync.Client.events>` and
:meth:`AsyncClient.events <nmbatch_client._async.AsyncClient.events>` iterate the
events of the model as :class:`Event` objects, and reconnect when the connection drops
or the service answers "later" (``429``/``502``/``503``/``504``), with the id of the last
event seen as ``Last-Event-ID``: the service replays the events missed meanwhile (as
many as it keeps). :class:`EventParser` reads the ``text/event-stream`` lines (the
WHATWG rules: ``id``, ``event``, ``data``, ``retry``; comments are heartbeats);
:class:`Reconnect` holds the last id and the wait before the next attempt;
:class:`EventStream` is one iteration's decisions without I/O (what each attempt asks,
what an answer means, the events its lines give, the wait before the next attempt),
which each client drives with its own transport.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from nmbatch_client.operations import Call
from nmbatch_client.retry import retry_after_seconds
from nmbatch_client.session import final_answer, no_answer

__all__ = [
    "EVENTS_READ_TIMEOUT",
    "RECONNECT_STATUSES",
    "Event",
    "EventParser",
    "EventStream",
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


class EventStream:
    """One iteration of ``GET /events`` (``Client.events``, ``AsyncClient.events``)
    without its I/O: the wait before each attempt, each attempt's request, what its
    answer means, and the events of its lines.

    Parameters
    ----------
    prefix : str
        The model's path prefix (:func:`~nmbatch_client.session.model_prefix`).
    last_event_id : str or None
        Resume after that event; None: from the next one.
    reconnect : bool
        Reconnect after a dropped connection or a "later" answer; False: raise then.
    connect_timeout : float or None
        The client's connect timeout (reads wait :data:`EVENTS_READ_TIMEOUT`).
    """

    def __init__(
        self,
        prefix: str,
        last_event_id: str | None,
        reconnect: bool,
        connect_timeout: float | None,
    ) -> None:
        self.path = prefix + "/events"
        self.reconnect = reconnect
        self.timeout = httpx.Timeout(connect_timeout, read=EVENTS_READ_TIMEOUT)
        self._state = Reconnect(last_event_id)
        self._parser = EventParser()
        self._attempts = 0
        self._hint: float | None = None  # the "later" answer's Retry-After
        self._read = False  # the last attempt's answer was a stream, read without a drop

    def wait(self) -> float | None:
        """Seconds to wait before the next attempt: 0 before the first, None when there
        is no next one (not reconnecting); then the service's ``Retry-After`` or
        ``retry:`` when longer than :class:`Reconnect`'s wait."""
        self._attempts += 1
        if self._attempts == 1:
            return 0.0
        if not self.reconnect:
            return None
        return self._state.next_wait(self._parser.retry if self._read else self._hint)

    def attempt(self) -> dict[str, str]:
        """Start an attempt: its request's headers (``Last-Event-ID``: the last seen)."""
        self._hint, self._read = None, False
        return events_headers(self._state.last_id)

    def answer(self, response: httpx.Response) -> Literal["events", "later", "refused"]:
        """What an answer is: ``events`` (``200``: read its lines; the service's
        ``retry:``, if it sends one, counts for the next wait unless the stream drops),
        ``later`` (a "later" status while reconnecting: its ``Retry-After`` noted), or
        ``refused`` (read its body, then :meth:`refuse`)."""
        status = response.status_code
        if status in RECONNECT_STATUSES and self.reconnect:
            self._hint = retry_after_seconds(response.headers.get("retry-after"))
            return "later"
        if status != 200:
            return "refused"
        self._parser, self._read = EventParser(), True
        return "events"

    def refuse(self, response: httpx.Response) -> None:
        """Raise the typed error of a refused answer (its body read); a success other
        than ``200`` (no stream) raises nothing and the attempt ends without events."""
        final_answer(response, 1)

    def line(self, line: str) -> Event | None:
        """One line of the stream; the event it completes, if any (resume after it)."""
        event = self._parser.line(line)
        if event is not None:
            self._state.seen(event)
        return event

    def failed(self, exc: Exception) -> None:
        """The attempt got no answer, or its stream dropped: raise unless reconnecting."""
        self._read = False  # a dropped stream's retry: is not the next wait's
        if not self.reconnect:
            raise no_answer(Call("GET", self.path), exc, 1) from exc
