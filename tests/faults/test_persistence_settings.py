"""``NMBATCH_APPENDFSYNC`` reaches the embedded Redis (checked with ``CONFIG GET``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis, EmbeddedRedisError, find_redis_server
from nmbatch.service.main import create_app
from tests.testkit import TestClient

pytestmark = pytest.mark.fault


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_the_service_runs_its_embedded_redis_with_the_fsync_policy_set(
    appendfsync: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("NMBATCH_REDIS_URL", "NMBATCH_APPENDFSYNC", "NMBATCH_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NMBATCH_APPENDFSYNC", appendfsync)
    monkeypatch.setenv("NMBATCH_DATA_DIR", str(tmp_path / "data"))
    settings = Settings(k=2, worker_threads=1)
    assert settings.redis_url is None and settings.appendfsync == appendfsync
    with TestClient(create_app(settings)) as client:
        embedded = client.app.state.models.default.planner.embedded
        assert embedded is not None
        admin = redis.Redis.from_url(embedded.url, decode_responses=True)
        config = admin.config_get("append*")
        admin.close()
        assert (config["appendonly"], config["appendfsync"]) == ("yes", appendfsync)
        assert client.get("/readyz").json()["role"] == "worker"


def test_an_unknown_fsync_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="appendfsync"):
        EmbeddedRedis(tmp_path, appendfsync="sometimes")


def test_a_redis_server_running_another_policy_is_refused(tmp_path: Path) -> None:
    # A wrapper (think: a packaged redis-server whose config file overrides options)
    # that starts the real server with appendfsync no, whatever it is asked for.
    wrapper = tmp_path / "redis-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{find_redis_server()}" "$@" --appendfsync no\n')
    wrapper.chmod(0o755)
    server = EmbeddedRedis(tmp_path / "data", appendfsync="always", binary=wrapper)
    with pytest.raises(EmbeddedRedisError, match="appendfsync"):
        server.start()
    assert server.process is None
