"""The events stream's Redis bytes are bounded by what the capacity plan counts for it
(``service/storage/capacity.py``: ``events_bytes``), at the largest events, on the Redis
the tests run."""

from __future__ import annotations

import redis

from nmbatch.service.storage.capacity import EVENTS_TRIM_SLACK, events_bytes
from nmbatch.service.storage.events import EVENT_MAX_BYTES, EventWriter, encode
from nmbatch.service.storage.keys import ModelKeys


def test_the_largest_events_fit_the_planned_bytes(redis_client: redis.Redis,
                                                  model_name: str) -> None:  # fmt: skip
    keep = 300
    writer = EventWriter(redis_client, model_name, keep=keep)
    big = {"version": 0, "pad": ["x" * (EVENT_MAX_BYTES - 30)]}  # about the largest event
    assert EVENT_MAX_BYTES - 16 <= len(encode(big)) <= EVENT_MAX_BYTES
    for i in range(3 * keep):  # flushed in rounds, as the worker does
        writer.emit("relocation", {**big, "version": i % 10})
        if i % 50 == 49:
            writer.flush()
    writer.flush()
    key = ModelKeys(model_name).events
    assert keep <= redis_client.xlen(key) <= keep + EVENTS_TRIM_SLACK
    used = redis_client.memory_usage(key, samples=0)
    assert used is not None and used <= events_bytes(keep), (used, events_bytes(keep))
    assert events_bytes(0) == 0
