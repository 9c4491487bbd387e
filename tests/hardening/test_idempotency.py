"""Idempotency-Key on POST /samples: a retry is acknowledged again and stored once, a
reused key with other vectors is refused, concurrent duplicates store once, keys expire."""

from __future__ import annotations

import asyncio
import concurrent.futures
from unittest.mock import ANY

import httpx
import numpy as np
import pytest
import redis
from hardening_helpers import live_server

from nmbatch.service.main import create_app
from nmbatch.service.storage import CHUNK_BYTES, ModelKeys
from nmbatch.service.storage.capacity import IDEMPOTENCY_RECORD_BYTES
from nmbatch.service.usecases.serving import ingest
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_problem,
    log_state,
    logged_samples,
    npy_bytes,
    wait_until,
)

NPY = {"content-type": "application/x-npy"}


def key(value: str) -> dict[str, str]:
    return {"Idempotency-Key": value}


def test_a_retry_is_answered_again_and_stored_once(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    X = [[0.5, 1.0], [2.0, -3.25]]
    client.post("/samples", json={"vectors": [[9.0, 9.0]]})
    first = client.post("/samples", json={"vectors": X}, headers=key("retry-1"))
    assert first.status_code == 202 and first.json() == {"accepted": 2, "n_samples": 3, "ids": ANY}
    assert "idempotent-replayed" not in first.headers
    # Meanwhile somebody else stores a sample: the replay still gives the first answer.
    client.post("/samples", json={"vectors": [[7.0, 7.0]]})
    state = log_state(redis_client, model_name)
    again = client.post("/samples", json={"vectors": X}, headers=key("retry-1"))
    assert again.status_code == 202 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    # The same vectors in another encoding are the same request.
    as_npy = client.post("/samples", content=npy_bytes(np.float64(X)), headers=NPY | key("retry-1"))
    assert as_npy.status_code == 202 and as_npy.json() == first.json()
    assert log_state(redis_client, model_name) == state == (3, 4, b"2")
    np.testing.assert_array_equal(
        logged_samples(redis_client, model_name), np.float32([[9, 9], *X, [7, 7]])
    )


def test_the_same_key_with_other_vectors_is_a_409_and_stores_nothing(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    assert client.post("/samples", json={"vectors": [[1.0, 2.0]]}, headers=key("k")).is_success
    state = log_state(redis_client, model_name)
    for other in ([[1.0, 2.5]], [[1.0, 2.0], [1.0, 2.0]]):
        response = client.post("/samples", json={"vectors": other}, headers=key("k"))
        assert_problem(response, 409, "idempotency-key-reused")
    assert log_state(redis_client, model_name) == state == (1, 1, b"2")
    # Another key stores the same vectors again: keys, not bodies, say what is a retry.
    response = client.post("/samples", json={"vectors": [[1.0, 2.0]]}, headers=key("k2"))
    assert response.json() == {"accepted": 1, "n_samples": 2, "ids": ANY}


def test_a_refused_request_leaves_its_key_free(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    client.post("/samples", json={"vectors": [[1.0, 2.0]]})
    bad = client.post("/samples", json={"vectors": [[1.0, "x"]]}, headers=key("fix-me"))
    assert_problem(bad, 422, "non-numeric")
    assert not redis_client.exists(ModelKeys(model_name).idempotency("fix-me"))
    good = client.post("/samples", json={"vectors": [[3.0, 4.0]]}, headers=key("fix-me"))
    assert good.json() == {"accepted": 1, "n_samples": 2, "ids": ANY}


@pytest.mark.parametrize(
    "bad_key",
    ["x" * 256, "has space", "tab\there", "", "caf\xe9"],
    ids=["256 chars", "space", "control char", "empty", "non-ASCII"],
)
def test_an_invalid_key_is_refused_before_the_body_is_read(
    client: TestClient, redis_client: redis.Redis, model_name: str, bad_key: str
) -> None:
    response = client.post(
        "/samples",
        json={"vectors": [[1.0, 2.0]]},
        headers={"Idempotency-Key": bad_key.encode("latin-1")},
    )
    problem = assert_problem(response, 422, "invalid-request")
    assert "Idempotency-Key" in problem["detail"]
    assert log_state(redis_client, model_name) == (0, 0, None)
    ok = client.post("/samples", json={"vectors": [[1.0, 2.0]]}, headers=key("y" * 255))
    assert ok.status_code == 202


def test_entries_are_those_of_the_plain_path_and_the_worker_reads_them(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    d = 64
    rows = 2 * (CHUNK_BYTES // (4 * d)) + 5  # three log entries
    X = np.random.default_rng(1).normal(size=(rows, d)).astype(np.float32)
    with TestClient(create_app(make_settings(k=3, batch_size=5000))) as client:
        response = client.post("/samples", content=npy_bytes(X), headers=NPY | key("big"))
        assert response.json() == {"accepted": rows, "n_samples": rows, "ids": ANY}
        assert log_state(redis_client, model_name) == (3, rows, b"64")
        np.testing.assert_array_equal(logged_samples(redis_client, model_name), X)

        def consumed() -> bool:
            doc = client.get("/centroids")
            return doc.status_code == 200 and doc.json()["n_samples"] == rows

        wait_until(consumed, what="the worker to read the entries")


def test_concurrent_duplicates_store_once_over_http(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = np.random.default_rng(2).normal(size=(500, 8)).round(3).tolist()
    # Sixteen writers at once right after reads: with shedding on, the loop's lag may
    # turn some away (503 overloaded, nothing stored; test_admission covers that). Here
    # every one must reach the idempotent append.
    with live_server(make_settings(write_shed_lag_ms=0)) as server:
        httpx.post(f"{server.base_url}/samples", json={"vectors": [[0.0] * 8]}, timeout=30)

        def send(_: int) -> httpx.Response:
            return httpx.post(
                f"{server.base_url}/samples",
                json={"vectors": X},
                headers=key("concurrent"),
                timeout=30,
            )

        def warm(_: int) -> int:  # opens several Redis connections in the server
            return httpx.get(f"{server.base_url}/stats", timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert set(pool.map(warm, range(32))) == {200}
            responses = list(pool.map(send, range(16)))
    assert {r.status_code for r in responses} == {202}
    assert len({r.text for r in responses}) == 1  # the same answer, its assigned ids too
    answer = responses[0].json()
    assert (answer["accepted"], answer["n_samples"], len(answer["ids"])) == (500, 501, 500)
    assert sum("idempotent-replayed" not in r.headers for r in responses) == 1
    assert log_state(redis_client, model_name)[1] == 501


def test_concurrent_duplicates_store_once_in_one_event_loop(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    """The check and the append are one step: 20 interleaved calls, one append."""
    client.post("/samples", json={"vectors": [[0.0, 0.0]]})
    handle = client.app.state.models.default
    X = np.float32([[1.0, 2.0], [3.0, 4.0]])

    async def race() -> list:
        # Twenty open connections first, so no call waits for one and all interleave.
        pool = handle.sample_log.client.connection_pool
        connections = [await pool.get_connection() for _ in range(20)]
        for connection in connections:
            await pool.release(connection)
        return await asyncio.gather(*(ingest(handle, X, "race") for _ in range(20)))

    outcomes = client.portal.call(race)
    assert sum(o.stored for o in outcomes) == 1
    assert {(o.accepted, o.n_samples) for o in outcomes} == {(2, 3)}
    assert log_state(redis_client, model_name) == (2, 3, b"2")


def test_keys_expire_after_idempotency_seconds(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    with TestClient(create_app(make_settings(idempotency_seconds=0.5))) as client:
        client.post("/samples", json={"vectors": [[1.0, 2.0]]}, headers=key("short-lived"))
        record = ModelKeys(model_name).idempotency("short-lived")
        assert 0 < redis_client.pttl(record) <= 500
        wait_until(lambda: not redis_client.exists(record), 10, "the key to expire")
        response = client.post(
            "/samples", json={"vectors": [[5.0, 6.0]]}, headers=key("short-lived")
        )
        assert response.json() == {"accepted": 1, "n_samples": 2, "ids": ANY}
    with TestClient(create_app(make_settings())) as client:
        client.post("/samples", json={"vectors": [[1.0, 2.0]]}, headers=key("long-lived"))
        ttl = redis_client.pttl(ModelKeys(model_name).idempotency("long-lived"))
        assert 86_000_000 < ttl <= 86_400_000


def test_records_are_bounded_oldest_first_and_posts_keep_being_accepted(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    """Issue 34, item 5: thousands of keyed requests (a key each, as the client sends)
    keep at most NMBATCH_IDEMPOTENCY_MAX_KEYS records, within their byte budget; the
    oldest are forgotten first, and a retry of a forgotten key is stored again."""
    bound, sent = 200, 2000
    settings = make_settings(idempotency_max_keys=bound, retention="window", max_samples=500)
    keys = ModelKeys(model_name)
    with TestClient(create_app(settings)) as client:
        for i in range(sent):
            response = client.post(
                "/samples", json={"vectors": [[float(i), 1.0]]}, headers=key(f"chunk-{i}")
            )
            assert response.status_code == 202, response.text
            assert "idempotent-replayed" not in response.headers
        records = list(redis_client.scan_iter(match=keys.idempotency_prefix + "*", count=1000))
        assert len(records) == bound and redis_client.zcard(keys.idempotency_index) == bound
        used = sum(redis_client.memory_usage(r) for r in records)
        used += redis_client.memory_usage(keys.idempotency_index, samples=0)
        assert used <= bound * IDEMPOTENCY_RECORD_BYTES, used
        # The newest keys are kept (a retry is answered again), the oldest forgotten.
        newest = client.post(
            "/samples", json={"vectors": [[float(sent - 1), 1.0]]}, headers=key(f"chunk-{sent - 1}")
        )
        assert newest.headers["idempotent-replayed"] == "true"
        assert newest.json() == {"accepted": 1, "n_samples": sent, "ids": ANY}
        oldest = client.post("/samples", json={"vectors": [[0.0, 1.0]]}, headers=key("chunk-0"))
        assert oldest.status_code == 202 and "idempotent-replayed" not in oldest.headers
        assert oldest.json() == {"accepted": 1, "n_samples": sent + 1, "ids": ANY}  # stored again
