"""Redis goes away under load and comes back: 503s instead of false acknowledgements,
reads from memory, a worker that goes on iterating, and recovery without a restart.

Also the persistence half of the promise: Redis stopped with ``SHUTDOWN`` (append-only
file, ``appendfsync everysec``) or killed with ``kill -9`` (``appendfsync always``) and
started again on the same folder and port loses no acknowledged sample.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from fault_helpers import (
    BackgroundLoop,
    Ingestor,
    Ledger,
    check_log_against_ledger,
    stop_redis,
)

from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.main import REQUEST_SOCKET_TIMEOUT, create_app
from nmbatch.service.storage import ModelRepository
from nmbatch.service.worker import Worker
from tests.testkit import TestClient, metric, wait_until

pytestmark = pytest.mark.fault

MODEL = "outage"
VECTOR = ",".join(["1"] * 8)
LOCK_SECONDS = 2.0


class StepGate:
    """Holds the worker's next iteration until released (the Redis it talks to is real)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.reached = threading.Event()
        self.go = threading.Event()
        step = Worker._step
        gate = self

        def gated(worker: Worker) -> None:
            if gate.armed:
                gate.armed = False
                gate.reached.set()
                gate.go.wait(60)
            step(worker)

        monkeypatch.setattr(Worker, "_step", gated)


class Reader(BackgroundLoop):
    """A client calling ``GET /centroids`` and ``GET /assign`` in a loop, by phase."""

    def __init__(self, client: TestClient) -> None:
        super().__init__()
        self.client = client
        self.phase = "before"
        self.statuses: dict[str, list[int]] = {}

    def loop(self) -> None:
        while not self.stopping.is_set():
            phase = self.phase
            for response in (
                self.client.get("/centroids"),
                self.client.get("/assign", params={"vector": VECTOR}),
            ):
                self.statuses.setdefault(phase, []).append(response.status_code)
            self.stopping.wait(0.01)


def settings_for(server: EmbeddedRedis, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        redis_url=server.url,
        model=MODEL,
        k=3,
        batch_size=64,
        snapshot_seconds=0.2,
        poll_seconds=0.05,
        worker_threads=1,
        worker_lock_seconds=LOCK_SECONDS,
        redis_retry_seconds=2.0,
    )
    values.update(overrides)
    return Settings(**values)


def poster(client: TestClient) -> Callable[[bytes], tuple[int, Any, Any]]:
    def post(body: bytes) -> tuple[int, Any, Any]:
        response = client.post(
            "/samples", content=body, headers={"content-type": "application/x-npy"}
        )
        return response.status_code, response.headers, response.json()

    return post


def converged_on(
    client: TestClient, n: int | None = None, after_iteration: int = -1
) -> Callable[[], dict | None]:
    def check() -> dict | None:
        response = client.get("/centroids")
        if response.status_code != 200:
            return None
        doc = response.json()
        if not doc["converged"] or doc["iteration"] <= after_iteration:
            return None
        return doc if n is None or doc["n_samples"] == n else None

    return check


@pytest.mark.parametrize(("how", "appendfsync"), [("shutdown", "everysec"), ("kill -9", "always")])
def test_redis_outage_under_load_then_recovery_loses_nothing_acknowledged(
    how: str,
    appendfsync: str,
    start_redis: Callable[..., EmbeddedRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = start_redis(appendfsync=appendfsync)
    port, url = server.port, server.url
    gate = StepGate(monkeypatch)
    ledger = Ledger()
    with TestClient(create_app(settings_for(server))) as client:
        ingest = Ingestor(poster(client), ledger, threads=2, sizes=(50, 300), pause=0.01)
        with ingest, Reader(client) as reader:
            wait_until(lambda: len(ledger.acked) >= 5, 30, "acknowledged batches")
            wait_until(lambda: client.get("/centroids").status_code == 200, 30, "centroids")
            gate.armed = True
            assert gate.reached.wait(30), "the worker did not iterate"
            before = client.get("/centroids").json()

            # -- Redis goes away ---------------------------------------------------------
            stop_redis(server, how)
            outage = time.monotonic()
            reader.phase = "outage"

            def refused() -> dict | None:
                with ledger.lock:
                    late = [p for p in ledger.problems if p["at"] > outage]
                return late[-1] if late else None

            problem = wait_until(refused, 15, "a 503 answer to POST /samples")
            assert problem["headers"]["retry-after"] == "2"
            assert problem["headers"]["content-type"] == "application/problem+json"
            assert problem["body"]["type"] == "urn:nmbatch:problem:storage-unavailable"
            assert problem["body"]["status"] == 503

            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["ready"] is False and ready.json()["role"] == "worker"
            assert client.get("/centroids").json()["version"] >= before["version"]
            assigned = client.get("/assign", params={"vector": VECTOR})
            assert assigned.status_code == 200

            # The worker goes on with the samples it holds, without Redis.
            gate.go.set()
            during = wait_until(
                converged_on(client, after_iteration=before["iteration"]),
                30,
                "convergence during the outage",
            )
            assert during["iteration"] > before["iteration"]
            assert during["version"] > before["version"]
            assert not client.get("/readyz").json()["ready"]  # still away
            # Longer than the lease's expiry: it has expired when Redis loads it again, and
            # the worker takes it again (nobody else reserved versions) without a replay.
            time.sleep(max(0.0, LOCK_SECONDS + 0.5 - (time.monotonic() - outage)))

            # -- Redis comes back on the same port and folder ---------------------------
            start_redis(port=port, appendfsync=appendfsync)
            reader.phase = "after"
            wait_until(lambda: client.get("/readyz").status_code == 200, 30, "ready again")
            acked = len(ledger.acked)
            wait_until(lambda: len(ledger.acked) >= acked + 5, 30, "ingestion to resume")

        assert reader.statuses["outage"] and set(reader.statuses["outage"]) == {200}
        assert set(reader.statuses["after"]) == {200}
        check_client = redis.Redis.from_url(url)
        rows = check_log_against_ledger(check_client, MODEL, ledger)
        assert rows >= ledger.acked_rows() > 0
        final = wait_until(converged_on(client, rows), 60, f"convergence on {rows} samples")
        assert final["version"] > during["version"]
        stats = client.get("/stats").json()
        assert (stats["N"], stats["n_logged"], stats["role"]) == (rows, rows, "worker")
        assert metric(client.get("/metrics").text, "nmbatch_is_worker", model=MODEL) == 1.0

        # Snapshots resumed: the converged version reaches Redis.
        repository = ModelRepository(check_client, MODEL)
        wait_until(
            lambda: (repository.snapshot_version() or 0) >= final["version"], 10, "a snapshot"
        )
        check_client.close()


def test_a_frozen_redis_makes_requests_fail_fast_instead_of_hanging(
    start_redis: Callable[..., EmbeddedRedis],
) -> None:
    server = start_redis()
    ledger = Ledger()
    with TestClient(create_app(settings_for(server, model="frozen"))) as client:
        post = poster(client)
        with Ingestor(post, ledger, threads=1, sizes=(100,), pause=0.01):
            wait_until(lambda: len(ledger.acked) >= 3, 30, "acknowledged batches")
        doc = wait_until(converged_on(client), 30, "convergence")
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with Ingestor(post, ledger, threads=1, sizes=(100,)) as frozen:
                wait_until(lambda: ledger.refused, 3 * REQUEST_SOCKET_TIMEOUT, "a 503")
                frozen.stopping.set()
            # The first request waited for the socket timeout, not forever.
            assert time.monotonic() - started < 3 * REQUEST_SOCKET_TIMEOUT
            assert set(ledger.refused.values()) == {503}
            assert client.get("/centroids").json()["version"] >= doc["version"]
            assert client.get("/assign", params={"vector": VECTOR}).status_code == 200
            assert client.get("/readyz").status_code == 503
        finally:
            server.process.send_signal(signal.SIGCONT)
        wait_until(lambda: client.get("/readyz").status_code == 200, 30, "ready again")
        with Ingestor(post, ledger, threads=1, sizes=(100,), seed=5) as again:
            acked = len(ledger.acked)
            wait_until(lambda: len(ledger.acked) > acked + 2, 30, "ingestion to resume")
            again.stopping.set()
        check_client = redis.Redis.from_url(server.url)
        # A request that timed out may still have been applied once Redis woke up; it is
        # whole or absent, never half-stored.
        rows = check_log_against_ledger(check_client, "frozen", ledger)
        check_client.close()
        wait_until(converged_on(client, rows), 30, f"convergence on {rows} samples")
