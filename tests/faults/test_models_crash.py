"""``kill -9`` of the service while two models ingest (the default one and a named one):
after a restart nothing acknowledged is lost on either, nothing unacknowledged is
half-stored, and both models converge on exactly their logged samples.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis
from fault_helpers import (
    Ingestor,
    Ledger,
    PostFn,
    ServiceProcess,
    check_log_against_ledger,
)

from nmbatch.service.embedded_redis import EmbeddedRedis
from tests.testkit import wait_until

pytestmark = pytest.mark.fault

DEFAULT = "crash-default"
NAMED = "crash-named"
NAMED_SPEC = {"k": 3, "dim": 8, "batch_size": 256, "rho": 100, "seed": 3}


def poster(base: str, path: str) -> PostFn:
    """A thread-local httpx poster of ``.npy`` bodies to ``{base}{path}``."""
    local = threading.local()

    def post(body: bytes) -> tuple[int, Any, Any]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=base, timeout=20)
        response = client.post(path, content=body, headers={"content-type": "application/x-npy"})
        doc = response.json() if response.content else None
        return response.status_code, response.headers, doc

    return post


def test_kill_9_during_ingestion_on_two_models_loses_nothing_acknowledged_on_either(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis(appendfsync="everysec").url
    settings: dict[str, object] = dict(
        redis_url=url,
        model=DEFAULT,
        k=3,
        batch_size=256,
        snapshot_seconds=1,
        poll_seconds=0.1,
        worker_threads=1,
        worker_lock_seconds=30,  # the restart must take over at once, not on expiry
    )
    first = start_service("first", **settings)
    first.ready()
    with httpx.Client(base_url=first.base, timeout=30) as http:
        assert http.put(f"/models/{NAMED}", json=NAMED_SPEC).status_code == 201

    ledgers = {DEFAULT: Ledger(), NAMED: Ledger()}
    # Batches of 33,000 rows span two log entries (1 MiB each): all or nothing.
    ingestors = [
        Ingestor(poster(first.base, "/samples"), ledgers[DEFAULT], threads=2,
                 sizes=(400, 33_000), pause=0.05, seed=0),
        Ingestor(poster(first.base, f"/models/{NAMED}/samples"), ledgers[NAMED], threads=2,
                 sizes=(300, 33_000), pause=0.05, seed=10),
    ]  # fmt: skip
    for ingest in ingestors:
        ingest.__enter__()
    try:
        wait_until(
            lambda: all(len(ledger.acked) >= 8 for ledger in ledgers.values()),
            90,
            "acknowledged batches on both models",
        )
        first.kill()
    finally:
        for ingest in ingestors:
            ingest.stop()

    second = start_service("second", **settings)
    second.ready()
    client = redis.Redis.from_url(url)
    try:
        with httpx.Client(base_url=second.base, timeout=10) as http:
            for model, prefix in ((DEFAULT, ""), (NAMED, f"/models/{NAMED}")):
                rows = check_log_against_ledger(client, model, ledgers[model])
                assert rows >= ledgers[model].acked_rows() > 0

                def done(prefix: str = prefix, rows: int = rows) -> bool:
                    response = http.get(f"{prefix}/centroids")
                    doc = response.json() if response.status_code == 200 else {}
                    return bool(doc.get("converged")) and doc.get("n_samples") == rows

                wait_until(done, 90, f"{model} converged on its {rows} logged samples")
                stats = http.get(f"{prefix}/stats").json()
                assert (stats["N"], stats["n_logged"], stats["role"]) == (rows, rows, "worker")
            listed = [m["name"] for m in http.get("/models").json()["models"]]
            assert listed == [DEFAULT, NAMED]
    finally:
        client.close()


def test_a_second_process_takes_over_a_named_model_when_its_worker_is_killed(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis(appendfsync="everysec").url
    settings: dict[str, object] = dict(
        redis_url=url, model=DEFAULT, k=3, batch_size=256, snapshot_seconds=0.5,
        poll_seconds=0.1, worker_threads=1, worker_lock_seconds=30,
    )  # fmt: skip
    first = start_service("first", **settings)
    first.ready()
    second = start_service("second", **settings)
    second.ready()
    named = f"/models/{NAMED}"
    ledger = Ledger()
    with httpx.Client(base_url=first.base, timeout=30) as http:
        assert http.put(named, json=NAMED_SPEC).status_code == 201
        assert http.get(named).json()["status"]["role"] == "worker"
    with httpx.Client(base_url=second.base, timeout=30) as http:
        # The second process starts the model on its own (registry sync), as a standby.
        wait_until(lambda: http.get(named).json()["status"]["role"] == "standby", 20, "a standby")
    with Ingestor(poster(first.base, f"{named}/samples"), ledger, threads=2, sizes=(300,)):
        wait_until(lambda: len(ledger.acked) >= 10, 60, "acknowledged batches")
        first.kill()
    client = redis.Redis.from_url(url)
    try:
        with httpx.Client(base_url=second.base, timeout=10) as http:
            wait_until(lambda: http.get(named).json()["status"]["role"] == "worker", 20, "takeover")
            rows = check_log_against_ledger(client, NAMED, ledger)
            assert rows >= ledger.acked_rows() > 0

            def done() -> bool:
                doc = http.get(f"{named}/centroids").json()
                return bool(doc.get("converged")) and doc.get("n_samples") == rows

            wait_until(done, 60, f"the second process converged on the {rows} samples")
    finally:
        client.close()
