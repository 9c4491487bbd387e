"""``push(X, ids=...)`` of the Python clients (sync and async) against a real service
process on the session's redis-server: the ids go with their rows chunk by chunk (with
the weights when given), come back in the result, and name the samples for ``sample``
and ``delete_samples``; without ids the result holds the ids the service assigned.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from nmbatch import AsyncClient, Client
from nmbatch.service.client import ConflictError, NotFoundError
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage.codec import decode_chunk, decode_weights
from nmbatch.service.storage.keys import ModelKeys
from nmbatch_client.bodies import as_ids, encode_npz, row_bytes
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import blobs


@pytest.fixture
def service(tmp_path: Path, redis_server: EmbeddedRedis) -> Iterator[tuple[ServiceProcess, str]]:
    """A ready service process on a fresh model of the session's Redis."""
    model = f"ids-{uuid.uuid4().hex[:10]}"
    proc = ServiceProcess(tmp_path, model, redis_url=redis_server.url, model=model, k=3,
                          batch_size=64, worker_threads=1, snapshot_seconds=0.2,
                          poll_seconds=0.05).start()  # fmt: skip
    try:
        proc.ready(60)
        yield proc, model
    finally:
        proc.close()


@pytest.fixture
def redis_log(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        client.close()


def test_push_sends_ids_chunked_with_weights_and_returns_them(
    service: tuple[ServiceProcess, str], redis_log: redis.Redis
) -> None:
    """Ids of strings (sync) and of integers (async) go with their rows and weights in
    chunks of 150 rows; every row's id is in the id map, naming its entry and row; the
    result's ids are those sent (integers as strings); a repeated id is a 409."""
    proc, model = service
    X = blobs(500, 4, 3, seed=41, separation=20.0)
    w = np.random.default_rng(42).integers(1, 5, size=500) / 2.0
    names = [f"doc-{i}" for i in range(300)]
    with Client(proc.base, max_vectors=150) as client:
        pushed = client.push(X[:300], ids=names, weights=w[:300])
        assert (pushed.accepted, pushed.requests) == (300, 2)
        assert pushed.ids == tuple(names)
        with pytest.raises(ConflictError):
            client.push(X[:1], ids=["doc-7"])
        with pytest.raises(ValueError, match="one per row"):
            client.push(X[:3], ids=["a", "b"])
        with pytest.raises(ValueError, match="not a file"):
            client.push(iter([X[:3]]), ids=["a", "b", "c"])

    async def more() -> Any:
        async with AsyncClient(proc.base, max_vectors=150) as client:
            pushed = await client.push(X[300:], ids=range(300, 500), weights=w[300:])
            assert pushed.ids == tuple(str(i) for i in range(300, 500))
            assert pushed.requests == 2
            await client.wait_for(converged=True, min_samples=500, timeout=60)
            return await client.sample(499)

    found = asyncio.run(more())
    assert found["id"] == "499" and found["retained"] is True
    keys = ModelKeys(model)
    entries = {eid.decode(): fields for eid, fields in redis_log.xrange(keys.log)}
    rows = np.concatenate([decode_chunk(f) for f in entries.values()])
    weights = np.concatenate([decode_weights(f) for f in entries.values()])
    assert np.array_equal(rows, X) and np.array_equal(weights, w)
    id_map = {k.decode(): v.decode() for k, v in redis_log.hgetall(keys.sample_ids).items()}
    assert set(id_map) == set(names) | {str(i) for i in range(300, 500)}
    for row, name in [(0, "doc-0"), (299, "doc-299"), (300, "300"), (499, "499")]:
        entry, _, at = id_map[name].partition(" ")
        assert np.array_equal(decode_chunk(entries[entry])[int(at)], X[row])


def test_push_without_ids_returns_the_assigned_ones_which_name_the_samples(
    service: tuple[ServiceProcess, str],
) -> None:
    """Without ids, the result holds the ids the service assigned, one per row in row
    order across chunks; they look samples up and delete them."""
    proc, _ = service
    X = blobs(400, 4, 3, seed=43, separation=20.0)
    with Client(proc.base, max_vectors=128) as client:
        pushed = client.push(X)
        assert pushed.requests == 4 and pushed.ids is not None and len(pushed.ids) == 400
        assert len(set(pushed.ids)) == 400
        entries = [i.rsplit("-", 1) for i in pushed.ids]
        assert [int(row) for _, row in entries[:3]] == [0, 1, 2]
        client.wait_for(converged=True, min_samples=400, timeout=60)
        assert client.sample(pushed.ids[257])["retained"] is True
        gone = client.delete_samples(list(pushed.ids[:10]))
        assert gone == {"deleted": list(pushed.ids[:10]), "not_found": []}
        with pytest.raises(NotFoundError):
            client.sample(pushed.ids[3])


def test_ids_as_bodies_take_their_bytes_into_the_chunks() -> None:
    """Integer ids are ``int64``, mixed ones strings; a row's bytes count its id, so a
    chunk of rows with ids fits the body limit (checked on the ``.npz`` bytes)."""
    assert as_ids([1, 2, 3], 3).dtype == np.int64
    mixed = as_ids([1, "b", np.int64(3)], 3)
    assert mixed.dtype.kind == "U" and mixed.tolist() == ["1", "b", "3"]
    with pytest.raises(ValueError, match="longer than 128"):
        as_ids(["x" * 129], 1)
    with pytest.raises(ValueError, match="not a string"):
        as_ids([1.5], 1)
    X = np.zeros((1000, 8), dtype=np.float32)
    ids = as_ids([f"sample-{i:06d}" for i in range(1000)], 1000)
    size = row_bytes(X, None, ids)
    assert size == 32 + ids.dtype.itemsize
    body, _ = encode_npz(X, None, ids)
    assert len(body) <= 1000 * size + 1024
