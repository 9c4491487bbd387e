"""A Redis outage while two models ingest through the client: the default model and a
named one (``PUT /models/{name}``, pushed with ``Client(model=name)``).

Both pushes are many chunks long and run at the same time, each in its own thread. The
named model's push stops Redis from its own progress callback (``SHUTDOWN``, or
``kill -9`` with ``appendfsync always``) and the default model's push waits in its
callback until Redis is gone, so both are mid-push when it goes; Redis comes back on
the same port and folder a few seconds later. Both pushes return normally, and each
model's log then holds every one of its rows once (coordinate 0 tags each row with its
index), its meta counter agrees, and each model converges on exactly its own rows.
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
from nmbatch.service.client import PushResult, RetryPolicy
from nmbatch.service.embedded_redis import EmbeddedRedis
from tests.testkit import log_state, logged_samples

pytestmark = pytest.mark.fault

DEFAULT = "outage-default"
NAMED = "outage-named"
ROWS, DIM, PER_REQUEST = 3000, 8, 100
NAMED_SPEC = {"k": 3, "dim": DIM, "batch_size": 64, "seed": 1}
PATIENT = RetryPolicy(attempts=40, deadline=90.0, backoff=0.1, max_backoff=2.0)
OUTAGE_AT = 10 * PER_REQUEST
"""Rows acknowledged (of each push) when Redis goes away."""


def tagged_rows(seed: int) -> np.ndarray:
    """``(ROWS, DIM)`` float32: coordinate 0 is the row's index, the rest three blobs."""
    rng = np.random.default_rng(seed)
    X = rng.normal(0.0, 1.0, size=(ROWS, DIM)).astype(np.float32)
    X[:, 1:] += 30.0 * rng.integers(0, 3, size=(ROWS, 1))
    X[:, 0] = np.arange(ROWS)
    return X


def assert_stored_once(client: redis.Redis, model: str, X: np.ndarray) -> None:
    """The log of ``model`` holds every row of ``X`` once and nothing else."""
    stored = logged_samples(client, model)
    entries, counted, _ = log_state(client, model)
    assert stored.shape[0] == counted == ROWS, (model, stored.shape, counted, entries)
    order = np.argsort(stored[:, 0], kind="stable")
    np.testing.assert_array_equal(stored[order], X)


@pytest.mark.parametrize(("how", "appendfsync"), [("shutdown", "everysec"), ("kill -9", "always")])
def test_a_redis_outage_while_two_models_ingest_stores_every_vector_of_both_once(
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
        model=DEFAULT,
        k=3,
        batch_size=64,
        worker_threads=1,
        snapshot_seconds=0.5,
        poll_seconds=0.05,
        redis_retry_seconds=1.0,
    )
    service.ready(60)
    with httpx.Client(base_url=service.base, timeout=30) as http:
        assert http.put(f"/models/{NAMED}", json=NAMED_SPEC).status_code == 201
    data = {DEFAULT: tagged_rows(0), NAMED: tagged_rows(1)}
    redis_gone = threading.Event()
    statuses: dict[str, list[int]] = {DEFAULT: [], NAMED: []}
    results: dict[str, PushResult] = {}
    errors: list[BaseException] = []

    def outage(done: int, total: int) -> None:
        """The named push's progress: stop Redis after OUTAGE_AT rows."""
        if done != OUTAGE_AT:
            return
        stop_redis(server, how)
        redis_gone.set()

    def held(done: int, total: int) -> None:
        """The default push's progress: wait for the outage after OUTAGE_AT rows."""
        if done == OUTAGE_AT:
            redis_gone.wait(60)

    def hook(model: str) -> Callable[[httpx.Response], Any]:
        return lambda response: statuses[model].append(response.status_code)

    def push_default() -> None:
        try:
            with Client(
                service.base,
                retry=PATIENT,
                max_vectors=PER_REQUEST,
                event_hooks={"response": [hook(DEFAULT)]},
            ) as client:
                results[DEFAULT] = client.push(data[DEFAULT], progress=held)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    async def push_named_async() -> None:
        async def record(response: httpx.Response) -> None:
            statuses[NAMED].append(response.status_code)

        async with AsyncClient(
            service.base,
            model=NAMED,
            retry=PATIENT,
            max_vectors=PER_REQUEST,
            event_hooks={"response": [record]},
        ) as client:
            results[NAMED] = await client.push(data[NAMED], progress=outage)

    def push_named() -> None:
        try:
            asyncio.run(push_named_async())
        except BaseException as exc:
            errors.append(exc)

    # The pushes run in threads; Redis is started again from this one (a redis-server
    # child gets SIGTERM when the thread that started it ends).
    pushers = [threading.Thread(target=push_default), threading.Thread(target=push_named)]
    for pusher in pushers:
        pusher.start()
    try:
        assert redis_gone.wait(60), f"the pushes did not reach the outage: {errors}"
        time.sleep(3.0)
        start_redis(port=port, appendfsync=appendfsync)
    finally:
        redis_gone.set()  # never leave the default push waiting
        for pusher in pushers:
            pusher.join(120)
    assert not errors, errors
    assert not any(pusher.is_alive() for pusher in pushers), "a push did not finish"

    for model in (DEFAULT, NAMED):
        result = results[model]
        assert result.accepted == ROWS and result.requests == ROWS // PER_REQUEST, result
        # Both were mid-push during the outage: refused with 503 (or no answer), retried.
        assert result.retries > 0 and 503 in statuses[model], (model, statuses[model])
    check = redis.Redis.from_url(url)
    try:
        for model in (DEFAULT, NAMED):
            assert_stored_once(check, model, data[model])
    finally:
        check.close()
    for model in (None, NAMED):
        with Client(service.base, model=model, retry=PATIENT) as client:
            final = client.wait_for(converged=True, min_samples=ROWS, timeout=60)
            assert final.n_samples == ROWS
            assert client.stats()["n_logged"] == ROWS
