"""Sample weights in the capacity plan: a weighted row costs :data:`WEIGHT_BYTES` more
in the engine's store and about as much in the Redis log, and the plan counts both.

Measured, not assumed: a real :class:`~nmbatch.engine.store.NestedBatchStore` holding
weighted and unweighted rows, and the session's redis-server (``used_memory``) holding
log entries written as the service writes them (:func:`~nmbatch.service.storage.codec.
encode_chunks`, one ``XADD`` per entry), with and without their ``w`` field.
"""

from __future__ import annotations

import uuid

import numpy as np
import redis

from nmbatch.engine.store import NestedBatchStore
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage.capacity import (
    ENGINE_SAMPLE_BYTES,
    WEIGHT_BYTES,
    bytes_per_vector,
    engine_bytes_per_vector,
    plan_capacity,
    redis_bytes_per_vector,
)
from nmbatch.service.storage.codec import encode_chunks

N, D, K = 100_000, 32, 8


def test_the_engine_keeps_weight_bytes_more_per_weighted_row_and_the_plan_counts_them() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N, D)).astype(np.float32)
    plain, weighted = NestedBatchStore(D, seed=0), NestedBatchStore(D, seed=0)
    plain.append(X)
    weighted.append(X, weights=rng.uniform(0.5, 2.0, N))
    assert weighted.weighted and not plain.weighted
    rows = weighted.weights_buffer.shape[0]  # the rows the store has room for
    assert rows >= N and weighted.nbytes - plain.nbytes == WEIGHT_BYTES * rows
    assert WEIGHT_BYTES == 8
    # The plan: row, id, weight, lower bounds, per-sample state.
    assert engine_bytes_per_vector(D, K) == 4 * D + 8 + WEIGHT_BYTES + 4 * K + ENGINE_SAMPLE_BYTES
    GiB = 1 << 30
    plan = plan_capacity(None, D, K, memory=(8 * GiB, "test"), with_redis=True)
    assert plan.max_samples == (4 * GiB) // bytes_per_vector(D, K, with_redis=True)
    assert "engine 208 + Redis" in plan.detail  # 128 + 8 + 8 + 32 + 32


def test_the_redis_log_keeps_about_weight_bytes_more_per_weighted_row(
    redis_server: EmbeddedRedis,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((N, D)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, N)

    def per_row(weights: np.ndarray | None) -> float:
        key = f"capacity-weights-{uuid.uuid4().hex}"
        before = int(client.info("memory")["used_memory"])
        for start in range(0, N, 10_000):  # requests of 10,000 rows
            part = None if weights is None else weights[start : start + 10_000]
            for fields in encode_chunks(X[start : start + 10_000], part):
                client.xadd(key, fields)  # type: ignore[arg-type]
        used = int(client.info("memory")["used_memory"]) - before
        client.delete(key)
        return used / N

    try:
        unweighted, weighted = per_row(None), per_row(w)
    finally:
        client.close()
    # jemalloc rounds the x and w fields to their size classes apart: measured 4.1 bytes
    # more a row at d = 32 in requests of 10,000 rows (redis-server 7).
    assert 0 < weighted - unweighted <= 2 * WEIGHT_BYTES
    assert weighted <= redis_bytes_per_vector(D)  # the plan holds a weighted log
    assert redis_bytes_per_vector(D) - weighted < 0.1 * 4 * D  # and not much more
