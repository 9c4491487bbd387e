"""Redis persistence: binary codecs, key names, snapshots that never go back in version,
the dimension fixed by the first batch."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis
import redis.asyncio

from nmbatch.engine.state import ModelState
from nmbatch.service.problems import problem_of
from nmbatch.service.state import PublishedModel
from nmbatch.service.storage import (
    CHUNK_BYTES,
    AsyncSampleLog,
    ModelConfigError,
    ModelKeys,
    ModelRepository,
    Snapshot,
    WrongDimensionError,
    decode_chunk,
    encode_chunks,
)
from nmbatch.service.usecases import errors
from nmbatch.service.usecases.serving import ingest
from tests.testkit import TestClient


def test_chunks_hold_raw_float32_and_decode_to_the_same_rows() -> None:
    X = np.random.default_rng(1).normal(size=(CHUNK_BYTES // 64 + 3, 16)).astype(np.float32)
    entries = encode_chunks(X)
    assert [e["n"] for e in entries] == [CHUNK_BYTES // 64, 3]
    assert all(len(e["x"]) == e["n"] * 16 * 4 for e in entries)
    decoded = [decode_chunk({k.encode(): str(v).encode() if k != "x" else v for k, v in e.items()})
               for e in entries]  # fmt: skip
    np.testing.assert_array_equal(np.concatenate(decoded), X)


def test_a_truncated_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="corrupt"):
        decode_chunk({b"n": b"2", b"d": b"2", b"x": b"\0" * 12})


def test_key_names_carry_the_model_prefix() -> None:
    keys = ModelKeys("images")
    assert (keys.log, keys.meta, keys.snapshot) == (
        "nmbatch:images:log", "nmbatch:images:meta", "nmbatch:images:snapshot",
    )  # fmt: skip


def snapshot(version: int, value: float = 1.0) -> Snapshot:
    state = ModelState(
        centroids=np.full((3, 2), value, dtype=np.float32),
        counts=np.array([1, 2, 3], dtype=np.int64),
        batch_size=6,
        n_samples=6,
        iteration=4,
        converged=True,
        initialized=True,
        n_ingested=9,
    )
    model = PublishedModel.build(version=version, state=state, updated_at=1700000000.5)
    return Snapshot(model, last_id="5-0")


def test_snapshot_round_trips(redis_client: redis.Redis, model_name: str) -> None:
    repository = ModelRepository(redis_client, model_name)
    assert repository.read_snapshot() is None
    assert repository.write_snapshot(snapshot(3)) is True
    read = repository.read_snapshot()
    assert read is not None
    restored, state = read.model, read.model.state
    np.testing.assert_array_equal(state.centroids, snapshot(3).model.state.centroids)
    np.testing.assert_array_equal(state.counts, [1, 2, 3])
    assert (restored.version, state.batch_size, state.iteration, read.last_id) == (
        3, 6, 4, "5-0",
    )  # fmt: skip
    assert (state.n_samples, state.converged, restored.updated_at) == (6, True, 1700000000.5)


def test_snapshot_fields_keep_their_encoding(redis_client: redis.Redis, model_name: str) -> None:
    """The hash as every version of the service wrote it: old snapshots restore as they are."""
    fields = {
        b"version": b"3", b"k": b"3", b"dim": b"2",
        b"centroids": np.full((3, 2), 1.0, dtype="<f4").tobytes(),
        b"counts": np.array([1, 2, 3], dtype="<i8").tobytes(),
        b"batch_size": b"6", b"iteration": b"4", b"last_id": b"5-0", b"n_samples": b"6",
        b"converged": b"1", b"updated_at": b"1700000000.5", b"n_ingested": b"9",
    }  # fmt: skip
    assert ModelRepository(redis_client, model_name).write_snapshot(snapshot(3)) is True
    assert redis_client.hgetall(ModelKeys(model_name).snapshot) == fields
    assert Snapshot.from_fields(fields).to_fields() == snapshot(3).to_fields()
    # Written before retention: no n_ingested, which is then the samples it describes.
    del fields[b"n_ingested"]
    assert Snapshot.from_fields(fields).model.state.n_ingested == 6


def test_a_snapshot_never_replaces_a_newer_or_equal_version(
    redis_client: redis.Redis, model_name: str
) -> None:
    repository = ModelRepository(redis_client, model_name)
    assert repository.write_snapshot(snapshot(5, value=5.0))
    assert repository.write_snapshot(snapshot(4, value=4.0)) is False
    assert repository.write_snapshot(snapshot(5, value=6.0)) is False
    stored = repository.read_snapshot()
    assert stored is not None and stored.model.version == 5
    assert stored.model.state.centroids[0, 0] == 5.0
    assert repository.write_snapshot(snapshot(6, value=6.0))
    assert repository.read_snapshot().model.version == 6


def test_meta_records_k_and_dim_and_refuses_contradictions(
    redis_client: redis.Redis, model_name: str
) -> None:
    repository = ModelRepository(redis_client, model_name)
    assert repository.check_meta(3, None) is None
    assert repository.check_meta(3, 8) == 8
    assert repository.check_meta(3, None) == 8
    with pytest.raises(ModelConfigError, match="NMBATCH_K=4"):
        repository.check_meta(4, None)
    with pytest.raises(ModelConfigError, match="NMBATCH_DIM=9"):
        repository.check_meta(3, 9)


def test_the_first_batch_fixes_the_dimension_and_a_racing_one_stores_nothing(
    redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    """Both paths of ``append``, told no dimension (read before another batch fixed it)."""

    async def run() -> list[object]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            log = AsyncSampleLog(client, model_name)
            first = await log.append(np.zeros((2, 3), np.float32), dim=None)
            outcomes: list[object] = [first]
            for key in (None, "racing"):
                try:
                    await log.append(
                        np.zeros((1, 4), np.float32), dim=None, idempotency_key=key, key_seconds=60
                    )
                except WrongDimensionError as exc:
                    outcomes.append((exc.expected, exc.got))
            return outcomes
        finally:
            await client.aclose()

    first, *refused = asyncio.run(run())
    assert (first.stored, first.accepted, first.n_samples) == (True, 2, 2)
    assert refused == [(3, 4), (3, 4)]
    keys = ModelKeys(model_name)
    assert redis_client.hget(keys.meta, "dim") == b"3" and redis_client.xlen(keys.log) == 1
    assert redis_client.hget(keys.meta, "n_samples") == b"2"
    assert not redis_client.exists(keys.idempotency("racing"))


def test_a_racing_batch_of_another_dimension_is_a_wrong_dimension_problem(
    client: TestClient,
) -> None:
    handle = client.app.state.models.default
    assert client.post("/samples", json={"vectors": [[1.0, 2.0]]}).status_code == 202
    handle.dim = None  # as a request that read the dimension before that batch fixed it
    # The use case raises the domain error; the one mapping makes it the problem.
    with pytest.raises(errors.WrongDimensionError) as info:
        client.portal.call(ingest, handle, np.float32([[1.0, 2.0, 3.0]]))
    assert (info.value.expected_dim, info.value.got_dim) == (2, 3)
    problem = problem_of(info.value)
    assert (problem.status, problem.slug, problem.extensions) == (
        422, "wrong-dimension", {"expected_dim": 2, "got_dim": 3},
    )  # fmt: skip
    assert problem.detail == "vectors have 3 coordinates, but this model's dimension is 2"
    assert handle.dim == 2
