"""Limits seen on a real socket (uvicorn in a thread): lying ``Content-Length`` headers,
bodies over the limit with or without a length, bodies that trickle in. The server
answers each, never hangs, and stores nothing."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterator
from unittest.mock import ANY

import httpx
import pytest
import redis
from hardening_helpers import LiveServer, live_server, raw_exchange, read_response

from tests.testkit import SettingsFactory, log_state

LIMIT = 64 * 1024
BODY_TIMEOUT = 1.0  # seconds; the default of NMBATCH_BODY_TIMEOUT_SECONDS is 60


def head(length: int | None = None, extra: str = "", path: str = "/samples") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def problem_type(body: bytes) -> str:
    return json.loads(body)["type"].rsplit(":", 1)[-1]


@pytest.fixture
def server(make_settings: SettingsFactory) -> Iterator[LiveServer]:
    settings = make_settings(max_body_bytes=LIMIT, body_timeout_seconds=BODY_TIMEOUT)
    with live_server(settings) as running:
        response = httpx.post(f"{running.base_url}/samples", json={"vectors": [[1.0, 2.0]]})
        assert response.status_code == 202
        yield running


@pytest.fixture
def unchanged(server: LiveServer, redis_client: redis.Redis, model_name: str) -> Iterator[None]:
    """The test must leave the sample log as it found it (one sample)."""
    yield
    assert log_state(redis_client, model_name) == (1, 1, b"2")
    # ... and the server still serves.
    response = httpx.post(f"{server.base_url}/samples", json={"vectors": [[3.0, 4.0]]})
    assert response.json() == {"accepted": 1, "n_samples": 2, "ids": ANY}


def test_a_10_gb_content_length_is_refused_before_any_byte_is_read(
    server: LiveServer, unchanged: None
) -> None:
    status, headers, body = raw_exchange(server, head(10 * 1024**3))
    assert status == 413 and problem_type(body) == "body-too-large"
    assert headers["connection"] == "close"


def test_a_chunked_body_is_refused_while_it_streams(server: LiveServer, unchanged: None) -> None:
    chunk = b"[" * 8192
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head(extra="Transfer-Encoding: chunked"))
        try:
            # Up to 256 times the limit (16 MiB); stop once the answer is there.
            for _ in range(256 * LIMIT // len(chunk)):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: read the answer below
        status, headers, body = read_response(sock)
    assert status == 413 and problem_type(body) == "body-too-large"
    assert headers["connection"] == "close"
    # Refused at the first read past the limit, not after buffering the body: the
    # loopback's socket buffers hold megabytes, so what was *sent* proves nothing.
    received = json.loads(body)["received_bytes"]
    assert LIMIT < received <= LIMIT + 256 * 1024


def test_a_content_length_larger_than_the_body_times_out(
    server: LiveServer, unchanged: None
) -> None:
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head(1000) + b'{"vectors": [[1, 2]]}')  # 20 of 1000 bytes, then silence
        status, headers, body = read_response(sock)
    assert status == 408 and problem_type(body) == "body-timeout"
    assert headers["connection"] == "close"


def test_a_body_cut_short_by_the_client_is_not_stored(server: LiveServer, unchanged: None) -> None:
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head(1000) + b'{"vectors": [[1, 2]]}')
        sock.shutdown(socket.SHUT_WR)  # the client gives up: end of its stream
        sock.settimeout(30)
        try:
            while sock.recv(65536):  # whatever comes, the connection must end
                pass
        except ConnectionResetError:
            pass


def test_a_content_length_smaller_than_the_body(server: LiveServer, unchanged: None) -> None:
    body = b'{"vectors": [[5, 6]]}'
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        # The server reads '{"vectors"' as the body, then the rest as a next request.
        sock.sendall(head(10) + body + b"\r\n\r\n")
        status, _, answer = read_response(sock)
        assert status == 400 and problem_type(answer) == "malformed-body"
        # The rest is not a request: the server refuses it and closes the connection.
        sock.settimeout(30)
        rest = b""
        try:
            while chunk := sock.recv(65536):
                rest += chunk
        except ConnectionResetError:
            pass
        assert rest == b"" or rest.startswith(b"HTTP/1.1 400")


def test_a_trickled_body_is_cut_off_by_the_total_deadline(
    server: LiveServer, unchanged: None
) -> None:
    """One byte every 0.1 s: never idle for long, but never done either."""
    stop = threading.Event()
    payload = b'{"vectors": [[' + b"1," * 200

    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head(len(payload) + 10))

        def trickle() -> None:
            for byte in payload:  # bounded: about 40 s at most, stopped much earlier
                if stop.wait(0.1):
                    return
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    return

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            status, headers, body = read_response(sock)
        finally:
            stop.set()
            sender.join(5)
    assert status == 408 and problem_type(body) == "body-timeout"
    assert headers["connection"] == "close"


@pytest.mark.parametrize(
    "headers",
    [
        "Content-Length: abc",
        "Content-Length: -5",
        "Content-Length: 5\r\nContent-Length: 7",
        "Content-Length: 18446744073709551616",
    ],
    ids=["not a number", "negative", "two different", "beyond 64 bits"],
)
def test_malformed_content_lengths_are_400(
    server: LiveServer, unchanged: None, headers: str
) -> None:
    request = head(extra=headers) + b'{"vectors": [[1, 2]]}'
    status, _, _ = raw_exchange(server, request)
    assert status in (400, 413)
