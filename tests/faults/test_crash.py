"""``kill -9`` of the service in the middle of concurrent ingestion: nothing acknowledged
is lost, nothing unacknowledged is half-stored, and the centroid version never goes back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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

from nmbatch.service.embedded_redis import EmbeddedRedis, embedded_url, free_port
from nmbatch.service.storage import ModelKeys
from tests.testkit import wait_until

pytestmark = pytest.mark.fault

MODEL = "crash"


class VersionWatcher(BackgroundLoop):
    """A client reading ``/centroids`` in a loop; remembers the highest version it saw."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base
        self.seen: list[int] = []

    def loop(self) -> None:
        with httpx.Client(base_url=self.base, timeout=5) as http:
            while not self.stopping.is_set():
                try:
                    response = http.get("/centroids")
                except httpx.TransportError:
                    self.stopping.wait(0.02)
                    continue
                if response.status_code == 200:
                    self.seen.append(response.json()["version"])
                self.stopping.wait(0.01)

    @property
    def highest(self) -> int:
        return max(self.seen, default=0)


@pytest.mark.parametrize("redis_kind", ["external", "embedded"])
def test_kill_9_during_ingestion_loses_no_acknowledged_sample_and_keeps_the_version(
    redis_kind: str,
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
    tmp_path: Path,
) -> None:
    settings: dict[str, object] = dict(
        model=MODEL,
        k=3,
        batch_size=256,
        snapshot_seconds=1,  # the snapshot lags behind the versions clients see
        poll_seconds=0.1,
        worker_threads=1,
        # Long: the restarted process must see that the killed holder is gone (its
        # connection closed; or, with the embedded Redis, that Redis restarted) and take
        # over at once, not wait for the lease to expire.
        worker_lock_seconds=30,
    )
    if redis_kind == "external":
        url = start_redis(appendfsync="everysec").url
        settings["redis_url"] = url
    else:  # the service's own redis-server child; it stops when the service dies
        port = free_port()
        settings.update(data_dir=tmp_path / "data", embedded_redis_port=port)
    first = start_service("first", **settings)
    assert first.ready()["role"] == "worker"
    if redis_kind != "external":  # the service's secret, in its data folder
        url = embedded_url(tmp_path / "data", port)
    client = redis.Redis.from_url(url)
    keys = ModelKeys(MODEL)

    def snapshot_version() -> int:
        return int(client.hget(keys.snapshot, "version") or 0)

    ledger = Ledger()
    # Batches of 33,000 rows span two log entries (1 MiB each): all or nothing.
    ingest = Ingestor(http_post(first.base), ledger, threads=3, sizes=(400, 33_000), pause=0.05)
    with ingest, VersionWatcher(first.base) as watcher:
        wait_until(
            lambda: len(ledger.acked) >= 10 and watcher.highest > snapshot_version() > 0,
            60,
            "acknowledged batches, a snapshot, and versions seen ahead of it",
        )
        in_snapshot = snapshot_version()  # before the kill: an embedded Redis goes with it
        first.kill()
        seen = watcher.highest
    assert seen > in_snapshot  # what a client saw is newer than what Redis holds
    client.close()

    second = start_service("second", **settings)
    second.ready()
    client = redis.Redis.from_url(url)
    with httpx.Client(base_url=second.base, timeout=10) as http:
        wait_until(lambda: http.get("/readyz").json()["role"] == "worker", 10, "takeover")
        rows = check_log_against_ledger(client, MODEL, ledger)
        assert rows >= ledger.acked_rows() > 0

        versions: list[int] = []

        def converged() -> bool:
            response = http.get("/centroids")
            if response.status_code != 200:
                return False
            doc = response.json()
            versions.append(doc["version"])
            return doc["converged"] and doc["n_samples"] == rows

        wait_until(converged, 60, f"convergence on the {rows} logged samples")
        stats = http.get("/stats").json()
    assert (stats["N"], stats["b"], stats["n_logged"]) == (rows, rows, rows)
    assert min(versions) > seen, f"served version {min(versions)} after {seen} was seen"
    assert versions == sorted(versions)
    client.close()
