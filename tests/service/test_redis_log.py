"""Redis persistence: binary codecs, key names, snapshots that never go back in version."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from nmbatch.service.redis_log import (
    CHUNK_BYTES,
    ModelConfigError,
    ModelKeys,
    ModelRepository,
    Snapshot,
    decode_chunk,
    encode_chunks,
)


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
    return Snapshot(
        version=version,
        centroids=np.full((3, 2), value, dtype=np.float32),
        counts=np.array([1, 2, 3], dtype=np.int64),
        batch_size=6,
        iteration=4,
        last_id="5-0",
        n_samples=6,
        converged=True,
        updated_at=1700000000.5,
    )


def test_snapshot_round_trips(redis_client: redis.Redis, model_name: str) -> None:
    repository = ModelRepository(redis_client, model_name)
    assert repository.read_snapshot() is None
    assert repository.write_snapshot(snapshot(3)) is True
    restored = repository.read_snapshot()
    assert restored is not None
    np.testing.assert_array_equal(restored.centroids, snapshot(3).centroids)
    np.testing.assert_array_equal(restored.counts, [1, 2, 3])
    assert (restored.version, restored.batch_size, restored.iteration, restored.last_id) == (
        3, 6, 4, "5-0",
    )  # fmt: skip
    assert (restored.n_samples, restored.converged, restored.updated_at) == (6, True, 1700000000.5)


def test_a_snapshot_never_replaces_a_newer_or_equal_version(
    redis_client: redis.Redis, model_name: str
) -> None:
    repository = ModelRepository(redis_client, model_name)
    assert repository.write_snapshot(snapshot(5, value=5.0))
    assert repository.write_snapshot(snapshot(4, value=4.0)) is False
    assert repository.write_snapshot(snapshot(5, value=6.0)) is False
    stored = repository.read_snapshot()
    assert stored is not None and stored.version == 5 and stored.centroids[0, 0] == 5.0
    assert repository.write_snapshot(snapshot(6, value=6.0))
    assert repository.read_snapshot().version == 6


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
