"""``kill -9`` of a service serving cosine models (the default one and a named one): the
restarted process rebuilds both from the Redis log of unit rows and converges on the same
unit centroids, the directions of the logged rows' cluster sums; a restart with another
``NMBATCH_METRIC`` is refused at start-up, naming both metrics, and leaves Redis as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from fault_helpers import ServiceProcess

from nmbatch.engine.metric import unit_rows
from nmbatch.service.embedded_redis import EmbeddedRedis
from tests.testkit import logged_samples, npy_bytes, wait_until

pytestmark = pytest.mark.fault

DEFAULT = "cosine-default"
NAMED = "cosine-named"
D, K = 6, 3
NAMED_SPEC = {"k": K, "dim": D, "batch_size": 64, "seed": 4, "metric": "cosine"}


def directions(n: int, seed: int) -> np.ndarray:
    """``n`` samples around ``K`` directions, magnitudes 0.5 to 50: ``(n, D)`` float32."""
    rng = np.random.default_rng(seed)
    axes = np.eye(D)[:K] + 0.1
    U = axes[rng.integers(0, K, size=n)] + 0.1 * rng.standard_normal((n, D))
    return (U * rng.uniform(0.5, 50.0, size=(n, 1))).astype(np.float32)


def converged(base: str, prefix: str, n: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{base}{prefix}/centroids", timeout=5)
        except httpx.TransportError:
            return None
        doc = response.json() if response.status_code == 200 else None
        return doc if doc and doc["converged"] and doc["n_samples"] == n else None

    return wait_until(ready, 90, f"{prefix or 'default'} converged on {n} samples")


def check_spherical(doc: dict[str, Any], rows: np.ndarray) -> np.ndarray:
    """The centroids of ``doc``: unit vectors, each the direction of the sum of the
    logged unit ``rows`` nearest it."""
    C = np.array(doc["centroids"], dtype=np.float64)
    assert doc["metric"] == "cosine"
    np.testing.assert_allclose(np.linalg.norm(C, axis=1), 1.0, atol=2e-7)
    labels = np.argmax(rows.astype(np.float64) @ C.T, axis=1)
    sums = np.stack([rows[labels == j].astype(np.float64).sum(axis=0) for j in range(K)])
    np.testing.assert_allclose(C, sums / np.linalg.norm(sums, axis=1, keepdims=True), atol=2e-6)
    return C


def same_centroids(before: np.ndarray, after: np.ndarray) -> None:
    """The same set of centroids (the order may differ: matched by similarity)."""
    match = np.argmax(before @ after.T, axis=1)
    assert sorted(match.tolist()) == list(range(K))
    np.testing.assert_allclose(after[match], before, atol=2e-6)


def test_a_restart_rebuilds_cosine_models_and_another_metric_is_refused(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis(appendfsync="always").url
    settings: dict[str, object] = dict(
        redis_url=url, model=DEFAULT, k=K, metric="cosine", seed=0, batch_size=64,
        snapshot_seconds=0.2, poll_seconds=0.05, worker_threads=1, worker_lock_seconds=30,
    )  # fmt: skip
    X = directions(900, seed=1)
    Y = directions(600, seed=2)
    first = start_service("first", **settings)
    first.ready()
    with httpx.Client(base_url=first.base, timeout=30) as http:
        assert http.put(f"/models/{NAMED}", json=NAMED_SPEC).status_code == 201
        npy = {"content-type": "application/x-npy"}
        for part in np.array_split(X, 3):
            assert http.post("/samples", content=npy_bytes(part), headers=npy).status_code == 202
        for part in np.array_split(Y, 2):
            answer = http.post(f"/models/{NAMED}/samples", content=npy_bytes(part), headers=npy)
            assert answer.status_code == 202
    client = redis.Redis.from_url(url)
    try:
        for model, data in ((DEFAULT, X), (NAMED, Y)):  # the log holds the unit rows
            np.testing.assert_array_equal(logged_samples(client, model), unit_rows(data))
        before = {
            DEFAULT: check_spherical(converged(first.base, "", len(X)), unit_rows(X)),
            NAMED: check_spherical(
                converged(first.base, f"/models/{NAMED}", len(Y)), unit_rows(Y)
            ),
        }
        first.kill()

        second = start_service("second", **settings)
        second.ready()
        for model, prefix, data in ((DEFAULT, "", X), (NAMED, f"/models/{NAMED}", Y)):
            after = check_spherical(converged(second.base, prefix, len(data)), unit_rows(data))
            same_centroids(before[model], after)
        second.kill()
        entries = client.xlen(f"nmbatch:{DEFAULT}:log")

        # Another metric for the same model: refused at start-up, nothing changed.
        third = start_service("third", **(settings | {"metric": "euclidean"}))
        assert third.proc is not None
        assert third.proc.wait(60) != 0
        assert "NMBATCH_METRIC=euclidean but" in third.log_tail()
        assert "was created with metric=cosine" in third.log_tail()
        assert client.hget(f"nmbatch:{DEFAULT}:meta", "metric") == b"cosine"
        assert client.xlen(f"nmbatch:{DEFAULT}:log") == entries
    finally:
        client.close()
