"""``kill -9`` of a service serving weighted models (the default one, fed by the Python
client's ``push(weights=)`` as ``.npz`` bodies, and a named one fed JSON ``weights``):
the restarted process replays the Redis log, weights included, into new engine
processes and converges on the same centroids and counts, the weighted means of the
logged rows nearest them (weight 0: stored, counted nowhere).
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
from nmbatch.service.storage.codec import decode_chunk, decode_weights
from nmbatch_client import Client
from tests.testkit import blobs, wait_until

pytestmark = pytest.mark.fault

DEFAULT = "weights-default"
NAMED = "weights-named"
D, K = 5, 3
NAMED_SPEC = {"k": K, "dim": D, "batch_size": 64, "seed": 4}


def converged(base: str, prefix: str, n: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{base}{prefix}/centroids", timeout=5)
        except httpx.TransportError:
            return None
        doc = response.json() if response.status_code == 200 else None
        return doc if doc and doc["converged"] and doc["n_samples"] == n else None

    return wait_until(ready, 90, f"{prefix or 'default'} converged on {n} samples")


def logged(client: redis.Redis, model: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows and weights of the model's log, in order."""
    entries = client.xrange(f"nmbatch:{model}:log")
    rows = np.concatenate([decode_chunk(fields) for _, fields in entries])
    weights = [decode_weights(fields) for _, fields in entries]
    assert all(w is not None for w in weights)
    return rows, np.concatenate(weights)  # type: ignore[arg-type]


def weighted_means(doc: dict[str, Any], rows: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The centroids of ``doc``: each the weighted mean of the rows nearest it, each count
    the sum of their weights (exactly: dyadic weights)."""
    C = np.asarray(doc["centroids"], dtype=np.float64)
    X = rows.astype(np.float64)
    labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
    sums = np.bincount(labels, weights=w, minlength=K)
    assert np.array_equal(np.asarray(doc["counts"], dtype=np.float64), sums)
    for j in range(K):
        mean = (w[labels == j, None] * X[labels == j]).sum(0) / sums[j]
        np.testing.assert_allclose(C[j], mean, rtol=1e-5, atol=1e-5)
    return C


def test_weights_survive_a_kill_and_a_replay(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis(appendfsync="always").url
    settings: dict[str, object] = dict(
        redis_url=url, model=DEFAULT, k=K, seed=0, batch_size=64, snapshot_seconds=0.2,
        poll_seconds=0.05, worker_threads=1, worker_lock_seconds=30,
    )  # fmt: skip
    rng = np.random.default_rng(1)
    X, Y = blobs(900, D, K, seed=2), blobs(600, D, K, seed=3)
    wx = rng.integers(0, 8, size=900) / 4.0  # 0 to 1.75, dyadic
    wy = rng.integers(0, 5, size=600).astype(np.float64)
    first = start_service("first", **settings)
    first.ready()
    with Client(first.base) as default, Client(first.base, model=NAMED) as named:
        assert httpx.put(f"{first.base}/models/{NAMED}", json=NAMED_SPEC).status_code == 201
        pushed = default.push(X, weights=wx)
        assert pushed.accepted == 900
        for part in np.array_split(np.arange(600), 3):
            body = {"vectors": Y[part].tolist(), "weights": wy[part].tolist()}
            answer = httpx.post(f"{first.base}/models/{NAMED}/samples", json=body)
            assert answer.status_code == 202, answer.text
        assert named.stats()["n_logged"] == 600
    client = redis.Redis.from_url(url)
    try:
        before = {}
        for model, prefix, data, w in ((DEFAULT, "", X, wx), (NAMED, f"/models/{NAMED}", Y, wy)):
            rows, weights = logged(client, model)
            assert np.array_equal(rows, data) and np.array_equal(weights, w)
            before[model] = weighted_means(converged(first.base, prefix, len(data)), data, w)
        first.kill()

        second = start_service("second", **settings)
        second.ready()
        for model, prefix, data, w in ((DEFAULT, "", X, wx), (NAMED, f"/models/{NAMED}", Y, wy)):
            after = weighted_means(converged(second.base, prefix, len(data)), data, w)
            match = ((before[model][:, None] - after[None]) ** 2).sum(-1).argmin(1)
            assert sorted(match.tolist()) == list(range(K))
            np.testing.assert_allclose(after[match], before[model], rtol=1e-5, atol=1e-5)
    finally:
        client.close()
