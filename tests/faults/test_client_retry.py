"""The client's retries through real outages store every vector exactly once.

A push of many chunks is interrupted half-way, from its own progress callback (so the
outage always falls inside the push): Redis stops (``SHUTDOWN``, or ``kill -9`` with
``appendfsync always``) and comes back on the same port and folder a few seconds later,
or the service process is killed with ``kill -9`` and started again on its port. The
push returns normally; the Redis log then holds every row once (each row is tagged with
its index in coordinate 0), and the meta counter agrees.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from fault_helpers import ServiceProcess, stop_redis

from nmbatch import AsyncClient, Client
from nmbatch.service.client import RetryPolicy
from nmbatch.service.embedded_redis import EmbeddedRedis
from tests.testkit import log_state, logged_samples

pytestmark = pytest.mark.fault

MODEL = "client-retry"
ROWS, DIM, PER_REQUEST = 4000, 8, 100
PATIENT = RetryPolicy(attempts=40, deadline=90.0, backoff=0.1, max_backoff=2.0)


def tagged_rows() -> np.ndarray:
    """``(ROWS, DIM)`` float32: coordinate 0 is the row's index, the rest three blobs."""
    rng = np.random.default_rng(0)
    X = rng.normal(0.0, 1.0, size=(ROWS, DIM)).astype(np.float32)
    X[:, 1:] += 30.0 * rng.integers(0, 3, size=(ROWS, 1))
    X[:, 0] = np.arange(ROWS)
    return X


def assert_stored_once(url: str, X: np.ndarray) -> None:
    client = redis.Redis.from_url(url)
    try:
        stored = logged_samples(client, MODEL)
        entries, counted, _ = log_state(client, MODEL)
    finally:
        client.close()
    assert stored.shape[0] == counted == ROWS, (stored.shape, counted, entries)
    order = np.argsort(stored[:, 0], kind="stable")
    np.testing.assert_array_equal(stored[order], X)  # every row, once, unchanged


class Statuses:
    """An httpx event hook counting answers by status."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, response: httpx.Response) -> None:
        self.seen.append(response.status_code)


@pytest.mark.parametrize(("how", "appendfsync"), [("shutdown", "everysec"), ("kill -9", "always")])
def test_a_push_through_a_redis_outage_stores_every_vector_once(
    how: str,
    appendfsync: str,
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    server = start_redis(appendfsync=appendfsync)
    port, url = server.port, server.url
    service = start_service(
        "svc",
        redis_url=url,
        model=MODEL,
        k=3,
        batch_size=64,
        worker_threads=1,
        redis_retry_seconds=1.0,
    )
    service.ready(60)
    X = tagged_rows()
    statuses = Statuses()
    redis_gone = threading.Event()

    def outage(done: int, total: int) -> None:
        if done != 10 * PER_REQUEST:
            return
        stop_redis(server, how)
        redis_gone.set()

    outcome: list[Any] = []
    with Client(
        service.base, retry=PATIENT, max_vectors=PER_REQUEST, event_hooks={"response": [statuses]}
    ) as client:
        # The push runs in a thread; Redis is started again from this one (a redis-server
        # child gets SIGTERM when the thread that started it ends).
        pusher = threading.Thread(target=lambda: outcome.append(client.push(X, progress=outage)))
        pusher.start()
        assert redis_gone.wait(60), "the push did not reach the outage"
        time.sleep(3.0)
        start_redis(port=port, appendfsync=appendfsync)
        pusher.join(120)
        assert not pusher.is_alive() and outcome, "the push did not finish"
        result = outcome[0]
        assert result.accepted == ROWS and result.requests == ROWS // PER_REQUEST
        assert result.retries > 0 and 503 in statuses.seen
        assert_stored_once(url, X)
        final = client.wait_for(converged=True, min_samples=ROWS, timeout=90)
        assert final.n_samples == ROWS


def test_a_push_through_a_service_kill_and_restart_stores_every_vector_once(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    server = start_redis(appendfsync="always")
    service = start_service(
        "svc",
        redis_url=server.url,
        model=MODEL,
        k=3,
        batch_size=64,
        worker_threads=1,
        worker_lock_seconds=2.0,
    )
    service.ready(60)
    X = tagged_rows()
    killed = threading.Event()

    def crash(done: int, total: int) -> None:
        if done == 10 * PER_REQUEST:
            service.kill()  # kill -9; the same port again half a second later
            killed.set()
            threading.Timer(0.5, service.start).start()

    async def push() -> tuple[int, int, int]:
        async with AsyncClient(service.base, retry=PATIENT, max_vectors=PER_REQUEST) as client:
            result = await client.push(X, progress=crash)
            model = await client.wait_for(converged=True, min_samples=ROWS, timeout=90)
            return result.accepted, result.retries, model.n_samples

    accepted, retries, n_samples = asyncio.run(push())
    assert killed.is_set()
    assert accepted == ROWS and retries > 0 and n_samples == ROWS
    assert_stored_once(server.url, X)
