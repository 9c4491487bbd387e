"""``kill -9`` of a service after its window pruned tombstones: the restarted process
(a new ``python -m nmbatch`` on the same redis-server, appendonly with fsync always)
replays the trimmed log with the tombstones left, and no deleted row comes back, neither
those whose tombstones went with their trimmed entries nor those still tombstoned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from fault_helpers import ServiceProcess

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage.keys import ModelKeys
from tests.testkit import assert_centroids_are_means, blobs, wait_until

pytestmark = pytest.mark.fault

MODEL = "tombstone-pruning"
D, K, W = 5, 3, 300


def converged(base: str, n: int, ingested: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{base}/centroids", timeout=5)
        except httpx.TransportError:
            return None
        doc = response.json() if response.status_code == 200 else None
        if doc and doc["converged"] and doc["n_samples"] == n and doc["n_ingested"] == ingested:
            return doc
        return None

    return wait_until(ready, 90, f"converged on {n} of {ingested} samples")




def push(base: str, X: np.ndarray, first: int) -> list[str]:
    """``X`` in requests of 50 rows, without ids: the ids the service assigned."""
    ids: list[str] = []
    for start in range(0, X.shape[0], 50):
        answer = httpx.post(f"{base}/samples", json={"vectors": X[start : start + 50].tolist()},
                            timeout=30)  # fmt: skip
        assert answer.status_code == 202, answer.text
        ids += answer.json()["ids"]
    return ids


def test_no_deleted_row_comes_back_after_pruning_and_kill_9(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    server = start_redis(appendfsync="always")
    settings: dict[str, object] = dict(
        redis_url=server.url, model=MODEL, k=K, seed=0, batch_size=64, snapshot_seconds=0.2,
        poll_seconds=0.05, worker_threads=1, worker_lock_seconds=30, retention="window",
        max_samples=W,
    )  # fmt: skip
    X = blobs(500, D, K, seed=61)
    keys = ModelKeys(MODEL)
    admin = redis.Redis.from_url(server.url)
    first = start_service("first", **settings)
    first.ready()
    ids = push(first.base, X[:300], 0)
    converged(first.base, 300, 300)
    old = np.arange(0, 200, 5)  # 40 rows of the entries the window will trim
    young = np.arange(201, 300, 9)  # 11 rows of entries it keeps
    gone = np.concatenate([old, young])
    answer = httpx.post(f"{first.base}/samples/delete", json={"ids": [ids[i] for i in gone]},
                        timeout=30)  # fmt: skip
    assert answer.status_code == 200 and len(answer.json()["deleted"]) == gone.shape[0]
    assert admin.hlen(keys.deleted) == gone.shape[0]
    ids += push(first.base, X[300:], 300)  # rows 0-199 leave: their entries are trimmed
    kept = np.setdiff1d(np.arange(200, 500), young)
    assert_centroids_are_means(converged(first.base, kept.shape[0], 500), X[kept])
    wait_until(lambda: admin.hlen(keys.deleted) == young.shape[0] or None, 30, "pruned")
    first.kill()

    second = start_service("second", **settings)
    second.ready()
    doc = converged(second.base, kept.shape[0], 500)
    assert_centroids_are_means(doc, X[kept])
    for i in gone:
        answer = httpx.get(f"{second.base}/samples/{ids[i]}", timeout=30)
        assert answer.status_code == 404, (i, answer.text)
    answer = httpx.post(f"{second.base}/samples/delete", json={"ids": [ids[i] for i in gone]},
                        timeout=30)  # fmt: skip
    assert answer.json()["deleted"] == []
    assert admin.hlen(keys.deleted) == young.shape[0]
    admin.close()
