"""``kill -9`` of a service right after deletions: the restarted process replays the
Redis log into a new engine process, consults the tombstones, and serves a model
without the deleted samples (its centroids the means of the remaining rows nearest
them); the deleted ids answer 404, the others their nearest centroid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from fault_helpers import ServiceProcess

from nmbatch.service.embedded_redis import EmbeddedRedis
from tests.testkit import assert_centroids_are_means, blobs, wait_until

pytestmark = pytest.mark.fault

MODEL = "deletion-restart"
D, K = 5, 3


def converged(base: str, n: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{base}/centroids", timeout=5)
        except httpx.TransportError:
            return None
        doc = response.json() if response.status_code == 200 else None
        return doc if doc and doc["converged"] and doc["n_samples"] == n else None

    return wait_until(ready, 90, f"converged on {n} samples")




def test_deleted_samples_stay_deleted_after_kill_9(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis(appendfsync="always").url
    settings: dict[str, object] = dict(
        redis_url=url, model=MODEL, k=K, seed=0, batch_size=64, snapshot_seconds=0.2,
        poll_seconds=0.05, worker_threads=1, worker_lock_seconds=30,
    )  # fmt: skip
    X = blobs(600, D, K, seed=31)
    first = start_service("first", **settings)
    first.ready()
    ids = [f"row-{i}" for i in range(400)]
    answer = httpx.post(f"{first.base}/samples", json={"vectors": X[:400].tolist(), "ids": ids})
    assert answer.status_code == 202, answer.text
    answer = httpx.post(f"{first.base}/samples", json={"vectors": X[400:].tolist()})
    ids += answer.json()["ids"]
    converged(first.base, 600)
    gone = np.random.default_rng(32).choice(600, size=150, replace=False)
    answer = httpx.post(f"{first.base}/samples/delete", json={"ids": [ids[i] for i in gone]},
                        timeout=30)  # fmt: skip
    assert answer.status_code == 200 and len(answer.json()["deleted"]) == 150, answer.text
    kept = np.setdiff1d(np.arange(600), gone)
    first.kill()  # right after the DELETE answered: maybe before any snapshot of it

    second = start_service("second", **settings)
    second.ready()
    doc = converged(second.base, kept.shape[0])
    assert_centroids_are_means(doc, X[kept])
    for i in gone[:20]:
        answer = httpx.get(f"{second.base}/samples/{ids[i]}", timeout=30)
        assert answer.status_code == 404, answer.text
    C = np.asarray(doc["centroids"], dtype=np.float64)
    for i in kept[:20]:
        answer = httpx.get(f"{second.base}/samples/{ids[i]}", timeout=30)
        assert answer.status_code == 200, answer.text
        expected = int(((C - X[i].astype(np.float32)) ** 2).sum(1).argmin())
        assert answer.json()["cluster"] == expected
