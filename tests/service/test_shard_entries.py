"""Log entries by reference (``service/storage/entries.py``), on the session's redis-server.

The worker of a Ray engine reads entry heads (id, ``n``, ``d``, a base's stream ids)
without their rows; a shard reads the rows of the entries it was sent with
:class:`RedisRows`, which pickles without its connection, raises ``KeyError`` for an
entry that is not there and gives up on an unreachable Redis after its retry time.
"""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import redis

from nmbatch.engine.rows import SourceRows
from nmbatch.service.storage.codec import encode_chunks
from nmbatch.service.storage.entries import RedisRows, read_heads
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.storage.repository import ModelRepository
from nmbatch.service.storage.retained import RetainedLog


def logged(client: redis.Redis, key: str, X: np.ndarray, per_entry: int) -> list[str]:
    """``X`` ``(n, d)`` float32 appended to stream ``key`` as entries of ``per_entry`` rows
    (the fields of the log); their ids."""
    ids = []
    for start in range(0, X.shape[0], per_entry):
        (fields,) = encode_chunks(X[start : start + per_entry])
        ids.append(client.xadd(key, fields).decode())
    return ids


def test_heads_name_the_entries_and_a_shard_reads_their_rows(
    redis_client: redis.Redis, redis_url: str, model_name: str
) -> None:
    keys = ModelKeys(model_name)
    X = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    entry_ids = logged(redis_client, keys.log, X, 7)
    repository = ModelRepository(redis_client, model_name)
    first = repository.read_log_heads("0-0", 4)
    rest = repository.read_log_heads(first[-1].entry_id, 100)
    chunks = first + rest
    assert [c.entry_id for c in chunks] == entry_ids
    assert all(isinstance(c.X, SourceRows) and c.X.shape == (len(c.X), 3) for c in chunks)
    assert [len(c.X) for c in chunks] == [7] * 7 + [1]
    source = pickle.loads(pickle.dumps(RedisRows(redis_url)))  # as sent to an actor
    refs = [c.X.ref for c in chunks]
    np.testing.assert_array_equal(np.concatenate(source.read(refs)), X)
    assert source.read(refs[2:3])[0].flags.writeable  # a copy, not Redis's buffer
    with pytest.raises(KeyError, match="not in Redis"):
        source.read([(keys.log, "1-1")])
    redis_client.xadd(keys.prefix + "other", {"x": b"\0" * 8})
    with pytest.raises(ValueError, match="no n and d"):
        read_heads(redis_client, keys.prefix + "other", None, 10)
    # The worker's ordinary read (rows by value) is unchanged.
    np.testing.assert_array_equal(
        np.concatenate([c.X for c in repository.read_log("0-0", 100)]), X
    )


def test_base_heads_give_the_stream_ids_and_the_layout_names_what_compact_wrote(
    redis_client: redis.Redis, redis_url: str, model_name: str
) -> None:
    keys = ModelKeys(model_name)
    X = np.random.default_rng(1).normal(size=(40, 4)).astype(np.float32)
    last = logged(redis_client, keys.log, X, 10)[-1]
    storage = RetainedLog(redis_client, keys)
    storage.entry_bytes = 6 * (4 * 4 + 8)  # 6 rows per base entry
    slots = np.random.default_rng(2).permutation(40)[:23]
    base = storage.compact(slots, X[slots], last_id=last, policy={})
    rows, ids = storage.base_layout(base, slots, 4)
    assert [len(r) for r in rows] == [6, 6, 6, 5]
    np.testing.assert_array_equal(np.concatenate(ids), slots)
    source = RedisRows(redis_url)
    for named, these in zip(rows, ids, strict=True):
        np.testing.assert_array_equal(source.read([named.ref])[0][named.offsets], X[these])
    heads = list(storage.base_heads(storage.read_base(), page=3))
    assert [h.rows.ref for h in heads] == [r.ref for r in rows]
    np.testing.assert_array_equal(np.concatenate([h.ids for h in heads]), slots)
    with pytest.raises(ValueError, match="rows for"):
        storage.base_layout(base, slots[:5], 4)


def test_an_unreachable_redis_is_retried_then_reported() -> None:
    source = RedisRows("redis://127.0.0.1:1/0", retry_seconds=0.3)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        source.read([("nmbatch:x:log", "1-0")])
    assert 0.2 < time.monotonic() - started < 10.0
