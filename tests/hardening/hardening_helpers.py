"""Helpers of the hardening tests: a uvicorn server in a thread and raw HTTP over a socket."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import free_port
from nmbatch.service.main import create_app
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import wait_until

__all__ = [
    "LiveServer",
    "live_server",
    "raw_exchange",
    "read_response",
    "service_process",
    "status_kib",
]


# -- a real server on a real socket ----------------------------------------------------------
@dataclass
class LiveServer:
    """A uvicorn server running the app in a thread, on 127.0.0.1:``port``."""

    host: str
    port: int
    settings: Settings
    app: Any = None  # the app it serves (its state, for tests that look inside)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextmanager
def live_server(settings: Settings) -> Iterator[LiveServer]:
    """Run ``create_app(settings)`` under uvicorn (h11, lifespan on) in a thread."""
    port = free_port()
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 60, "uvicorn to start")
        if not server.started:
            pytest.fail("uvicorn did not start (see the log)")
        yield LiveServer("127.0.0.1", port, settings, app)
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not stop"


def read_response(sock: socket.socket, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response (status, lower-case headers, body) from ``sock``.

    The body is read by ``Content-Length``, or to the end of the connection. Fails the
    test if nothing complete arrives within ``timeout`` seconds (a hung server).
    """
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if not head:
            pytest.fail("the server closed the connection without an answer")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", -1))
        while length < 0 or len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    except TimeoutError:
        pytest.fail(f"no complete answer within {timeout} s: got {data[:200]!r}")
    return status, headers, body if length < 0 else body[:length]


def raw_exchange(
    server: LiveServer, request: bytes, timeout: float = 30.0
) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` bytes on a new connection and read the answer."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(request)
        return read_response(sock, timeout)


# -- a real service process (python -m nmbatch) and its memory ------------------------------
@contextmanager
def service_process(tmp: Path, **settings: Any) -> Iterator[ServiceProcess]:
    """``python -m nmbatch`` with ``NMBATCH_*`` ``settings``, ready; stopped on exit."""
    proc = ServiceProcess(tmp, "service", **settings).start()
    try:
        proc.ready(60)
        yield proc
    finally:
        proc.close()


def status_kib(pid: int, field: str = "VmRSS") -> int:
    """A memory field of ``/proc/{pid}/status`` in KiB: ``VmRSS`` (resident now) or
    ``VmHWM`` (the resident peak since the process started)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)
