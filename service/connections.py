"""The server process's HTTP/1.1 protocol: uvicorn's h11 protocol with connection bounds.

uvicorn bounds a request's header block (``h11_max_incomplete_event_size``) and closes
a connection idle after an answer (``timeout_keep_alive``), but gives a client all the
time it likes to *send* its headers: one byte every few seconds keeps a connection and
its buffers forever, and nothing bounds the number of connections. :func:`bounded_h11`
makes the protocol class ``python -m nmbatch`` runs (:mod:`nmbatch.service.server`):

- a connection beyond ``NMBATCH_MAX_CONNECTIONS`` open ones is closed as soon as it is
  accepted;
- a request's headers must be complete ``NMBATCH_HEADER_TIMEOUT_SECONDS`` after the
  connection opened, or after the previous answer on it; otherwise a ``408`` problem
  (when part of a request has arrived) and the connection is closed. The deadline is
  total, not idle: trickling bytes does not extend it. After a ``408`` the connection
  lingers (:data:`LINGER_SECONDS` at most): the answer is sent with a FIN and what the
  client still sends is read and dropped, since closing a socket with unread bytes makes
  the kernel answer with a reset that may destroy the ``408`` before the client reads it.

Memory per connection is then bounded by the header block (:data:`MAX_HEADER_BYTES`)
plus uvicorn's read buffer of a body (64 KiB before it stops reading), and its lifetime
without a request by the header deadline.
"""

from __future__ import annotations

import asyncio

import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from nmbatch.service.config import Settings

__all__ = ["LINGER_SECONDS", "MAX_HEADER_BYTES", "bounded_h11"]

MAX_HEADER_BYTES = 16 * 1024
"""Largest request line plus headers (h11's ``max_incomplete_event_size``); larger is 400."""

LINGER_SECONDS = 2.0
"""Longest a connection stays open after its ``408``, reading and dropping what arrives."""

_TIMEOUT_BODY = orjson.dumps(
    {
        "type": "urn:nmbatch:problem:header-timeout",
        "title": "Request Timeout",
        "status": 408,
        "detail": "the request's headers did not arrive in time (NMBATCH_HEADER_TIMEOUT_SECONDS)",
    }
)
_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/problem+json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


def bounded_h11(settings: Settings) -> type[H11Protocol]:
    """The h11 protocol class with ``settings``' connection cap and header deadline."""
    max_connections = settings.max_connections
    header_timeout = settings.header_timeout_seconds

    class BoundedH11Protocol(H11Protocol):
        """:class:`H11Protocol` plus the connection cap and the header deadline.

        One timer per connection, not one per answer: an answer moves the deadline
        (``_deadline``, loop time) and arms the timer only when none is pending; a timer
        firing before the deadline re-arms itself for the rest.
        """

        _header_timer: asyncio.TimerHandle | None = None
        _deadline = 0.0  # loop time by which the next request's headers must be in
        _armed_for: object = None  # the request cycle current when the deadline was set
        _lingering = False  # a 408 was sent: what arrives is dropped until the close

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()  # connection_lost follows and forgets it
                return
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            if not self._lingering:
                super().data_received(data)

        def on_response_complete(self) -> None:
            # Before uvicorn's: it may start a pipelined request's cycle, whose headers
            # are in (a new cycle), and that request may take longer than the deadline.
            if not self.transport.is_closing():
                self._await_headers()  # the next request's headers have a deadline too
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _await_headers(self) -> None:
            self._armed_for = self.cycle
            self._deadline = self.loop.time() + header_timeout
            if self._header_timer is None:
                self._header_timer = self.loop.call_at(self._deadline, self._headers_late)

        def _headers_late(self) -> None:
            self._header_timer = None
            # A new cycle means a request's headers arrived since the deadline was set:
            # its answer sets the next one.
            if self.cycle is not self._armed_for or self.transport.is_closing():
                return
            if self.loop.time() < self._deadline:  # moved by an answer since armed
                self._header_timer = self.loop.call_at(self._deadline, self._headers_late)
                return
            pending, _ = self.conn.trailing_data
            if not pending or not self.transport.can_write_eof():
                self.transport.close()  # nothing was asked: nothing to say
                return
            # Part of a request arrived: say why the connection ends, then linger. The
            # client's EOF closes the transport (``eof_received`` answers None).
            self.transport.write(_TIMEOUT_ANSWER)
            self.transport.write_eof()
            self._lingering = True
            self._header_timer = self.loop.call_later(LINGER_SECONDS, self.transport.abort)

    return BoundedH11Protocol
