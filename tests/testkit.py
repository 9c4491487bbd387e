"""Helpers every test folder shares: test data, bodies, waiting, reading the Redis log,
problem answers, and stopping a child process.

Import it as ``tests.testkit`` (``pythonpath = ["."]`` in ``pyproject.toml`` puts the
repository root on ``sys.path``, from any test folder, and a subprocess started with
``PYTHONPATH`` set to the repository root finds it the same way).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
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
    "PROBLEM",
    "SettingsFactory",
    "TestClient",
    "UnpicklingTrap",
    "assert_problem",
    "blobs",
    "blobs_around",
    "log_state",
    "logged_samples",
    "npy_bytes",
    "pickled_object_npy",
    "stop_process",
    "wait_until",
]

PROBLEM = "application/problem+json"
# The ``make_settings`` fixture (tests/conftest.py): keywords override its defaults.
SettingsFactory = Callable[..., Settings]


# -- test data -----------------------------------------------------------------------------
def blobs(
    n: int,
    d: int,
    n_blobs: int,
    *,
    seed: int = 0,
    spread: float = 1.0,
    separation: float = 10.0,
    integer: bool = False,
) -> np.ndarray:
    """``n`` samples around ``n_blobs`` random centres, ``(n, d)`` float32, in random order.

    The centres are ``separation`` times standard normal, each sample picks one at random
    and adds ``spread`` times standard normal noise. ``integer=True`` rounds every value
    to an integer (sums of such float32 rows are exact in float64, so means and sums
    compare exactly between algorithms).
    """
    rng = np.random.default_rng(seed)
    centres = separation * rng.standard_normal((n_blobs, d))
    which = rng.integers(0, n_blobs, size=n)
    X = centres[which] + spread * rng.standard_normal((n, d))
    if integer:
        X = np.rint(X)
    return X.astype(np.float32)


def blobs_around(
    rng: np.random.Generator | int, means: np.ndarray, per_blob: int, sigma: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """``per_blob`` Gaussian samples around each row of the given ``means`` ``(m, d)``,
    shuffled: ``X`` ``(m * per_blob, d)`` float32 and the blob of each row ``(m * per_blob,)``.

    ``rng`` is a generator (drawn from) or a seed.
    """
    rng = np.random.default_rng(rng)
    X = np.concatenate([rng.normal(m, sigma, size=(per_blob, means.shape[1])) for m in means])
    ids = np.repeat(np.arange(means.shape[0]), per_blob)
    order = rng.permutation(X.shape[0])
    return X[order].astype(np.float32), ids[order]


# -- request bodies ------------------------------------------------------------------------
def npy_bytes(X: np.ndarray, allow_pickle: bool = False) -> bytes:
    """``X`` in .npy format (object arrays need ``allow_pickle=True``)."""
    out = io.BytesIO()
    np.save(out, X, allow_pickle=allow_pickle)
    return out.getvalue()


def _unpickled() -> None:
    raise AssertionError("the body was unpickled")


class UnpicklingTrap:
    """An object whose unpickling fails the test (a reader must never unpickle a body)."""

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return (_unpickled, ())


def pickled_object_npy(*row: object) -> bytes:
    """A ``(1, 1 + len(row))`` object array, an :class:`UnpicklingTrap` then ``row``, as .npy."""
    return npy_bytes(np.array([[UnpicklingTrap(), *row]], dtype=object), allow_pickle=True)


# -- answers and state ---------------------------------------------------------------------
def assert_problem(response: Any, status: int, slug: str | None = None) -> dict[str, Any]:
    """``response`` is a problem details answer with ``status`` (and type ``slug``)."""
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["status"] == status and problem["title"] and problem["detail"]
    if slug is not None:
        assert problem["type"] == f"urn:nmbatch:problem:{slug}", problem
    return problem


def logged_samples(client: redis.Redis, model: str) -> np.ndarray:
    """Every sample in the model's Redis log, in log order, ``(N, d)`` float32."""
    entries = client.xrange(ModelKeys(model).log)
    if not entries:
        return np.empty((0, 0), dtype=np.float32)
    return np.concatenate([decode_chunk(fields) for _, fields in entries])


def log_state(client: redis.Redis, model: str) -> tuple[int, int, bytes | None]:
    """(entries in the log stream, samples counted in the meta record, stored dimension).

    The dimension is the meta record's raw value (``b"2"``), ``None`` before the first
    sample.
    """
    keys = ModelKeys(model)
    counted, dim = client.hmget(keys.meta, ["n_samples", "dim"])
    return int(client.xlen(keys.log)), int(counted or 0), dim


# -- time and processes --------------------------------------------------------------------
def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``predicate`` every 20 ms until it returns a truthy value (returned); fail the
    test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(0.02)


def stop_process(
    proc: subprocess.Popen, timeout: float = 30.0, *, fail_on_kill: bool = False
) -> int:
    """SIGTERM ``proc``, wait ``timeout`` s for it to exit, else SIGKILL it; close its pipes.

    Returns the exit status (negative: the signal that ended it). A process that has
    exited already gets no signal. With ``fail_on_kill``, a process that needed the
    SIGKILL fails the test (after it is reaped).
    """
    killed = False
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            killed = True
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    if killed and fail_on_kill:
        pytest.fail(f"process {proc.pid} did not exit within {timeout:g} s of SIGTERM")
    return proc.returncode


@contextlib.contextmanager
def two_node_ray_cluster(store_bytes: int = 80 * 2**20) -> Iterator[Any]:
    """A local Ray cluster of two nodes (one CPU each, object stores of ``store_bytes``,
    no dashboard) that this process is not connected to: a connection open on entry is
    closed first. On exit any connection is closed and the cluster shut down. Ray is
    imported here, since it is an optional extra."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1, "object_store_memory": store_bytes, "include_dashboard": False,
        },
    )
    cluster.add_node(num_cpus=1, object_store_memory=store_bytes)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


_SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every series of metric ``name`` in a Prometheus text exposition: (labels, value)."""
    found = []
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match and match["name"] == name:
            labels = dict(_LABEL.findall(match["labels"] or ""))
            found.append((labels, float(match["value"])))
    return found


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the one series of ``name`` whose labels include ``labels``."""
    values = [v for got, v in metric_series(text, name) if labels.items() <= got.items()]
    assert len(values) == 1, f"{name} {labels}: {len(values)} series"
    return values[0]


def assert_centroids_are_means(doc: dict[str, Any], rows: np.ndarray) -> None:
    """The centroids of a ``/centroids`` answer ``doc`` are the means of the ``rows``
    nearest to each (float64, ``1e-5``), and its ``counts`` their numbers."""
    C = np.asarray(doc["centroids"], dtype=np.float64)
    X = rows.astype(np.float64)
    labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
    counts = np.bincount(labels, minlength=C.shape[0])
    assert np.array_equal(np.asarray(doc["counts"], dtype=np.int64), counts)
    for j in np.flatnonzero(counts):  # an empty cluster's centroid is no mean
        np.testing.assert_allclose(C[j], X[labels == j].mean(0), rtol=1e-5, atol=1e-5)
