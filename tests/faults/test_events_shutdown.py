"""SIGTERM of a service with an open ``GET /events`` stream: the stream ends at once and the
process exits cleanly, instead of uvicorn's graceful shutdown waiting for the never-ending
response and cancelling it with an error after ``timeout_graceful_shutdown`` (10 s)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from fault_helpers import ServiceProcess

from nmbatch.service.embedded_redis import EmbeddedRedis

pytestmark = pytest.mark.fault


def test_sigterm_ends_the_open_event_streams_and_the_process_promptly(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis().url
    service = start_service("events", redis_url=url, model="ev", k=2, worker_threads=1,
                            events_heartbeat_seconds=60)  # fmt: skip
    service.ready()
    lines: list[str] = []
    ended = threading.Event()

    def read() -> None:
        with httpx.stream("GET", f"{service.base}/events", timeout=None) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while not lines and time.monotonic() < deadline:  # the opening comment: stream open
        time.sleep(0.05)
    assert lines and lines[0].startswith(": events of model ev")
    t0 = time.monotonic()
    service.signal(signal.SIGTERM)
    assert service.proc is not None
    code = service.proc.wait(30)
    took = time.monotonic() - t0
    assert ended.wait(5), "the stream did not end with the server"
    log = service.log_tail(20000)
    assert code == 0, log
    assert took < 6, f"{took:.1f} s to stop: the graceful shutdown waited for the stream\n{log}"
    assert "timeout graceful shutdown exceeded" not in log and "Traceback" not in log, log
