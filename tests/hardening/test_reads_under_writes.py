"""Reads keep their latency when writes saturate (issue 34, item 13), against a real
``python -m nmbatch`` process, its engine process and the test redis-server.

The latency itself is the load benchmark's to measure (``python -m benchmarks.loadtest
--phases assign-max --batch 10000 --ingest-conns 1 --assign-conns 4 --retention
window --max-samples 500000``, docs/operations/limits.md). What made it stall under a
window of 500,000 is checked here as a mechanism: the worker read its own rows back
from Redis in 32 MiB replies (its hand-off of rows in memory held 8 MiB, less than two
requests), and hiredis builds such a reply holding the GIL. With the hand-off sized for
the requests in flight, rows posted while the engine is stopped reach it from memory:
Redis sends next to none of them. Writes shed on the loop's lag are tested in
``test_admission``.
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
