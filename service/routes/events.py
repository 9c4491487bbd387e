"""``GET /events``: a model's events as Server-Sent Events.

Mounted like the other per-model routers: under ``/models/{name}`` and, for the default
model, without the prefix. A read (scope ``read`` with ``NMBATCH_API_KEY_READS=true``, as
``GET /centroids``). Each event is ``id:`` (its Redis stream id), ``event:`` (its type,
one of :data:`~nmbatch.service.storage.events.EVENT_TYPES`) and ``data:`` (one line of
JSON); a comment line (``: heartbeat``) goes out after
``NMBATCH_EVENTS_HEARTBEAT_SECONDS`` without an event. ``Last-Event-ID`` (the header
every SSE client sends when it reconnects) replays the events after that id that the
model still keeps (``NMBATCH_EVENTS_KEEP``); without it the stream starts with the next
event. The admission control does not count these streams among the requests in flight
(they last); ``NMBATCH_EVENTS_MAX_CONNECTIONS`` bounds them instead (503 past it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Header, Request
from starlette.responses import StreamingResponse

from nmbatch.service.context import ModelDep
from nmbatch.service.problems import ProblemError, problem_responses
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.storage.events import ID_PATTERN
from nmbatch.service.usecases import events
from nmbatch.service.usecases.serving import ModelHandle

__all__ = ["EVENT_STREAM", "router"]

router = APIRouter(tags=["events"])

EVENT_STREAM = "text/event-stream"
EVENT_SCHEMA = {
    "type": "object",
    "description": "One event of the stream: its id, its type and its JSON data as text.",
    "properties": {"id": {"type": "string"}, "event": {"type": "string"},
                   "data": {"type": "string"}},
}  # fmt: skip


@router.get(
    "/events",
    summary="The model's events (Server-Sent Events)",
    description="A stream of `text/event-stream`: `version` (a new kept version), "
    "`doubling` (the nested batch grew), `relocation` (clusters relocated or swapped), "
    "`retention` (samples retired), `drift` (the drift figure reached NMBATCH_DRIFT_ALARM). "
    "Each has an `id`; reconnecting with `Last-Event-ID` replays those missed (as many as "
    "NMBATCH_EVENTS_KEEP keeps). A `: heartbeat` comment every "
    "NMBATCH_EVENTS_HEARTBEAT_SECONDS without events.",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_read_key)],
    response_class=StreamingResponse,
    responses={200: {"content": {EVENT_STREAM: {"schema": EVENT_SCHEMA}}}}
    | problem_responses(401, 422, 503),
)
async def get_events(
    request: Request,
    handle: ModelDep,
    last_event_id: str | None = Header(
        None, description="The id of the last event seen: the stream resumes after it."
    ),
) -> StreamingResponse:
    if last_event_id is not None and ID_PATTERN.fullmatch(last_event_id.strip()) is None:
        raise ProblemError(
            422, "invalid-last-event-id",
            f"Last-Event-ID {last_event_id[:40]!r} is not an event id (MILLISECONDS-SEQUENCE)",
        )  # fmt: skip
    slots: events.StreamSlots = request.app.state.event_streams
    slots.check()
    start = await events.start(handle, last_event_id.strip() if last_event_id else None)
    return StreamingResponse(
        _lines(handle, start, slots),
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _lines(handle: ModelHandle, start: str, slots: events.StreamSlots) -> AsyncIterator[str]:
    """The stream's text: an opening comment, then the events and heartbeats."""
    heartbeat = handle.settings.events_heartbeat_seconds
    slots.open += 1  # here, not in the route: a body never iterated never counts
    try:
        yield f": events of model {handle.name}\n\n"
        async for event in events.stream(handle, start, heartbeat, slots):
            if event is None:
                yield ": heartbeat\n\n"
            else:
                eid, kind, data = event
                yield f"id: {eid}\nevent: {kind}\ndata: {data}\n\n"
    finally:
        slots.give_back()
