"""Fixtures of the service tests: settings for a small model, a running app."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from service_helpers import SettingsFactory, TestClient

from nmbatch.service.config import Settings
from nmbatch.service.main import create_app


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
    return make_settings()


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The app for ``settings``, lifespan started (worker running)."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client
