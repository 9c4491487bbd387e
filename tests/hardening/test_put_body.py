"""``PUT /models/{name}``: the body is read after the key check, capped and timed.

Issue 34, item 2. Real parts: a ``python -m nmbatch`` process on the session's Redis,
raw HTTP on a socket (a body declared large, a body sent a byte at a time), the
server's resident memory read from ``/proc`` (psutil).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hardening_helpers import read_response

from tests.faults.fault_helpers import ServiceProcess

KEY = "put-body-test-key-0123456789"
CHUNK = b" " * (1 << 20)


@pytest.fixture
def server(tmp_path: Path, redis_url: str, model_name: str) -> Iterator[ServiceProcess]:
    proc = ServiceProcess(
        tmp_path, "put-body", redis_url=redis_url, model=model_name, k=2, api_key=KEY,
        body_timeout_seconds=2, worker_threads=1,
    ).start()  # fmt: skip
    try:
        proc.ready(60)
        yield proc
    finally:
        proc.close()


def head(length: int, *, auth: bool) -> bytes:
    key = f"Authorization: Bearer {KEY}\r\n" if auth else ""
    return (
        f"PUT /models/big HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{key}Content-Length: {length}\r\n\r\n"
    ).encode()


def rss(proc: ServiceProcess) -> int:
    assert proc.proc is not None
    return psutil.Process(proc.proc.pid).memory_info().rss


def test_an_unauthenticated_large_put_is_a_401_at_once_and_costs_no_memory(
    server: ServiceProcess,
) -> None:
    before = rss(server)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head(200 << 20, auth=False) + b'{"k": 2, "dim": 2' + CHUNK)
        started = time.monotonic()
        status, _, body = read_response(sock, timeout=5)
        assert status == 401 and b"unauthorized" in body
        assert time.monotonic() - started < 3
        # The rest of the body, if the server still takes it: it is not kept.
        with contextlib.suppress(OSError):
            for _ in range(100):
                sock.sendall(CHUNK)
    time.sleep(0.5)
    assert rss(server) - before < 32 << 20, (before, rss(server))


def test_an_authenticated_put_is_capped_and_timed(server: ServiceProcess) -> None:
    # Declared above the cap: refused before anything is read.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head(200 << 20, auth=True))
        status, _, body = read_response(sock, timeout=5)
        assert status == 413 and b"body-too-large" in body
    # Sent a byte at a time (here 0.2 s each, 12 s in all): cut off after 2 s.
    spec = b'{"k": 2, "dim": 2}' + b" " * 42
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head(len(spec), auth=True))
        started = time.monotonic()
        sock.setblocking(False)
        answer = b""
        for byte in spec:
            with contextlib.suppress(BlockingIOError):
                answer += sock.recv(65536)
            if answer:
                break
            with contextlib.suppress(OSError):
                sock.sendall(bytes([byte]))
            time.sleep(0.2)
        sock.setblocking(True)
        elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"body-timeout" in answer or b"body-timeout" in sock.recv(65536)
        assert elapsed < 5, elapsed
