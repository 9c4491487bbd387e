"""The Python client (``nmbatch.Client``, ``AsyncClient``) against a real service process.

Every test starts ``python -m nmbatch`` on a free port (:class:`ServiceProcess`), its
model on the session's redis-server, and talks to it over HTTP; the Redis log is read
back to check what was stored. The backoff's arithmetic is checked without a server.
"""

from __future__ import annotations

import asyncio
import io
import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from nmbatch import AsyncClient, Client
from nmbatch.service.client import (
    ConflictError,
    IdempotencyKeyReusedError,
    InvalidVectorsError,
    NotEnoughSamplesError,
    NotFoundError,
    RetryPolicy,
    UnauthorizedError,
    WaitTimeoutError,
    WrongDimensionError,
)
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch_client.retry import retry_after_seconds
from nmbatch_client.session import NAME_PATTERN, model_prefix
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import blobs, log_state, logged_samples

KEY = "client-test-key-0123456789"
Served = tuple[ServiceProcess, str]


@pytest.fixture
def serve(tmp_path: Path, redis_server: EmbeddedRedis) -> Iterator[Callable[..., Served]]:
    """``serve(**settings)``: a ready service process on a fresh model; (process, model)."""
    procs: list[ServiceProcess] = []

    def start(**settings: Any) -> Served:
        model = f"client-{uuid.uuid4().hex[:10]}"
        values: dict[str, Any] = dict(
            redis_url=redis_server.url,
            model=model,
            k=3,
            batch_size=64,
            worker_threads=1,
            snapshot_seconds=0.2,
            poll_seconds=0.05,
        )
        values.update(settings)
        proc = ServiceProcess(tmp_path, model, **values).start()
        procs.append(proc)
        proc.ready(60)
        return proc, model

    try:
        yield start
    finally:
        for proc in procs:
            proc.close()


@pytest.fixture
def redis_log(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        client.close()


def nearest(X: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force nearest centroid and distance in float64."""
    d2 = ((X[:, None, :].astype(np.float64) - C[None, :, :].astype(np.float64)) ** 2).sum(2)
    labels = d2.argmin(1)
    return labels, np.sqrt(d2[np.arange(len(X)), labels])


class Statuses:
    """An httpx event hook recording ``(method, path, status)`` of every answer."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def __call__(self, response: httpx.Response) -> None:
        self.seen.append((response.request.method, response.request.url.path, response.status_code))


def test_push_learns_the_row_limit_stores_every_row_once_and_assign_is_exact(
    serve: Callable[..., Served], redis_log: redis.Redis
) -> None:
    proc, model = serve(max_vectors=250)
    X = blobs(1000, 4, 3, seed=1, separation=20.0)
    statuses = Statuses()
    with Client(proc.base, event_hooks={"response": [statuses]}) as client:
        result = client.push(X)
        # The first request (1000 rows) was refused with 413 and its limit; then 4 x 250.
        assert [s for _, path, s in statuses.seen if path == "/samples"] == [413] + [202] * 4
        assert client.limits.max_vectors == 250
        assert (result.accepted, result.n_samples, result.requests) == (1000, 1000, 4)
        assert (result.replayed, result.retries) == (0, 0)
        np.testing.assert_array_equal(logged_samples(redis_log, model), X)

        model_now = client.wait_for(converged=True, min_samples=1000, timeout=60)
        assert model_now.converged and model_now.n_samples == 1000
        assert model_now.centroids.shape == (3, 4) and model_now.centroids.dtype == np.float32
        assert model_now.counts.dtype == np.int64 and model_now.counts.shape == (3,)
        assert not model_now.centroids.flags.writeable
        # The JSON centroids are the service's float32 values bit for bit.
        npy = httpx.get(
            proc.base + "/centroids", headers={"accept": "application/x-npy"}, timeout=10
        )
        assert npy.headers["etag"] == model_now.etag  # converged, nothing new: unchanged
        np.testing.assert_array_equal(np.load(io.BytesIO(npy.content)), model_now.centroids)

        assigned = client.assign(X, encoding="raw")
        assert assigned.versions == (assigned.version,) == (model_now.version,)
        labels, distances = nearest(X, model_now.centroids)
        np.testing.assert_array_equal(assigned.labels, labels)
        np.testing.assert_allclose(assigned.distances, distances, rtol=1e-5, atol=1e-5)
        assert assigned.similarities is None  # a Euclidean model
        # Chunked like a push: the service's 250 rows per request.
        assign_calls = [s for _, path, s in statuses.seen if path == "/assign"]
        assert assign_calls == [200] * 4

        stats = client.stats()
        assert stats["n_logged"] == 1000 and stats["version"] >= model_now.version


def test_centroids_are_not_downloaded_again_while_the_version_is_unchanged(
    serve: Callable[..., Served],
) -> None:
    proc, _ = serve()
    statuses = Statuses()
    with Client(proc.base, event_hooks={"response": [statuses]}) as client:
        client.push(blobs(300, 3, 3, seed=2, separation=20.0))
        first = client.wait_for(converged=True, min_samples=300, timeout=60)
        statuses.seen.clear()
        again = client.centroids()
        assert again is first
        assert statuses.seen == [("GET", "/centroids", 304)]

        client.push(blobs(300, 3, 3, seed=3, separation=20.0))
        later = client.wait_for(version=first.version + 1, min_samples=600, timeout=60)
        assert later is not first and later.version > first.version
        assert later.n_samples == 600


def test_a_repeated_push_with_its_key_is_stored_once(
    serve: Callable[..., Served], redis_log: redis.Redis
) -> None:
    proc, model = serve()
    X = blobs(500, 5, 3, seed=4)
    with Client(proc.base, max_vectors=200) as client:
        first = client.push(X, idempotency_key="batch-7")
        again = client.push(X, idempotency_key="batch-7")
        assert (first.requests, first.replayed) == (3, 0)
        assert (again.requests, again.replayed, again.accepted) == (3, 3, 500)
        assert again.n_samples == 500
        np.testing.assert_array_equal(logged_samples(redis_log, model), X)
        # The same key with other vectors is refused; nothing more is stored.
        with pytest.raises(IdempotencyKeyReusedError) as refused:
            client.push(X[::-1], idempotency_key="batch-7")
        assert refused.value.status == 409
        assert refused.value.type == "urn:nmbatch:problem:idempotency-key-reused"
        assert logged_samples(redis_log, model).shape == (500, 5)


def test_refusals_are_typed_errors_with_the_problem_members(
    serve: Callable[..., Served],
) -> None:
    proc, _ = serve()
    with Client(proc.base) as client:
        client.push(np.ones((4, 3)))  # fixes the dimension: 3
        with pytest.raises(WrongDimensionError) as wrong:
            client.push(np.ones((2, 5)))
        problem = wrong.value
        assert isinstance(problem, InvalidVectorsError)
        assert (problem.status, problem.slug, problem.title) == (
            422,
            "wrong-dimension",
            "Unprocessable Entity",
        )
        assert problem.extensions == {"expected_dim": 3, "got_dim": 5}
        assert "dimension is 3" in problem.detail
        assert problem.headers["content-type"] == "application/problem+json"

        with pytest.raises(InvalidVectorsError) as nan:
            client.push(np.array([[1.0, np.nan, 2.0]]))
        assert nan.value.slug == "non-finite"
        with pytest.raises(InvalidVectorsError) as empty:
            client.push(np.empty((0, 3)))
        assert empty.value.slug == "empty"
        with pytest.raises(WrongDimensionError):
            client.assign(np.ones((1, 2)))
        with pytest.raises(ValueError, match="2-D"):
            client.push(np.ones(3))
    with Client(proc.base + "/no/such/prefix") as lost, pytest.raises(NotFoundError) as gone:
        lost.stats()
    assert gone.value.status == 404


def test_the_api_key_and_a_body_limit_learnt_from_413(
    serve: Callable[..., Served], redis_log: redis.Redis
) -> None:
    proc, model = serve(api_key=KEY, api_key_reads="true", max_body_bytes=4096)
    X = blobs(500, 8, 3, seed=5)
    with Client(proc.base) as anonymous, pytest.raises(UnauthorizedError) as refused:
        anonymous.push(X)
    assert refused.value.status == 401
    assert refused.value.headers["www-authenticate"].startswith("Bearer")

    with Client(proc.base, api_key=KEY) as client:
        result = client.push(X)
        # 16,000 bytes at first: refused with the limit, then (4096 - 256) // 32 rows each.
        assert client.limits.max_body_bytes == 4096
        assert result.requests == -(-500 // ((4096 - 256) // 32))
        np.testing.assert_array_equal(logged_samples(redis_log, model), X)
        assert client.wait_for(converged=True, min_samples=500, timeout=60).n_samples == 500


def test_wait_for_gives_up_with_the_last_centroids_seen(serve: Callable[..., Served]) -> None:
    proc, _ = serve()
    with Client(proc.base) as client:
        with pytest.raises(WaitTimeoutError, match="no centroids yet"):
            client.wait_for(timeout=0.5)
        client.push(blobs(200, 2, 3, seed=6, separation=20.0))
        model = client.wait_for(converged=True, min_samples=200, timeout=60)
        with pytest.raises(WaitTimeoutError) as late:
            client.wait_for(version=model.version + 10**6, timeout=0.5)
        assert late.value.last is model


def test_the_async_client_pushes_concurrently_and_waits(
    serve: Callable[..., Served], redis_log: redis.Redis
) -> None:
    proc, model = serve()
    parts = [blobs(400, 6, 3, seed=10 + i, separation=20.0) for i in range(3)]

    async def session() -> tuple[Any, Any, dict[str, Any]]:
        async with AsyncClient(proc.base, max_vectors=150) as client:
            # Waiting starts before there is any sample: "not yet" until the pushes land.
            waiting = asyncio.create_task(
                client.wait_for(converged=True, min_samples=1200, timeout=60)
            )
            results = await asyncio.gather(*(client.push(part) for part in parts))
            model_now = await waiting
            assert await client.centroids() is model_now
            assigned = await client.assign(parts[0])
            return results, (model_now, assigned), await client.stats()

    results, (model_now, assigned), stats = asyncio.run(session())
    assert [r.requests for r in results] == [3, 3, 3]
    assert sum(r.accepted for r in results) == 1200
    stored = logged_samples(redis_log, model)
    # Interleaved chunks, each stored once: the same rows as a multiset.
    expected = np.concatenate(parts)
    np.testing.assert_array_equal(stored[np.lexsort(stored.T)], expected[np.lexsort(expected.T)])
    labels, _ = nearest(parts[0], model_now.centroids)
    np.testing.assert_array_equal(assigned.labels, labels)
    assert stats["n_logged"] == 1200


def test_a_named_model_has_its_own_routes_and_the_default_model_is_untouched(
    serve: Callable[..., Served], redis_log: redis.Redis
) -> None:
    proc, default = serve()
    name = f"named-{uuid.uuid4().hex[:10]}"
    spec = {"k": 2, "dim": 5, "batch_size": 64, "seed": 0}
    X = blobs(600, 5, 2, seed=7, separation=20.0)
    statuses = Statuses()
    with httpx.Client(base_url=proc.base, timeout=30) as http:
        assert http.put(f"/models/{name}", json=spec).status_code == 201
        try:
            with Client(
                proc.base, model=name, max_vectors=200, event_hooks={"response": [statuses]}
            ) as client:
                assert client.model == name
                result = client.push(X)
                assert (result.accepted, result.n_samples, result.requests) == (600, 600, 3)
                np.testing.assert_array_equal(logged_samples(redis_log, name), X)
                model_now = client.wait_for(converged=True, min_samples=600, timeout=60)
                assert model_now.centroids.shape == (2, 5) and model_now.n_samples == 600
                assert client.centroids() is model_now  # 304 on the model's own route
                assigned = client.assign(X)
                labels, _ = nearest(X, model_now.centroids)
                np.testing.assert_array_equal(assigned.labels, labels)
                assert client.stats()["n_logged"] == 600
            # Every request went to the model's routes.
            paths = {path for _, path, _ in statuses.seen}
            routes = ("samples", "centroids", "assign", "stats")
            assert paths == {f"/models/{name}/{route}" for route in routes}

            # The default model holds nothing: its log, its stats, its centroids.
            assert log_state(redis_log, default)[:2] == (0, 0)
            with Client(proc.base) as plain:
                assert plain.stats()["n_logged"] == 0
                with pytest.raises(NotEnoughSamplesError):
                    plain.centroids()
            # The default model's name is the default model under /models/ too.

            async def default_by_name() -> int:
                async with AsyncClient(proc.base, model=default) as client:
                    return (await client.stats())["n_logged"]

            assert asyncio.run(default_by_name()) == 0
            with Client(proc.base, model="no-such-model") as lost:
                with pytest.raises(NotFoundError) as unknown:
                    lost.stats()
                assert unknown.value.slug == "unknown-model"
        finally:  # the session's Redis is shared: later services would start the model
            http.delete(f"/models/{name}", params={"confirm": name})


def test_a_raw_push_stores_every_row_once_like_an_npy_push(
    serve: Callable[..., Served], redis_log: redis.Redis
) -> None:
    X = blobs(900, 6, 3, seed=8, separation=20.0)
    results: list[tuple[int, int | None, int, int]] = []
    stored: list[np.ndarray] = []
    content_types: list[set[str]] = []
    for encoding, settings in (("raw", {"dim": 6}), ("npy", {})):
        proc, model = serve(**settings)
        sent: set[str] = set()  # content types of the POSTs

        def record(request: httpx.Request, sent: set[str] = sent) -> None:
            if request.method == "POST":
                sent.add(request.headers["content-type"])

        with Client(proc.base, max_vectors=200, event_hooks={"request": [record]}) as client:
            if encoding == "npy":  # raw float32 needs a known dimension: refused, none stored
                with pytest.raises(ConflictError) as unknown:
                    client.push(X, encoding="raw")
                assert unknown.value.slug == "dimension-unknown"
                assert log_state(redis_log, model)[:2] == (0, 0)
            result = client.push(X, encoding=encoding, progress=lambda done, n: None)
            results.append((result.accepted, result.n_samples, result.requests, result.replayed))
            stored.append(logged_samples(redis_log, model))
            content_types.append(sent)
            assert client.wait_for(converged=True, min_samples=900, timeout=60).n_samples == 900
            assert client.stats()["n_logged"] == 900
    assert results[0] == results[1] == (900, 900, 5, 0)
    # Bit for bit the same rows, in the same order, each once.
    np.testing.assert_array_equal(stored[0], X)
    np.testing.assert_array_equal(stored[1], X)
    # Only raw float32 bodies in the raw push; the npy service also saw the refused raw one.
    assert content_types[0] == {"application/octet-stream"}
    assert content_types[1] == {"application/octet-stream", "application/x-npy"}


def test_model_names_are_checked_as_the_service_checks_them() -> None:
    from nmbatch.service.models.registry import NAME_PATTERN as SERVICE_PATTERN

    assert NAME_PATTERN == SERVICE_PATTERN
    assert model_prefix(None) == ""
    assert model_prefix("tenant-a.v2_1") == "/models/tenant-a.v2_1"
    assert model_prefix("x" * 64) == "/models/" + "x" * 64
    for bad in ("", ".hidden", "-a", "a:b", "a/b", "a b", "x" * 65, "a\n", "é"):
        with pytest.raises(ValueError, match="not a model name"):
            Client("http://127.0.0.1:1", model=bad)
        with pytest.raises(ValueError, match="not a model name"):
            AsyncClient("http://127.0.0.1:1", model=bad)
    with pytest.raises(TypeError):
        Client("http://127.0.0.1:1", model=3)  # type: ignore[arg-type]


def test_from_service_client_is_the_same_client() -> None:
    from service.client import AsyncClient as CheckoutAsync
    from service.client import Client as CheckoutClient

    assert CheckoutClient is Client and CheckoutAsync is AsyncClient


# -- backoff, without a server ---------------------------------------------------------------
class FakeTime:
    """A monotonic clock that only the recorded sleeps move (the retry loop's ``clock``)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def answers(*statuses: tuple[int, dict[str, str]]) -> Callable[[], httpx.Response]:
    """A request that returns the given ``(status, headers)`` answers in turn."""
    queue = iter(statuses)

    def request() -> httpx.Response:
        status, headers = next(queue)
        return httpx.Response(status, headers=headers)

    return request


def test_backoff_doubles_with_jitter_up_to_its_cap_and_stops_at_the_attempts() -> None:
    fake = FakeTime()
    policy = RetryPolicy(attempts=6, deadline=1000, backoff=0.5, max_backoff=3.0, jitter=0.5)
    retrying = policy.retrying(rng=random.Random(1), sleep=fake.sleep, clock=fake.monotonic)
    calls = []

    def refused() -> None:
        calls.append(fake.now)
        raise httpx.ConnectError("refused")

    with pytest.raises(httpx.ConnectError, match="refused"):  # the last failure, raised
        retrying(refused)
    assert len(calls) == 6 and retrying.statistics["attempt_number"] == 6
    assert len(fake.sleeps) == 5
    for n, wait in enumerate(fake.sleeps, start=1):
        ceiling = min(3.0, 0.5 * 2 ** (n - 1))
        assert ceiling * 0.5 <= wait <= ceiling
    calls.clear()

    def bad_url() -> None:
        calls.append(fake.now)
        raise httpx.UnsupportedProtocol("ftp://")

    with pytest.raises(httpx.UnsupportedProtocol):  # not a "no answer": never retried
        policy.retrying(sleep=fake.sleep, clock=fake.monotonic)(bad_url)
    assert len(calls) == 1
    never = RetryPolicy.never().retrying(sleep=fake.sleep, clock=fake.monotonic)
    assert never(answers((503, {}), (200, {}))).status_code == 503
    assert never.statistics["attempt_number"] == 1


def test_retry_after_is_honoured_and_the_deadline_bounds_the_retries() -> None:
    fake = FakeTime()
    policy = RetryPolicy(deadline=10.0, backoff=0.1)
    retrying = policy.retrying(rng=random.Random(0), sleep=fake.sleep, clock=fake.monotonic)
    final = retrying(answers((503, {"retry-after": "4"}), (422, {"retry-after": "4"})))
    assert final.status_code == 422 and fake.sleeps == [4.0]  # a final answer
    fake.sleeps.clear()
    retrying = policy.retrying(rng=random.Random(0), sleep=fake.sleep, clock=fake.monotonic)
    last = retrying(answers((503, {"retry-after": "4"}), (503, {"retry-after": "7"})))
    assert last.status_code == 503 and fake.sleeps == [4.0]  # 4 + 7 s: past the deadline
    assert retrying.statistics["attempt_number"] == 2
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert retry_after_seconds("soon") is None
    assert RetryPolicy.never().attempts == 1


def test_assign_of_a_cosine_model_returns_the_similarities(
    serve: Callable[..., Served],
) -> None:
    proc, _ = serve(metric="cosine")
    directions = blobs(600, 5, 3, seed=4, separation=20.0) + np.float32(30.0)
    with Client(proc.base) as client:
        client.push(directions)
        model_now = client.wait_for(converged=True, min_samples=600, timeout=60)
        assigned = client.assign(directions[:50])
        unit = directions[:50] / np.linalg.norm(directions[:50], axis=1, keepdims=True)
        labels, distances = nearest(unit, model_now.centroids)
        np.testing.assert_array_equal(assigned.labels, labels)
        np.testing.assert_allclose(assigned.distances, distances, rtol=1e-5, atol=1e-5)
        assert assigned.similarities is not None
        cos = np.einsum("ij,ij->i", unit, model_now.centroids[labels].astype(np.float64))
        np.testing.assert_allclose(assigned.similarities, cos, rtol=1e-5, atol=1e-5)


def test_push_with_weights_sends_npz_chunks_and_counts_are_sums_of_weights(
    serve: Callable[..., Served], redis_log: redis.Redis
) -> None:
    """``push(X, weights=w)`` (sync and async), chunked by the rows' bytes with their
    weights: each chunk an ``.npz`` body, each stored once with its weights; the
    centroids' ``counts`` are float sums of weights; weights of a file are refused."""
    from nmbatch.service.storage.codec import decode_chunk, decode_weights
    from nmbatch.service.storage.keys import ModelKeys

    proc, model = serve()
    X = blobs(500, 4, 3, seed=21, separation=20.0)
    w = np.random.default_rng(22).integers(1, 8, size=500) / 2.0
    with Client(proc.base, max_vectors=150) as client:
        pushed = client.push(X[:300], weights=w[:300])
        assert (pushed.accepted, pushed.requests) == (300, 2)
        with pytest.raises(ValueError, match="one per row"):
            client.push(X[:3], weights=w[:2])
        with pytest.raises(ValueError, match="not a file"):
            client.push(iter([X[:3]]), weights=w[:3])

    async def more() -> Any:
        async with AsyncClient(proc.base, max_vectors=150) as client:
            await client.push(X[300:], weights=w[300:])
            return await client.wait_for(converged=True, min_samples=500, timeout=60)

    centroids = asyncio.run(more())
    entries = redis_log.xrange(ModelKeys(model).log)
    rows = np.concatenate([decode_chunk(f) for _, f in entries])
    weights = np.concatenate([decode_weights(f) for _, f in entries])
    assert np.array_equal(rows, X) and np.array_equal(weights, w)
    assert centroids.counts.dtype == np.float64 and centroids.counts.sum() == w.sum()
