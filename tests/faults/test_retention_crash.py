"""``kill -9`` of a service that forgets (window, reservoir), during ingestion, trimming
and compaction: Redis still holds every retained sample once, and a restart serves
exactly the policy's size. Real service processes, a real ``redis-server``."""

from __future__ import annotations

import random
from collections.abc import Callable

import httpx
import numpy as np
import pytest
import redis
from fault_helpers import Ingestor, Ledger, ServiceProcess, http_post

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage import ModelKeys
from nmbatch.service.storage.codec import decode_chunk, id_key
from nmbatch.service.storage.retained import RetainedLog
from tests.testkit import wait_until

MODEL = "forgetting"
SIZE = 30_000


def _retained_in_redis(client: redis.Redis) -> tuple[np.ndarray, np.ndarray]:
    """(rows of the base, rows of the log after it): what a restart rebuilds from."""
    keys = ModelKeys(MODEL)
    retained = RetainedLog(client, keys)
    base = retained.read_base()
    parts = [X for _, X, _ in retained.base_rows(base)] if base is not None else []
    after = id_key(base.last_id) if base is not None else (0, 0)
    logged = [
        decode_chunk(fields)
        for entry_id, fields in client.xrange(keys.log)
        if id_key(entry_id.decode()) > after
    ]
    empty = np.empty((0, 8), np.float32)
    return (np.concatenate(parts) if parts else empty), (
        np.concatenate(logged) if logged else empty
    )


@pytest.mark.parametrize("retention", ["window", "reservoir"])
def test_kill_9_while_forgetting_loses_and_duplicates_no_retained_sample(
    retention: str,
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis(appendfsync="everysec").url
    settings = dict(
        model=MODEL, k=3, batch_size=256, poll_seconds=0.05, worker_threads=1,
        worker_lock_seconds=30, redis_url=url, retention=retention, max_samples=SIZE, seed=4,
    )  # fmt: skip
    client = redis.Redis.from_url(url)
    meta = ModelKeys(MODEL).meta
    ledger = Ledger()
    rng = random.Random(1)
    for round_ in range(3):
        service = start_service(f"round-{round_}", **settings)
        service.ready(60)
        floor = int(client.hget(meta, "n_samples") or 0)
        generation = int(client.hget(meta, "base_generation") or 0)
        with Ingestor(http_post(service.base), ledger, threads=2, sizes=(1_000, 9_000),
                      seed=round_) as ingest:  # fmt: skip
            # Past a reservoir's compaction threshold (100,000 samples) in every round.
            wait_until(lambda f=floor: int(client.hget(meta, "n_samples") or 0) > f + 110_000,
                       120, "ingestion")  # fmt: skip
            # The worker at work: it has trimmed the log, or compacted the reservoir.
            if retention == "window":
                wait_until(lambda s=service: s.get("/stats").json()["n_retired"] > 0, 60, "trims")
            else:
                wait_until(lambda g=generation: int(client.hget(meta, "base_generation") or 0)
                           > g, 60, "a compaction")  # fmt: skip
            wait_until(lambda: rng.random() < 0.05, 5)  # a random moment, then the kill
            service.kill()
            ingest.stop()
    if retention == "reservoir":
        assert int(client.hget(meta, "base_generation") or 0) >= 3  # one per round

    ingested = int(client.hget(meta, "n_samples"))
    assert ingested >= ledger.acked_rows() > 3 * 110_000
    base, logged = _retained_in_redis(client)
    rows = np.concatenate([base, logged])
    tags = rows[:, 0].astype(np.int64) * 100_000 + rows[:, 1].astype(np.int64)
    assert np.unique(tags).shape[0] == tags.shape[0], "a retained sample is stored twice"
    assert set(np.unique(rows[:, 0]).astype(int)) <= set(ledger.rows), "rows never sent"
    if retention == "reservoir":
        assert base.shape[0] == SIZE  # the reservoir was full at every compaction

    final = start_service("final", **settings)
    final.ready(60)
    with httpx.Client(base_url=final.base, timeout=10) as http:

        last: list[dict] = [{}]

        def caught_up() -> dict | None:
            response = http.get("/centroids")
            doc = response.json() if response.status_code == 200 else {}
            last[0] = {k: v for k, v in doc.items() if k != "centroids"}
            done = doc.get("n_ingested") == ingested and doc.get("converged")
            return doc if done and doc["n_samples"] == SIZE else None

        try:
            doc = wait_until(caught_up, 90, "the restarted model")
        except BaseException:
            print("last /centroids:", last[0], "ingested:", ingested)
            print("stats:", http.get("/stats").json())
            raise
        assert doc["retention"] == retention and sum(doc["counts"]) == SIZE
        # Caught up, the worker has trimmed (window) or compacted (reservoir) the log.
        base, logged = _retained_in_redis(client)
        if retention == "window":
            assert base.shape[0] == 0
            wait_until(lambda: SIZE <= _retained_in_redis(client)[1].shape[0] <= SIZE + 9_000,
                       10, "the trim")  # fmt: skip (the window, in whole entries)
        else:
            assert base.shape[0] == SIZE and logged.shape[0] < 110_000
    client.close()
