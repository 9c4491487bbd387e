"""Bounds on what all requests together hold (issue 34, item 4), against a real
``python -m nmbatch`` process on the test redis-server: a budget of in-flight body
bytes and a concurrency limit (503 problems with ``Retry-After`` past them, the
server's memory bounded), a connection cap, and a deadline for a request's headers.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import anyio
import httpx
import pytest
import redis
from hardening_helpers import read_response, service_process, status_kib

from nmbatch.service.admission import AdmissionControl
from nmbatch.service.config import Settings
from nmbatch.service.main import create_app
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import SettingsFactory, TestClient, assert_problem, log_state

J = "application/json"

MAX_BODY = 1024 * 1024
BUDGET = 4 * MAX_BODY
MAX_REQUESTS = 8
MAX_CONNECTIONS = 64
HEADER_TIMEOUT = 1.0


@pytest.fixture
def server(tmp_path: Path, redis_url: str, model_name: str) -> Iterator[ServiceProcess]:
    with service_process(
        tmp_path, redis_url=redis_url, model=model_name, k=1, worker_threads=1,
        worker_process="false", max_body_bytes=MAX_BODY, max_inflight_body_bytes=BUDGET,
        max_concurrent_requests=MAX_REQUESTS, max_connections=MAX_CONNECTIONS,
        header_timeout_seconds=HEADER_TIMEOUT, body_timeout_seconds=30, access_log="false",
    ) as proc:  # fmt: skip
        yield proc


def head(length: int, path: str = "/samples") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def answered(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except TimeoutError:
        return False


def problem_of(sock: socket.socket) -> tuple[int, dict[str, str], str]:
    status, headers, body = read_response(sock, 10)
    return status, headers, json.loads(body)["type"].rsplit(":", 1)[-1]


def test_slow_bodies_beyond_the_budget_are_503_and_memory_stays_bounded(
    server: ServiceProcess,
) -> None:
    assert server.proc is not None
    rss_before = status_kib(server.proc.pid)
    with ExitStack() as stack:
        held = []
        refused = []
        # 40 clients each announce a 1 MiB body; those let in send 900 KB of it, then
        # stall (without the budget, the server would hold 40 of them).
        for _ in range(40):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
            sock.sendall(head(MAX_BODY))
            if answered(sock, 0.3):
                refused.append(sock)
                continue
            held.append(sock)
            sock.sendall(b'{"vectors": [[' + b"1," * 450_000)
        time.sleep(0.5)  # the server reads what was sent
        grown = status_kib(server.proc.pid) - rss_before
        # Four bodies and their buffers: a few MiB, not 40 of them.
        assert grown < 20 * 1024, f"RSS grew by {grown} KiB ({len(held)} bodies held)"
        # The budget holds four 1 MiB bodies: the others were refused at once.
        assert len(held) == BUDGET // MAX_BODY, (len(held), len(refused))
        for sock in refused:
            status, headers, slug = problem_of(sock)
            assert (status, slug) == (503, "body-budget-exhausted")
            assert headers["retry-after"] == "1" and headers["connection"] == "close"
        # A small request still fits the concurrency limit but not the budget ...
        answer = httpx.post(f"{server.base}/samples", json={"vectors": [[1.0, 2.0]]}, timeout=10)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["type"] == "urn:nmbatch:problem:body-budget-exhausted"
        # ... and probes are never refused.
        assert server.get("/healthz").status_code == 200
    # The held requests ended with their clients: the budget is free again.
    time.sleep(0.5)
    answer = httpx.post(f"{server.base}/samples", json={"vectors": [[1.0, 2.0]]}, timeout=30)
    assert answer.status_code == 202, answer.text


def test_requests_beyond_the_concurrency_limit_are_503(server: ServiceProcess) -> None:
    with ExitStack() as stack:
        # MAX_REQUESTS requests in flight, each waiting for the 10 bytes it announced.
        for _ in range(MAX_REQUESTS):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
            sock.sendall(head(10))
            assert not answered(sock, 0.2)
        answer = httpx.get(f"{server.base}/stats", timeout=10)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["type"] == "urn:nmbatch:problem:too-many-requests"
        assert server.get("/readyz").status_code == 200
    time.sleep(0.5)
    assert httpx.get(f"{server.base}/stats", timeout=10).status_code == 200


def test_a_client_that_never_finishes_its_headers_is_disconnected(
    server: ServiceProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /stats HTTP/1.1\r\nHost: test\r\n")
        received = b""
        # One header byte every 0.1 s: never idle, never done.
        for _ in range(200):
            try:
                sock.sendall(b"x")
            except OSError:
                break
            if answered(sock, 0.1):
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                received += chunk
        elapsed = time.monotonic() - start
    assert elapsed < HEADER_TIMEOUT + 2, f"still connected after {elapsed:.1f} s"
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert b"header-timeout" in received


def test_after_its_408_the_server_lingers_instead_of_resetting(server: ServiceProcess) -> None:
    """After a 408 the server half-closes and reads (and drops) what still arrives.

    A plain close with unread bytes in its socket makes the server's kernel answer with
    a reset, which (rarely, under load) destroyed the 408 before the client read it:
    the client then saw "connection reset" and no answer. Lingering, the server's side
    ends with a FIN, and bytes the client sends after it are taken, not reset.
    """
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /stats HTTP/1.1\r\nHost: test\r\n")
        sock.settimeout(HEADER_TIMEOUT + 5)
        received = b""
        while chunk := sock.recv(65536):  # until the server's FIN
            received += chunk
        assert received.startswith(b"HTTP/1.1 408"), received[:200]
        for _ in range(5):  # a reset would fail the second send at the latest
            sock.sendall(b"x" * 1024)
            time.sleep(0.05)
            assert sock.recv(1) == b""  # still the FIN, no reset


def test_an_idle_connection_is_closed_by_the_header_deadline(server: ServiceProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        start = time.monotonic()
        sock.settimeout(HEADER_TIMEOUT + 5)
        assert sock.recv(1) == b""  # closed without a word: nothing was asked
        assert time.monotonic() - start < HEADER_TIMEOUT + 2


def test_connections_beyond_the_cap_are_closed(server: ServiceProcess) -> None:
    with ExitStack() as stack:
        socks = [
            stack.enter_context(socket.create_connection(("127.0.0.1", server.port)))
            for _ in range(MAX_CONNECTIONS + 10)
        ]
        time.sleep(0.3)
        closed = 0
        for sock in socks:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 10


def test_a_chunked_body_is_counted_against_the_budget_as_it_arrives(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(max_body_bytes=64 * 1024, max_inflight_body_bytes=8 * 1024)

    def chunks() -> Iterator[bytes]:  # no Content-Length: nothing to reserve up front
        yield b'{"vectors": [[' + b"1," * 10_000 + b"1]]}"

    with TestClient(create_app(settings)) as client:
        answer = client.post("/samples", content=chunks(), headers={"content-type": J})
        problem = assert_problem(answer, 503, "body-budget-exhausted")
        assert problem["limit"] == 8 * 1024 and answer.headers["retry-after"] == "1"
        assert log_state(redis_client, model_name) == (0, 0, None)
        # What was counted is released: a small body fits again.
        assert client.post("/samples", json={"vectors": [[1.0, 2.0]]}).status_code == 202


def test_a_pipelined_request_slower_than_the_header_deadline_is_answered(
    server: ServiceProcess,
) -> None:
    # Two requests in one write: the second one's headers are in when the first is
    # answered. Its body then takes twice the header deadline: it has its headers in
    # time, only the body timeout (30 s) applies to it.
    body = json.dumps({"vectors": [[1.0, 2.0]]}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n" + head(len(body)))
        status, _, _ = read_response(sock, 10)
        assert status == 200
        time.sleep(2 * HEADER_TIMEOUT)
        sock.sendall(body)
        status, _, answer = read_response(sock, 10)
    assert status == 202, answer[:300]


def test_a_request_without_a_body_is_passed_on_unwrapped() -> None:
    # The fast path of GET /assign: admission control adds no receive wrapper (and no
    # per-request closure) to a request that cannot carry a body.
    seen: list[object] = []

    async def inner(scope: dict, receive: object, send: object) -> None:
        seen.append(receive)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    gate = AdmissionControl(inner, Settings(k=1))  # type: ignore[arg-type]
    scope = {"type": "http", "path": "/assign", "method": "GET", "headers": [(b"host", b"x")]}
    anyio.run(gate, scope, receive, None)
    assert seen == [receive] and gate.in_flight == 0 and gate.body_bytes == 0
    chunked = scope | {"headers": [(b"transfer-encoding", b"chunked")], "method": "POST"}
    anyio.run(gate, chunked, receive, None)
    assert seen[-1] is not receive  # a chunked body is counted as it arrives


# -- item 13: writes are shed before reads slow down ------------------------------------------
def test_writes_are_shed_while_the_loop_lags_and_reads_are_not() -> None:
    # The mechanism on a real event loop: a write held in flight, then the loop stalled
    # for 300 ms (what a GIL-holding thread or a body's parse does to it). A second write
    # is answered 503 overloaded without its body being read once a reader is there (a
    # read in the last second); reads go through; once the loop keeps time again, writes
    # are taken again; a lone writer is never shed.
    release = anyio.Event()
    reached: list[str] = []

    async def inner(scope: dict, receive: object, send: object) -> None:
        reached.append(f"{scope['method']} {scope['path']}")
        if scope["path"] == "/samples" and scope.get("hold"):
            await release.wait()

    def request(method: str, path: str, **extra: object) -> dict:
        headers = [(b"content-length", b"10")] if method == "POST" else []
        return {"type": "http", "method": method, "path": path, "headers": headers, **extra}

    async def receive() -> dict:
        raise AssertionError("a shed write's body is not read")

    async def main() -> None:
        gate = AdmissionControl(inner, Settings(k=1, write_shed_lag_ms=50))  # type: ignore[arg-type]
        answers: list[dict] = []

        async def send(message: dict) -> None:
            answers.append(message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(gate, request("POST", "/samples", hold=True), receive, send)
            await anyio.sleep(0.05)  # the write is in flight, the lag monitor runs
            assert gate.writes == 1 and gate.loop_lag is not None
            time.sleep(0.3)  # the loop stalls
            await anyio.sleep(0.01)  # the monitor's late tick runs
            assert gate.loop_lag.lag > 0.2
            # No reader yet: no latency to keep, the writers have the loop.
            await gate(request("POST", "/samples"), receive, send)
            assert gate.shed == 0 and reached[-1] == "POST /samples"
            await gate(request("GET", "/assign"), receive, send)
            assert reached[-1] == "GET /assign"  # reads are never shed
            await gate(request("POST", "/models/m/samples"), receive, send)
            assert answers[0]["status"] == 503 and gate.shed == 1
            headers = dict(answers[0]["headers"])
            assert headers[b"retry-after"] == b"1" and headers[b"connection"] == b"close"
            assert b"urn:nmbatch:problem:overloaded" in answers[1]["body"]
            assert reached.count("POST /models/m/samples") == 0
            await anyio.sleep(0.5)  # the loop keeps time: the lag decays (10 half-lives)
            assert gate.loop_lag.lag < 0.05
            await gate(request("POST", "/samples"), receive, send)
            assert reached[-1] == "POST /samples" and gate.shed == 1
            release.set()
        # A lone writer, however late the loop: the lag is not its doing.
        time.sleep(0.3)
        await anyio.sleep(0.01)
        assert gate.loop_lag.lag > 0.2
        await gate(request("POST", "/samples"), receive, send)
        assert gate.shed == 1 and gate.writes == 0

    anyio.run(main)


def test_writes_are_shed_while_the_worker_is_behind_by_its_hand_off() -> None:
    # The second rule: a write whose body would not fit in its model's hand-off (the
    # worker is that far behind) is shed while a reader is there, lone writer or not;
    # the admission asks with the body's declared length (one above the body limit is
    # passed on: the route refuses it with a 413).
    reached: list[str] = []
    asked: list[tuple[str, int]] = []
    short: dict[str, tuple[int, int]] = {"/models/m/samples": (70 << 20, 64 << 20)}

    async def inner(scope: dict, receive: object, send: object) -> None:
        reached.append(f"{scope['method']} {scope['path']}")

    def handoff_short(scope: dict, incoming: int) -> tuple[int, int] | None:
        asked.append((scope["path"], incoming))
        return short.get(scope["path"])

    def request(method: str, path: str, length: int = 10) -> dict:
        headers = [(b"content-length", str(length).encode())] if method == "POST" else []
        return {"type": "http", "method": method, "path": path, "headers": headers}

    async def receive() -> dict:
        raise AssertionError("a shed write's body is not read")

    async def main() -> None:
        settings = Settings(k=1, write_shed_lag_ms=50)
        gate = AdmissionControl(inner, settings, handoff_short=handoff_short)  # type: ignore[arg-type]
        answers: list[dict] = []

        async def send(message: dict) -> None:
            answers.append(message)

        await gate(request("POST", "/models/m/samples"), receive, send)
        assert gate.shed == 0 and asked == []  # no reader: the writers have the loop
        await gate(request("GET", "/assign"), receive, send)
        await gate(request("POST", "/samples", 5 << 20), receive, send)
        assert gate.shed == 0 and reached[-1] == "POST /samples"
        assert asked[-1] == ("/samples", 5 << 20)
        await gate(request("POST", "/models/m/samples", 1 << 40), receive, send)
        assert gate.shed == 0 and reached[-1] == "POST /models/m/samples"  # the route's 413
        await gate(request("POST", "/models/m/samples", 5 << 20), receive, send)
        assert gate.shed == 1 and reached.count("POST /models/m/samples") == 2
        assert asked[-1] == ("/models/m/samples", 5 << 20)
        assert answers[0]["status"] == 503
        headers = dict(answers[0]["headers"])
        assert headers[b"retry-after"] == b"1" and headers[b"connection"] == b"close"
        document = json.loads(answers[1]["body"])
        assert document["type"] == "urn:nmbatch:problem:overloaded"
        assert document["behind_bytes"] == 70 << 20 and "64 MiB" in document["detail"]
        short.clear()  # caught up: taken again
        await gate(request("POST", "/models/m/samples"), receive, send)
        assert gate.shed == 1 and reached[-1] == "POST /models/m/samples"

    anyio.run(main)

