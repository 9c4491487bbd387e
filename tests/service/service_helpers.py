"""Helpers of the service tests: posting ``.npy`` bodies and waiting for convergence."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.testkit import TestClient, npy_bytes, wait_until

__all__ = ["post_npy", "wait_converged"]


def post_npy(client: TestClient, X: np.ndarray, path: str = "/samples") -> Any:
    return client.post(path, content=npy_bytes(X), headers={"content-type": "application/x-npy"})


def wait_converged(client: TestClient, n_samples: int, timeout: float = 30.0) -> dict[str, Any]:
    """The /centroids document once converged on exactly ``n_samples`` samples."""

    def ready() -> dict[str, Any] | None:
        response = client.get("/centroids")
        if response.status_code != 200:
            return None
        doc = response.json()
        return doc if doc["converged"] and doc["n_samples"] == n_samples else None

    return wait_until(ready, timeout, f"convergence on {n_samples} samples")
