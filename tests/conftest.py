"""Shared fixtures: a real ``redis-server`` for the whole session, a fresh model per test,
settings for a small model on it and the app running with them.

The server is started by :class:`nmbatch.service.embedded_redis.EmbeddedRedis` on a free
port in a temporary folder (never a mock); it starts only when a test asks for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.main import create_app
from tests.testkit import SettingsFactory, TestClient


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


@pytest.fixture
def make_settings(redis_url: str, model_name: str) -> SettingsFactory:
    """Settings for a small, quick model on the test Redis; keywords override."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "model": model_name,
            "k": 3,
            "batch_size": 32,
            "rho": 100.0,
            "seed": 0,
            "snapshot_seconds": 0.2,
            "poll_seconds": 0.05,
            "worker_threads": 1,
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def settings(make_settings: SettingsFactory) -> Settings:
    """``make_settings()``: the defaults."""
    return make_settings()


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The app for ``settings``, lifespan started (worker running)."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A one-node local Ray for the module (one CPU, no dashboard, an 80 MiB object store),
    unless the process is connected to one already; shut down after if started here."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        # "local": a new instance, never a cluster a file of an earlier run points to.
        ray.init(address="local", num_cpus=1, object_store_memory=80 * 2**20,
                 include_dashboard=False, log_to_driver=False)  # fmt: skip
    yield
    if started:
        ray.shutdown()
