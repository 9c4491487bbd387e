"""Admission control: a bound on the requests in flight and on their body bytes.

Each request may hold up to ``NMBATCH_MAX_BODY_BYTES`` of body for up to
``NMBATCH_BODY_TIMEOUT_SECONDS``, plus the parser's working memory (a small multiple of
the body, :mod:`nmbatch.service.parsing`). :class:`AdmissionControl`, a pure ASGI
middleware, bounds the sum over all requests:

- at most ``NMBATCH_MAX_CONCURRENT_REQUESTS`` requests are in flight (``/healthz`` and
  ``/readyz`` are not counted: they carry nothing and orchestrators must reach them);
  one more is answered ``503`` ``urn:nmbatch:problem:too-many-requests`` at once
  (``GET .../events`` streams are not counted either: they last, and
  ``NMBATCH_EVENTS_MAX_CONNECTIONS`` bounds them);
- the bodies in flight hold at most ``NMBATCH_MAX_INFLIGHT_BODY_BYTES`` (default: twice
  ``NMBATCH_MAX_BODY_BYTES``). A request declaring a ``Content-Length`` reserves it
  before any byte is read, and is answered ``503`` ``body-budget-exhausted`` when it
  does not fit; a body without one (chunked) is counted as it arrives, and the request
  is answered the same ``503`` (``Connection: close``) at the first chunk that does not
  fit (unless that chunk takes the body past its own limit: then the route's ``413``).
  A length above ``NMBATCH_MAX_BODY_BYTES`` reserves nothing: the route refuses it
  (``413``) without reading it. A request with neither header has no body (HTTP/1.1):
  its ``receive`` is passed on as it is (the ``GET /assign`` fast path costs no more).

- writes are shed before reads slow down: while the event loop runs more than
  ``NMBATCH_WRITE_SHED_LAG_MS`` behind (:class:`nmbatch.service.looplag.LoopLag`, the
  wait a request arriving now has) and another write is in flight, a new
  ``POST .../samples`` is answered ``503`` ``urn:nmbatch:problem:overloaded`` at once,
  its body not read (its parse and its append would take the loop from the reads),
  if a read came within the last :data:`READ_WINDOW_SECONDS` (no reader, no latency
  to keep). Reads are never shed. A lone writer is never shed for the lag: the lag is
  then not its doing.
- writes are shed, on the same reader condition, while the model's worker is behind
  by more than its hand-off holds (``handoff_short``: the rows this process appended
  and its worker has not taken, :class:`~nmbatch.service.storage.handoff.LocalEntries`).
  Past it the worker would read the next rows back from Redis, decoding MiBs while
  holding the GIL the event loop needs, and a bounded retention's log would outgrow
  its window in Redis until the store refuses writes anyway (after their bodies were
  read). Same ``503`` ``overloaded``, whether one writer or many.

All three answers are problem details with ``Retry-After`` (:data:`RETRY_AFTER_SECONDS`) and
``Connection: close`` (a body is not read to keep the connection); the request never
reaches a route, so nothing changes. What is held is released when the
request's answer is complete. Everything runs on the event loop: plain integers, no lock.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nmbatch.service.config import Settings
from nmbatch.service.looplag import LoopLag
from nmbatch.service.problems import PROBLEM_MEDIA_TYPE, ProblemError, problem_document

__all__ = ["RETRY_AFTER_SECONDS", "UNCOUNTED_PATHS", "AdmissionControl"]

RETRY_AFTER_SECONDS = 1
"""``Retry-After`` of the ``503`` answers (requests in flight finish in about that)."""
UNCOUNTED_PATHS = frozenset(("/healthz", "/readyz"))
"""Probes that are neither counted nor refused."""
READ_WINDOW_SECONDS = 1.0
"""Writes are shed only if a read came within this long: with no reader there is no
latency to keep, and writers have the loop to themselves."""


class AdmissionControl:
    """ASGI middleware refusing requests past the concurrency limit or the body budget.

    ``in_flight`` (requests), ``writes`` (``POST .../samples`` among them) and
    ``body_bytes`` (reserved body bytes) are the current totals, ``shed`` the writes
    shed so far; tests read them.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        handoff_short: Callable[[Scope, int], tuple[int, int] | None] | None = None,
    ) -> None:
        """``handoff_short(scope, incoming)``: ``(held, most)`` bytes of the hand-off of
        the model a write goes to when ``incoming`` more bytes would not fit, else None
        (:meth:`~nmbatch.service.usecases.serving.ModelHandle.handoff_short`)."""
        self.app = app
        self.handoff_short = handoff_short
        self.max_requests = settings.max_concurrent_requests
        self.max_body = settings.max_body_bytes
        self.budget = settings.inflight_body_budget
        self.shed_lag = settings.write_shed_lag_ms / 1000.0  # 0: never shed
        self.in_flight = 0
        self.writes = 0
        self.shed = 0
        self.body_bytes = 0
        self.loop_lag: LoopLag | None = None
        self.read_at = -math.inf  # time.monotonic() of the last request other than a write

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED_PATHS or _events(scope):
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_requests:
            await _answer(self._too_many(), scope, receive, send)
            return
        if scope["method"] != "POST" or not scope["path"].endswith("/samples"):
            self.read_at = time.monotonic()
            await self._admit(scope, receive, send)  # reads are never shed
            return
        lag = self._loop_lag().lag if self.shed_lag else 0.0  # measured from the first write
        if self.shed_lag and time.monotonic() - self.read_at < READ_WINDOW_SECONDS:
            problem = self._overloaded(lag) if self.writes and lag > self.shed_lag else None
            incoming = _framing(scope)[0] or 0
            # A body above its limit is the route's to refuse (413), not ours to shed.
            if problem is None and self.handoff_short and incoming <= self.max_body:
                short = self.handoff_short(scope, incoming)
                problem = None if short is None else self._behind(*short)
            if problem is not None:
                self.shed += 1
                await _answer(problem, scope, receive, send)
                return
        self.writes += 1
        try:
            await self._admit(scope, receive, send)
        finally:
            self.writes -= 1

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The body budget, then the app."""
        declared, chunked = _framing(scope)
        reserved = declared if declared is not None and declared <= self.max_body else 0
        if reserved and self.body_bytes + reserved > self.budget:
            await _answer(self._over_budget(reserved), scope, receive, send)
            return
        self.in_flight += 1
        if not chunked:  # no body, or its declared length is reserved (the common case)
            self.body_bytes += reserved
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
                self.body_bytes -= reserved
            return
        counted = 0  # bytes of a chunked body, counted as they arrive

        async def counting_receive() -> Message:
            nonlocal counted
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                # Past its own limit the body is the route's to refuse (413), not ours.
                within = counted + size <= self.max_body
                if size and within and self.body_bytes + size > self.budget:
                    raise self._over_budget(counted + size)
                self.body_bytes += size
                counted += size
            return message

        try:
            await self.app(scope, counting_receive, send)
        finally:
            self.in_flight -= 1
            self.body_bytes -= counted

    def _loop_lag(self) -> LoopLag:
        """The lag monitor of the running loop (started on the first write)."""
        loop = asyncio.get_running_loop()
        if self.loop_lag is None or self.loop_lag.loop is not loop:
            if self.loop_lag is not None:
                self.loop_lag.stop()
            self.loop_lag = LoopLag(loop).start()
        return self.loop_lag

    def _overloaded(self, lag: float) -> ProblemError:
        return ProblemError(
            503,
            "overloaded",
            f"the server runs {lag * 1000:.1f} ms behind (more than "
            f"NMBATCH_WRITE_SHED_LAG_MS, {self.shed_lag * 1000:g} ms) with {self.writes} "
            "write(s) in flight: writes are refused so that reads keep their latency; "
            "nothing was stored, retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Connection": "close"},
            lag_ms=round(lag * 1000, 1),
        )

    def _behind(self, held: int, most: int) -> ProblemError:
        return ProblemError(
            503,
            "overloaded",
            f"the model's worker is behind this server's appends by {held >> 20} MiB, what "
            f"its hand-off holds ({most >> 20} MiB): writes are refused so that reads keep "
            "their latency while it catches up; nothing was stored, retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Connection": "close"},
            behind_bytes=held,
        )

    def _too_many(self) -> ProblemError:
        return ProblemError(
            503,
            "too-many-requests",
            f"{self.in_flight} requests are in flight, the most this server takes "
            "(NMBATCH_MAX_CONCURRENT_REQUESTS); retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Connection": "close"},
            limit=self.max_requests,
        )

    def _over_budget(self, size: int) -> ProblemError:
        return ProblemError(
            503,
            "body-budget-exhausted",
            f"this body ({size} bytes so far or declared) does not fit in the bytes left of "
            f"the in-flight body budget, {self.budget} bytes (NMBATCH_MAX_INFLIGHT_BODY_BYTES, "
            f"{self.body_bytes} held by other requests); retry shortly",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Connection": "close"},
            limit=self.budget,
        )


def _events(scope: Scope) -> bool:
    """A ``GET .../events`` stream: it lasts, so it is bounded by
    ``NMBATCH_EVENTS_MAX_CONNECTIONS`` (:mod:`nmbatch.service.routes.events`), not here."""
    return scope["method"] == "GET" and (
        scope["path"] == "/events" or scope["path"].endswith("/events")
    )


def _framing(scope: Scope) -> tuple[int | None, bool]:
    """``(Content-Length, chunked)`` of the request: the declared length (None: absent or
    not a non-negative integer, which the route refuses; h11 refuses two different ones)
    and whether a ``Transfer-Encoding`` frames the body (then it is counted as it
    arrives, whatever the length says). Neither: an HTTP/1.1 request without a body."""
    declared, chunked = None, False
    for name, value in scope["headers"]:
        if name == b"content-length":
            declared = int(value) if value.isdigit() else None
        elif name == b"transfer-encoding":
            chunked = True
    return (None, True) if chunked else (declared, False)


async def _answer(problem: ProblemError, scope: Scope, receive: Receive, send: Send) -> None:
    response = Response(
        orjson.dumps(problem_document(problem)),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=problem.headers,
    )
    await response(scope, receive, send)
