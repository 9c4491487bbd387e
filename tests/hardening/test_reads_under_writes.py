"""Reads keep their latency when writes saturate (issue 34, item 13), against a real
``python -m nmbatch`` process, its engine process and the test redis-server.

The latency itself is the load benchmark's to measure (``python -m benchmarks.loadtest
--phases assign-max --batch 10000 --ingest-conns 1 --assign-conns 4 --retention
window --max-samples 500000``, docs/operations/limits.md). What made it stall under a
window of 500,000 is checked here as a mechanism: the worker read its own rows back
from Redis in 32 MiB replies (its hand-off of rows in memory held 8 MiB, less than two
requests), and hiredis builds such a reply holding the GIL. With the hand-off sized for
the requests in flight, rows posted while the engine is stopped reach it from memory:
Redis sends next to none of them. And once the worker is behind by more than the
hand-off holds, writes are shed while reads go on (the rule itself, and writes shed on
the loop's lag, are tested in ``test_admission``).
"""

from __future__ import annotations

import io
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import redis
from hardening_helpers import service_process

from tests.testkit import wait_until

D = 128
ROWS = 10_000  # rows of one request: 5 MB, five log entries
REQUESTS = 10  # 50 MB in all, posted by two writers while the engine is stopped


def npy_body(seed: int) -> bytes:
    out = io.BytesIO()
    np.save(out, np.random.default_rng(seed).normal(size=(ROWS, D)).astype(np.float32))
    return out.getvalue()


def engine_pid(server_pid: int) -> int:
    """The server's engine process (OS name ``nmbatch-engine``)."""
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().strip() == "nmbatch-engine":
                return int(child)
    raise LookupError("no engine process yet")


def test_a_window_takes_its_rows_from_memory_not_back_from_redis(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    with service_process(
        tmp_path, redis_url=redis_url, model=model_name, k=16, dim=D, retention="window",
        max_samples=500_000, worker_process="true", worker_threads=1, seed=0,
        poll_seconds=0.05, access_log="false",
        write_shed_lag_ms=0,  # two writers on a busy machine: none shed here
    ) as server:  # fmt: skip
        assert server.proc is not None
        bodies = [npy_body(seed) for seed in range(REQUESTS)]

        def post(body: bytes) -> int:
            headers = {"content-type": "application/x-npy"}
            return httpx.post(f"{server.base}/samples", content=body, headers=headers,
                              timeout=120).status_code  # fmt: skip

        assert post(bodies[0]) == 202  # the engine starts with the first rows
        wait_until(lambda: server.get("/stats").json()["N"] >= ROWS, 120, "first rows")
        engine = engine_pid(server.proc.pid)
        sent_before = int(redis_client.info("stats")["total_net_output_bytes"])
        os.kill(engine, signal.SIGSTOP)  # the worker falls behind: rows wait in the hand-off
        try:
            with ThreadPoolExecutor(2) as writers:  # two writers as fast as they go
                assert list(writers.map(post, bodies[1:])) == [202] * (REQUESTS - 1)
        finally:
            os.kill(engine, signal.SIGCONT)
        wait_until(
            lambda: server.get("/stats").json()["N"] >= REQUESTS * ROWS, 120, "all rows"
        )
        sent = int(redis_client.info("stats")["total_net_output_bytes"]) - sent_before
    rows_bytes = (REQUESTS - 1) * ROWS * D * 4
    # Small replies only (acknowledgements, the checks of the hand-off, the lease): with
    # an 8 MiB hand-off, Redis sent back 40 MB of the 45 MB of rows.
    assert sent < rows_bytes // 10, f"Redis sent {sent:,} bytes for {rows_bytes:,} of rows"


def test_writes_past_the_hand_off_are_shed_while_the_worker_is_stopped(
    tmp_path: Path, redis_url: str, model_name: str
) -> None:
    # The engine stopped, a reader there: the hand-off (64 MiB at least) fills and the
    # writes past it are answered 503 overloaded, nothing of them stored, while /assign
    # keeps answering; once the engine runs again it takes what was accepted and
    # writes are taken again.
    with service_process(
        tmp_path, redis_url=redis_url, model=model_name, k=16, dim=D, retention="window",
        max_samples=500_000, worker_process="true", worker_threads=1, seed=0,
        poll_seconds=0.05, access_log="false",
    ) as server:  # fmt: skip
        assert server.proc is not None
        headers = {"content-type": "application/x-npy"}
        query = {"vector": ",".join(["0"] * D)}
        with httpx.Client(base_url=server.base, timeout=120) as http:
            assert http.post("/samples", content=npy_body(0), headers=headers).status_code == 202
            wait_until(lambda: http.get("/stats").json()["N"] >= ROWS, 120, "first rows")
            engine = engine_pid(server.proc.pid)
            os.kill(engine, signal.SIGSTOP)
            accepted, shed = 0, []  # while the engine is stopped
            try:
                for seed in range(1, 40):  # 195 MB if none were shed
                    assert http.get("/assign", params=query).status_code == 200
                    answer = http.post("/samples", content=npy_body(seed), headers=headers)
                    if answer.status_code == 202:
                        accepted += 1
                        continue
                    assert answer.status_code == 503, answer.text
                    assert answer.json()["type"] == "urn:nmbatch:problem:overloaded"
                    assert answer.headers["retry-after"] == "1"
                    shed.append(answer.json()["behind_bytes"])
            finally:
                os.kill(engine, signal.SIGCONT)
            # 64 MiB hold 13 requests of 5 MB: the rest were shed, none lost.
            assert accepted * ROWS * D * 4 <= 64 << 20 < (accepted + 1) * ROWS * D * 4
            assert len(shed) == 39 - accepted and min(shed) > 60 << 20
            assert http.get("/stats").json()["n_logged"] == (1 + accepted) * ROWS
            wait_until(
                lambda: http.get("/stats").json()["N"] >= (1 + accepted) * ROWS, 120, "caught up"
            )
            http.get("/assign", params=query)
            assert http.post("/samples", content=npy_body(99), headers=headers).status_code == 202

