"""OpenTelemetry traces of the request paths and the worker's steps (``nmbatch[otel]``).

``NMBATCH_TRACING`` = ``otlp`` (spans sent by OTLP over HTTP, to
``OTEL_EXPORTER_OTLP_ENDPOINT`` and the other standard ``OTEL_*`` variables) or
``console`` (printed on stdout); ``off`` (the default): no span is made and OpenTelemetry
is not imported. The server process installs the SDK's tracer provider (:func:`install`,
service name ``nmbatch``); tests hand one of their own to :func:`use_provider` (the
SDK's in-memory exporter).

Spans:

- one ``SERVER`` span per HTTP request (:class:`TracingMiddleware`), named ``"{method}
  {route}"`` from the closed label sets of the metrics (the route's template, never the
  path: ``POST /models/{name}/samples``), a child of the caller's ``traceparent`` when it
  sends one; attributes ``http.request.method``, ``http.route``,
  ``http.response.status_code``, ``nmbatch.model`` and ``nmbatch.request_id`` (the log
  lines' ``X-Request-ID``, :mod:`nmbatch.service.logs`); a ``5xx`` sets the span's status
  to error;
- the worker's steps (:func:`span`): ``nmbatch.worker.pull`` (new log entries into the
  store), ``nmbatch.worker.step`` (one iteration), ``nmbatch.worker.snapshot`` (a
  snapshot written to Redis), each with ``nmbatch.model``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from nmbatch.service.logs import MODEL, REQUEST_ID
from nmbatch.service.metrics import UNMATCHED, method_label, status_label

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["TracingError", "TracingMiddleware", "install", "span", "tracer", "use_provider"]

SCOPE = "nmbatch"
"""The instrumentation scope (tracer name) of every span."""

_provider: Any = None  # the TracerProvider spans go to; None: tracing off


class TracingError(Exception):
    """Tracing asked for but OpenTelemetry's SDK not installed."""


def use_provider(provider: Any) -> None:
    """Send the spans to ``provider`` (an SDK ``TracerProvider``); None: no spans."""
    global _provider
    _provider = provider


def install(exporter: Literal["otlp", "console"]) -> Any:
    """Build the SDK's tracer provider with a batch processor to ``exporter``, make it
    the process's (and OpenTelemetry's global one), and return it.

    Raises :class:`TracingError` without ``nmbatch[otel]``.
    """
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise TracingError(
            "NMBATCH_TRACING needs OpenTelemetry's SDK: pip install 'nmbatch[otel]'"
        ) from None
    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingError(
                "NMBATCH_TRACING=otlp needs the OTLP exporter: pip install 'nmbatch[otel]'"
            ) from None
        span_exporter: Any = OTLPSpanExporter()
    else:
        span_exporter = ConsoleSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "nmbatch"}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    use_provider(provider)
    return provider


def tracer() -> Any:
    """The tracer of the spans, or None when tracing is off."""
    return None if _provider is None else _provider.get_tracer(SCOPE)


@contextlib.contextmanager
def span(name: str, model: str, **attributes: Any) -> Iterator[Any]:
    """A span ``name`` about ``model`` around the block (nothing when tracing is off);
    yields the span (None when off)."""
    current = tracer()
    if current is None:
        yield None
        return
    with current.start_as_current_span(
        name, attributes={"nmbatch.model": model, **attributes}
    ) as made:
        yield made


class TracingMiddleware:
    """Pure ASGI middleware: a ``SERVER`` span around each HTTP request (see the module).

    Installed inside :class:`nmbatch.service.logs.RequestContext`, whose request id and
    model it reads, and only when tracing is on.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        current = tracer()
        if scope["type"] != "http" or current is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method = method_label(scope["method"])
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        with current.start_as_current_span(
            method, context=propagate.extract(carrier), kind=SpanKind.SERVER
        ) as made:
            try:
                await self.app(scope, receive, send_and_record)
            finally:
                template = getattr(scope.get("route"), "path", None)
                route = template if isinstance(template, str) and template else UNMATCHED
                made.update_name(f"{method} {route}")
                made.set_attribute("http.request.method", method)
                made.set_attribute("http.route", route)
                made.set_attribute("http.response.status_code", status)
                if (model := MODEL.get()) is not None:
                    made.set_attribute("nmbatch.model", model)
                if (request_id := REQUEST_ID.get()) is not None:
                    made.set_attribute("nmbatch.request_id", request_id)
                if status_label(status) == "other" or status >= 500:
                    made.set_status(Status(StatusCode.ERROR))
