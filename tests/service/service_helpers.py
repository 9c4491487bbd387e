"""Helpers of the service tests: bodies, waiting, reading the Redis log, test data."""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

from nmbatch.service.config import Settings
from nmbatch.service.storage import ModelKeys, decode_chunk

with warnings.catch_warnings():
    # This starlette warns that its TestClient will move from httpx to httpx2.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

__all__ = [
    "SettingsFactory",
    "TestClient",
    "blobs",
    "log_state",
    "logged_samples",
    "npy_bytes",
    "post_npy",
    "wait_converged",
    "wait_until",
]

SettingsFactory = Callable[..., Settings]


def npy_bytes(X: np.ndarray) -> bytes:
    """``X`` in .npy format."""
    out = io.BytesIO()
    np.save(out, X, allow_pickle=False)
    return out.getvalue()


def post_npy(client: TestClient, X: np.ndarray, path: str = "/samples") -> Any:
    return client.post(path, content=npy_bytes(X), headers={"content-type": "application/x-npy"})


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.02)


def wait_converged(client: TestClient, n_samples: int, timeout: float = 30.0) -> dict[str, Any]:
    """The /centroids document once converged on exactly ``n_samples`` samples."""

    def ready() -> dict[str, Any] | None:
        response = client.get("/centroids")
        if response.status_code != 200:
            return None
        doc = response.json()
        return doc if doc["converged"] and doc["n_samples"] == n_samples else None

    return wait_until(ready, timeout, f"convergence on {n_samples} samples")


def logged_samples(client: redis.Redis, model: str) -> np.ndarray:
    """Every sample in the model's Redis log, in log order, ``(N, d)`` float32."""
    entries = client.xrange(ModelKeys(model).log)
    if not entries:
        return np.empty((0, 0), dtype=np.float32)
    return np.concatenate([decode_chunk(fields) for _, fields in entries])


def log_state(client: redis.Redis, model: str) -> tuple[int, int]:
    """(entries in the log stream, samples counted in the meta record)."""
    keys = ModelKeys(model)
    counted = client.hget(keys.meta, "n_samples")
    return int(client.xlen(keys.log)), int(counted or 0)


def blobs(
    rng: np.random.Generator, means: np.ndarray, per_blob: int, sigma: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """``per_blob`` Gaussian samples around each row of ``means``: (X float32, blob ids)."""
    X = np.concatenate([rng.normal(m, sigma, size=(per_blob, means.shape[1])) for m in means])
    ids = np.repeat(np.arange(means.shape[0]), per_blob)
    order = rng.permutation(X.shape[0])
    return X[order].astype(np.float32), ids[order]
