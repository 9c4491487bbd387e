"""Two service processes on one Redis and model: one worker, one standby that follows
the worker's snapshots, takes over when the worker freezes or dies, and a frozen worker
that wakes up steps down instead of fighting. Snapshot versions never go back.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from fault_helpers import (
    BackgroundLoop,
    Ingestor,
    Ledger,
    ServiceProcess,
    check_log_against_ledger,
    http_post,
)

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage import ModelKeys
from tests.testkit import wait_until

pytestmark = pytest.mark.fault

MODEL = "pair"
VECTOR = ",".join(["1"] * 8)


class SnapshotWatch(BackgroundLoop):
    """Reads the snapshot's version in Redis in a loop, from another connection."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.client = redis.Redis.from_url(url)
        self.versions: list[int] = []

    def loop(self) -> None:
        key = ModelKeys(MODEL).snapshot
        while not self.stopping.is_set():
            raw = self.client.hget(key, "version")
            if raw is not None:
                self.versions.append(int(raw))
            self.stopping.wait(0.02)

    def close(self) -> None:
        self.client.close()


def centroids(proc: ServiceProcess) -> dict[str, Any] | None:
    try:
        response = proc.get("/centroids", timeout=5)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


def converged_on(proc: ServiceProcess, rows: int) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        doc = centroids(proc)
        return doc if doc and doc["converged"] and doc["n_samples"] == rows else None

    return check


def ingest_until(procs: list[ServiceProcess], ledger: Ledger, more: int, seed: int) -> None:
    """Post tagged batches through each of ``procs`` until ``more`` more are acknowledged."""
    start = len(ledger.acked)
    ingestors = [
        Ingestor(http_post(p.base), ledger, threads=1, sizes=(150,), pause=0.02, seed=seed + i)
        for i, p in enumerate(procs)
    ]
    for ingestor in ingestors:
        ingestor.__enter__()
    try:
        wait_until(lambda: len(ledger.acked) >= start + more, 30, "acknowledged batches")
    finally:
        for ingestor in ingestors:
            ingestor.stop()


def test_one_worker_per_model_standby_follows_and_takes_over(
    start_redis: Callable[..., EmbeddedRedis], start_service: Callable[..., ServiceProcess]
) -> None:
    server = start_redis()
    settings = dict(
        redis_url=server.url,
        model=MODEL,
        k=3,
        batch_size=64,
        snapshot_seconds=0.2,
        poll_seconds=0.1,
        worker_threads=1,
        worker_lock_seconds=1.5,
    )
    first = start_service("first", **settings)
    assert first.ready()["role"] == "worker"
    second = start_service("second", **settings)
    assert second.ready()["role"] == "standby"
    client = redis.Redis.from_url(server.url)
    ledger = Ledger()

    with SnapshotWatch(server.url) as watch:
        # -- both ingest; the standby serves the worker's snapshots -----------------------
        ingest_until([first, second], ledger, 10, seed=0)
        rows = check_log_against_ledger(client, MODEL, ledger)
        worked = wait_until(converged_on(first, rows), 30, "the worker's convergence")
        followed = wait_until(
            lambda: (doc := centroids(second)) and doc["version"] == worked["version"] and doc,
            10,
            "the standby to serve the worker's last snapshot",
        )
        assert followed["centroids"] == worked["centroids"]
        assigned = [p.get("/assign", params={"vector": VECTOR}).json() for p in (first, second)]
        assert assigned[0] == assigned[1]
        stats = second.get("/stats").json()
        assert (stats["role"], stats["phase"], stats["version"]) == (
            "standby", "standby", worked["version"],
        )  # fmt: skip
        assert first.get("/stats").json()["role"] == "worker"

        # -- the worker freezes: its lease expires, the standby takes over ----------------
        first.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: second.role() == "worker", 15, "the standby to take over")
            ingest_until([second], ledger, 5, seed=10)
            rows = check_log_against_ledger(client, MODEL, ledger)
            taken = wait_until(converged_on(second, rows), 30, "convergence after takeover")
            assert taken["version"] > worked["version"]
        finally:
            first.signal(signal.SIGCONT)
        # Awake again, the old worker finds the lease taken and steps down.
        wait_until(lambda: first.role() == "standby", 15, "the old worker to step down")
        assert second.role() == "worker"
        wait_until(
            lambda: (doc := centroids(first)) and doc["version"] >= taken["version"],
            10,
            "the old worker to follow the new one's snapshots",
        )

        # -- kill -9 the new worker: the first takes the lease back at once ---------------
        second.kill()
        wait_until(lambda: first.role() == "worker", 10, "the first process to take over")
        ingest_until([first], ledger, 5, seed=20)
        rows = check_log_against_ledger(client, MODEL, ledger)
        last = wait_until(converged_on(first, rows), 30, "convergence after the second takeover")
        assert last["version"] > taken["version"]
        wait_until(lambda: watch.versions and watch.versions[-1] >= last["version"], 10, "snapshot")

    assert watch.versions == sorted(watch.versions), "a snapshot went back in version"
    assert rows >= ledger.acked_rows() > 0
    client.close()
