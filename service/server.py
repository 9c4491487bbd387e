"""The service process (``python -m nmbatch``): uvicorn around the app, ``NMBATCH_*`` settings."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import uvicorn
from pydantic import ValidationError

from nmbatch.service import tracing
from nmbatch.service.config import Settings
from nmbatch.service.connections import MAX_HEADER_BYTES, bounded_h11
from nmbatch.service.keys import KeyRingError
from nmbatch.service.logs import configure_logging
from nmbatch.service.main import create_app

SWITCH_INTERVAL = 0.0005
"""Seconds a thread may hold the GIL while another waits for it (``sys.setswitchinterval``)."""
ENV_FILE = ".env"
"""File of ``NMBATCH_*`` settings the server reads from its current directory, under the
environment's own variables (pydantic-settings' dotenv source; absent: none)."""


class _Server(uvicorn.Server):
    """uvicorn's server, which first tells the open event streams (``GET /events``) to
    end: uvicorn's graceful shutdown waits for every open response, and a stream that
    never ends would be cancelled after ``timeout_graceful_shutdown`` with an error."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        slots = getattr(self.config.app.state, "event_streams", None)
        if slots is not None:
            slots.close()
        super().handle_exit(sig, frame)


def main() -> int:
    """Run until SIGINT/SIGTERM; returns the process exit code."""
    try:
        # The environment wins over the .env file of the current directory (if any).
        settings = Settings(_env_file=ENV_FILE)  # type: ignore[call-arg]
    except ValidationError as exc:
        print(f"invalid NMBATCH_* setting:\n{exc}", file=sys.stderr)
        return 2
    log_config = configure_logging(settings.log_format, settings.log_level)
    provider = None
    if settings.tracing != "off":
        try:
            provider = tracing.install(settings.tracing)
        except tracing.TracingError as exc:
            print(f"invalid NMBATCH_TRACING: {exc}", file=sys.stderr)
            return 2
    # The event loop shares the GIL with the worker thread and the request thread pool:
    # a thread waiting for it waits up to the switch interval (default 5 ms) whenever
    # another one runs Python. 0.5 ms keeps the loop's turns (and /assign) short.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        app = create_app(settings, freeze_heap=True)
    except KeyRingError as exc:
        print(f"invalid API key setting: {exc}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=log_config,
        access_log=settings.access_log,
        # h11 whatever else is installed: its answers to malformed framing are the
        # service's problem documents (tests/hardening); httptools would answer some with
        # plain text, for about 45 microseconds less per request. The loop is uvloop
        # when installed (auto), else asyncio. The protocol adds a connection cap and a
        # deadline for a request's headers (service.connections).
        http=bounded_h11(settings),
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    server = _Server(config)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the
    # handler that was installed before it. This one ignores it, so a stop requested by
    # a signal ends with exit code 0 once the lifespan (last snapshot, Redis) is done.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    server.run()
    if provider is not None:
        provider.shutdown()  # the spans still batched go out
    # uvicorn returns normally when the lifespan start-up failed; report it in the code.
    return 0 if server.started else 3
