"""Shared fixtures: a real ``redis-server`` for the whole session, a fresh model per test.

The server is started by :class:`service.embedded_redis.EmbeddedRedis` on a free port in
a temporary folder (never a mock); it starts only when a test asks for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from nmbatch.service.embedded_redis import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A real redis-server child on a free port, for the whole session."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """URL of the session's Redis, its database flushed before the test."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushdb()
    finally:
        client.close()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A synchronous client of the flushed database (bytes answers)."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def model_name() -> str:
    """A model prefix no other test uses."""
    return f"test-{uuid.uuid4().hex[:12]}"
