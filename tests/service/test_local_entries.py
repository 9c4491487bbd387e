"""Entries handed to the worker in memory (``LocalEntries``) never change what it reads.

Whatever mix of handed-over entries, entries of another writer (a second process, or a
request whose handover was skipped) and dropped handovers, ``ModelRepository.read_log``
must return exactly the Redis log, in log order, with no gap and no duplicate; and the
handed-over entries are really taken from memory (no reply from Redis carries them).
Real Redis, real ``AsyncSampleLog`` appends.
"""

from __future__ import annotations

import asyncio

import numpy as np
import redis
import redis.asyncio

from nmbatch.service.storage import (
    AsyncSampleLog,
    LocalEntries,
    ModelKeys,
    ModelRepository,
    decode_chunk,
)
from nmbatch.service.storage.handoff import MAX_HANDOFF_BYTES, MIN_HANDOFF_BYTES, handoff_bytes

DIM = 4


def batch(seed: int, n: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)


def read_all(repository: ModelRepository, page: int = 4) -> tuple[list[str], np.ndarray]:
    """Everything ``read_log`` returns from the start, page by page, as the worker reads."""
    ids, parts, after = [], [], "0-0"
    while chunks := repository.read_log(after, page):
        for chunk in chunks:
            ids.append(chunk.entry_id)
            parts.append(chunk.X)
        after = chunks[-1].entry_id
    return ids, np.concatenate(parts) if parts else np.empty((0, DIM), np.float32)


def redis_log(client: redis.Redis, model: str) -> tuple[list[str], np.ndarray]:
    entries = client.xrange(ModelKeys(model).log)
    ids = [eid.decode() for eid, _ in entries]
    return ids, np.concatenate([decode_chunk(fields) for _, fields in entries])


def append(url: str, model: str, arrays: list[np.ndarray], local: LocalEntries | None) -> None:
    """Append each array as one request, through ``AsyncSampleLog`` (handing over if ``local``)."""

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(url)
        try:
            log = AsyncSampleLog(client, model, local)
            for X in arrays:
                await log.append(X, dim=DIM, hand_over=True)
        finally:
            await client.aclose()

    asyncio.run(run())


def test_handed_over_entries_are_read_from_memory_in_log_order(
    redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    local = LocalEntries()
    arrays = [batch(i) for i in range(10)]
    append(redis_url, model_name, arrays, local)
    assert len(local) == 10
    repository = ModelRepository(redis_client, model_name, local)
    chunks = repository.read_log("0-0", 4) + repository.read_log("0-0", 10)[4:]
    log_ids, log_X = redis_log(redis_client, model_name)
    assert [c.entry_id for c in chunks] == log_ids
    np.testing.assert_array_equal(np.concatenate([c.X for c in chunks]), log_X)
    # Taken from memory: the very arrays handed over, not copies decoded from a reply.
    assert all(np.shares_memory(c.X, X) for c, X in zip(chunks, arrays, strict=True))
    # Consumed entries are dropped at the next read.
    assert repository.read_log(log_ids[-1], 4) == []
    assert len(local) == 0 and local.nbytes == 0


def test_entries_of_another_writer_come_in_between_in_log_order(
    redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    local = LocalEntries()
    for i in range(6):
        append(redis_url, model_name, [batch(10 * i)], local)  # ours, handed over
        if i % 2 == 0:
            append(redis_url, model_name, [batch(10 * i + 1, 2)], None)  # another process
    append(redis_url, model_name, [batch(99, 5)], None)  # another one after all of ours
    for page in (1, 2, 3, 100):
        ids, X = read_all(ModelRepository(redis_client, model_name, local), page)
        log_ids, log_X = redis_log(redis_client, model_name)
        assert ids == log_ids
        np.testing.assert_array_equal(X, log_X)


def test_entries_not_handed_over_yet_are_read_from_redis(
    redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    """A request whose handover comes after a later one's: no gap, no duplicate."""
    local = LocalEntries()
    late = LocalEntries()  # stands for the slow request's pending handover
    append(redis_url, model_name, [batch(1)], late)
    append(redis_url, model_name, [batch(2)], local)
    repository = ModelRepository(redis_client, model_name, local)
    first = repository.read_log("0-0", 8)  # the gap before batch 2 sends us to Redis
    log_ids, log_X = redis_log(redis_client, model_name)
    assert [c.entry_id for c in first] == log_ids
    np.testing.assert_array_equal(np.concatenate([c.X for c in first]), log_X)
    # The late handover arrives once the worker has passed it: it is never served.
    entry_id, X, _ = late.after("0-0", 8)[0]
    local.put([entry_id], [X])
    assert repository.read_log(first[-1].entry_id, 8) == []
    assert len(local) == 0


def test_dropped_handovers_fall_back_to_redis(
    redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    tiny = LocalEntries(max_bytes=2 * 3 * DIM * 4)  # room for two batches of 3 rows
    append(redis_url, model_name, [batch(i) for i in range(5)], tiny)
    assert len(tiny) == 2
    expired = LocalEntries(max_age=0.0)
    append(redis_url, model_name, [batch(7)], expired)
    assert expired.after("0-0", 8) == []
    for local in (tiny, expired):
        ids, X = read_all(ModelRepository(redis_client, model_name, local))
        log_ids, log_X = redis_log(redis_client, model_name)
        assert ids == log_ids
        np.testing.assert_array_equal(X, log_X)


def test_multi_entry_requests_hand_over_each_entry(
    redis_url: str, redis_client: redis.Redis, model_name: str, monkeypatch
) -> None:
    import nmbatch.service.storage.codec as codec

    monkeypatch.setattr(codec, "CHUNK_BYTES", 2 * DIM * 4)  # 2 rows per entry
    local = LocalEntries()
    append(redis_url, model_name, [batch(3, 7)], local)
    assert len(local) == 4  # 2 + 2 + 2 + 1 rows
    ids, X = read_all(ModelRepository(redis_client, model_name, local))
    log_ids, log_X = redis_log(redis_client, model_name)
    assert ids == log_ids and len(ids) == 4
    np.testing.assert_array_equal(X, log_X)


def test_the_handoff_is_a_bounded_share_of_the_retained_rows() -> None:
    """1/64 of the retained rows' bytes, within [64 MiB, 256 MiB]; 256 MiB for ``all``."""
    assert handoff_bytes(None, 128) == MAX_HANDOFF_BYTES
    assert handoff_bytes(20_000_000, 128) == 20_000_000 * 512 // 64  # 160 MB
    # A soak's window of 2,000,000: 16 MB is its share, the floor holds more requests.
    assert handoff_bytes(2_000_000, 128) == MIN_HANDOFF_BYTES
    assert handoff_bytes(1000, 128) == MIN_HANDOFF_BYTES
    assert handoff_bytes(10**9, 128) == MAX_HANDOFF_BYTES
