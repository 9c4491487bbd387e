"""The service's log lines: text, or one JSON object per line (``NMBATCH_LOG_FORMAT=json``).

Two context variables say what a line is about:

- :data:`REQUEST_ID`: the HTTP request being served. :class:`RequestContext` (the app's
  outermost middleware) takes the request's ``X-Request-ID`` when it is a short token
  (:data:`_VALID_ID`), else makes one (32 hex digits), and sends it back in the answer's
  ``X-Request-ID`` header;
- :data:`MODEL`: the model the line is about. For a request, the ``{name}`` of a
  ``/models/{name}/...`` path, or the default model (``NMBATCH_MODEL``) on its routes
  without the prefix (``/samples``, ``/assign`` ...); none on the service's own routes
  (``/healthz``, ``/metrics``, ``/models``). A worker's threads set it for themselves
  (:func:`bind_model`).

:class:`JsonFormatter` writes both beside the time, level, logger and message; uvicorn's
access lines also get their method, path, status and client as fields.
:func:`configure_logging` installs the format chosen at start-up.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the worker's threads import this module too: no HTTP package at run time
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "MODEL",
    "REQUEST_ID",
    "REQUEST_ID_HEADER",
    "TEXT_FORMAT",
    "JsonFormatter",
    "RequestContext",
    "about_model",
    "bind_model",
    "configure_logging",
    "request_id_of",
]

REQUEST_ID: ContextVar[str | None] = ContextVar("nmbatch_request_id", default=None)
"""Id of the HTTP request being served (None outside a request)."""
MODEL: ContextVar[str | None] = ContextVar("nmbatch_model", default=None)
"""Name of the model the current request or worker thread is about (None: no model)."""

REQUEST_ID_HEADER = b"x-request-id"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Format of the text log lines (the default)."""

# A request id taken from the client: a short token that cannot break a log line or a
# header (no spaces, quotes or control characters); anything else is replaced.
_VALID_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
_ID_PREFIX = os.urandom(8).hex()  # 16 hex digits, random per process
_ID_COUNTER = itertools.count()  # next() is atomic under the GIL


@contextmanager
def about_model(model: str) -> Iterator[None]:
    """Mark the block's log lines as about ``model`` (then back to what they were)."""
    token = MODEL.set(model)
    try:
        yield
    finally:
        MODEL.reset(token)


def bind_model(model: str) -> None:
    """Mark the calling thread's log lines as about ``model`` (call first in a thread:
    a new thread starts with no context variable set)."""
    MODEL.set(model)


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The request's own ``X-Request-ID`` if it is a valid token, else a new id: 32 hex
    digits, the process's random prefix and a count (no system call per request)."""
    for name, value in headers:
        if name == REQUEST_ID_HEADER:
            if _VALID_ID.fullmatch(value):
                return value.decode("ascii")
            break
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line.

    Members: ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``,
    ``message``, ``request_id`` and ``model`` (null outside a request or a model's
    thread), ``trace_id`` and ``span_id`` inside an OpenTelemetry span
    (:mod:`nmbatch.service.tracing`), ``exception`` (the traceback, when the record has
    one); uvicorn's access lines add ``client``, ``method``, ``path``,
    ``http_version`` and ``status``.
    """

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.gmtime(record.created)
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", seconds)
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": REQUEST_ID.get(),
            "model": MODEL.get(),
        }
        trace = sys.modules.get("opentelemetry.trace")  # loaded only with NMBATCH_TRACING
        if trace is not None:
            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                entry["trace_id"] = format(context.trace_id, "032x")
                entry["span_id"] = format(context.span_id, "016x")
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            client, method, path, http_version, status = args
            entry.update(
                client=client, method=method, path=path, http_version=http_version,
                status=status,
            )  # fmt: skip
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(log_format: Literal["text", "json"], level: str) -> dict[str, Any] | None:
    """Send the root logger's records to stderr in ``log_format`` at ``level``.

    Returns the ``log_config`` to give uvicorn: None for ``json`` (its loggers then
    reach the root logger's JSON handler; uvicorn still sets their levels and turns
    the access log off when asked), uvicorn's own default for ``text``.
    """
    root = logging.getLogger()
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        for old in root.handlers[:]:
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level.upper())
        return None
    logging.basicConfig(level=logging.INFO, format=TEXT_FORMAT)
    root.setLevel(level.upper())
    from uvicorn.config import LOGGING_CONFIG

    return LOGGING_CONFIG


class RequestContext:
    """Pure ASGI middleware: sets :data:`REQUEST_ID` and :data:`MODEL` for each HTTP
    request and answers with its ``X-Request-ID``.

    ``default_model``: the name of ``NMBATCH_MODEL``; ``model_roots``: the first path
    segments of its routes without the prefix (``{"samples", "assign", ...}``).
    """

    def __init__(self, app: ASGIApp, default_model: str, model_roots: frozenset[str]) -> None:
        self.app = app
        self.default_model = default_model
        self.model_roots = model_roots

    def model_of(self, path: str) -> str | None:
        """The model a request path is about (see the module's docstring)."""
        parts = path.split("/", 3)  # "", first segment, second, rest
        if len(parts) < 2:
            return None
        if parts[1] == "models":
            return (parts[2] or None) if len(parts) > 2 else None
        return self.default_model if parts[1] in self.model_roots else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope["headers"])
        id_token = REQUEST_ID.set(request_id)
        model_token = MODEL.set(self.model_of(scope["path"]))
        header = (REQUEST_ID_HEADER, request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            MODEL.reset(model_token)
            REQUEST_ID.reset(id_token)
