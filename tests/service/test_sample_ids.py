"""Sample ids over HTTP (``POST /samples`` with a JSON ``ids`` member, or ids assigned).

Real parts: the session's redis-server, the app with its lifespan and worker. Tested:
sent ids are stored in the model's id map (``nmbatch:{model}:ids``) with the log entry
and row that hold each sample, and answered back; without ids the answer lists the
assigned ``"<entry id>-<row>"``, which name the entry and row; an id already stored (or
stored by a concurrent request) is a 409 problem naming it, with nothing stored; bad ids
are a 422 problem naming the fault (and the row) with nothing stored; an idempotent
retry answers the same ids; the ids survive a restart of the app; two concurrent
requests naming one id store it once.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio

from nmbatch.service.main import create_app
from nmbatch.service.storage import AsyncSampleLog, DuplicateSampleIdError
from nmbatch.service.storage.codec import decode_chunk
from nmbatch.service.storage.keys import ModelKeys
from tests.testkit import SettingsFactory, TestClient, assert_problem, blobs

D, K = 4, 3
NAMED = "named-ids"


def id_map(client: redis.Redis, model: str) -> dict[str, tuple[str, int]]:
    """The model's id map: id -> (entry id, row)."""
    out = {}
    for field, value in client.hgetall(ModelKeys(model).sample_ids).items():
        entry, row = value.decode().split(" ")
        out[field.decode()] = (entry, int(row))
    return out


def row_of(client: redis.Redis, model: str, entry: str, row: int) -> np.ndarray:
    ((_, fields),) = client.xrange(ModelKeys(model).log, entry, entry)
    return np.asarray(decode_chunk(fields)[row])


def log_rows(client: redis.Redis, model: str) -> int:
    return sum(int(fields[b"n"]) for _, fields in client.xrange(ModelKeys(model).log))


@pytest.mark.parametrize("prefix", ["", f"/models/{NAMED}"])
def test_sent_ids_are_stored_with_their_rows_and_answered(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, prefix: str
) -> None:
    model = model_name if not prefix else NAMED
    X = blobs(30, D, K, seed=1)
    ids: list[Any] = [f"doc-{i}" for i in range(20)] + list(range(-5, 5))
    ids[3] = 2**63 - 1  # the largest 64-bit integer
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        if prefix:
            assert client.put(f"/models/{NAMED}", json={"k": K, "dim": D}).status_code == 201
        answer = client.post(f"{prefix}/samples", json={"vectors": X.tolist(), "ids": ids})
        assert answer.status_code == 202, answer.text
        assert answer.json()["ids"] == [str(i) for i in ids]
        stored = id_map(redis_client, model)
        assert sorted(stored) == sorted(str(i) for i in ids)
        for i, sample_id in enumerate(ids):
            entry, row = stored[str(sample_id)]
            assert np.array_equal(row_of(redis_client, model, entry, row), X[i].astype(np.float32))
        # An integer and its decimal string are one id: refused as a duplicate.
        again = client.post(f"{prefix}/samples", json={"vectors": X[:2].tolist(),
                                                       "ids": ["fresh", "-5"]})  # fmt: skip
        problem = assert_problem(again, 409, "duplicate-sample-id")
        assert problem["sample_id"] == "-5"
        assert log_rows(redis_client, model) == 30
        assert "fresh" not in id_map(redis_client, model)


def test_assigned_ids_name_entry_and_row_and_survive_a_restart(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(40, D, K, seed=2)
    settings = make_settings(k=K, dim=D)
    with TestClient(create_app(settings)) as client:
        first = client.post("/samples", json={"vectors": X[:25].tolist()})
        named = client.post("/samples", json={"vectors": X[25:].tolist(),
                                              "ids": [f"n{i}" for i in range(15)]})  # fmt: skip
        assert first.status_code == named.status_code == 202
        assigned = first.json()["ids"]
        assert len(assigned) == len(set(assigned)) == 25
        for i, sample_id in enumerate(assigned):
            ms, seq, row = sample_id.split("-")
            entry = f"{ms}-{seq}"
            assert np.array_equal(row_of(redis_client, model_name, entry, int(row)),
                                  X[i].astype(np.float32))  # fmt: skip
        assert id_map(redis_client, model_name).keys() == {f"n{i}" for i in range(15)}
    with TestClient(create_app(settings)) as client:  # a restart: the map is Redis's
        again = client.post("/samples", json={"vectors": X[:1].tolist(), "ids": ["n7"]})
        assert_problem(again, 409, "duplicate-sample-id")
        assert len(id_map(redis_client, model_name)) == 15
        assert log_rows(redis_client, model_name) == 40


def test_assigned_form_and_other_bad_ids_are_refused(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = np.ones((3, D)).tolist()
    bad = [  # (ids member, row named or None)
        (["a", "b"], None),  # short
        (["a", "b", "c", "d"], None),  # long
        ("abc", None),  # not a list
        (["a", "b", "a"], 2),  # not distinct
        (["a", 1, "1"], 2),  # 1 and "1" are one id
        (["a", "x" * 129, "c"], 1),  # too long
        (["a", "has space", "c"], 1),
        (["a", "b/c", "c"], 1),  # not a path segment
        (["", "b", "c"], 0),
        (["a", "b", 2**63], 2),  # beyond 64 bits
        (["a", 1.5, "c"], 1),
        (["a", True, "c"], 1),
        (["a", None, "c"], 1),
        (["1732870000000-0-17", "b", "c"], 0),  # the form of assigned ids
    ]
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        for ids, row in bad:
            answer = client.post("/samples", json={"vectors": X, "ids": ids})
            problem = assert_problem(answer, 422, "invalid-ids")
            assert problem.get("row") == row, (ids, problem)
        assert log_rows(redis_client, model_name) == 0
        assert redis_client.exists(ModelKeys(model_name).sample_ids) == 0


def test_idempotent_retry_answers_the_same_ids(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(12, D, K, seed=3).tolist()
    key = {"Idempotency-Key": "retry-ids-1"}
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        first = client.post("/samples", json={"vectors": X}, headers=key)
        retry = client.post("/samples", json={"vectors": X}, headers=key)
        assert first.status_code == retry.status_code == 202
        assert retry.headers["Idempotent-Replayed"] == "true"
        assert retry.json()["ids"] == first.json()["ids"] and len(first.json()["ids"]) == 12
        key = {"Idempotency-Key": "retry-ids-2"}
        ids = [f"k{i}" for i in range(12)]
        first = client.post("/samples", json={"vectors": X, "ids": ids}, headers=key)
        retry = client.post("/samples", json={"vectors": X, "ids": ids}, headers=key)
        assert first.json()["ids"] == retry.json()["ids"] == ids
        assert retry.headers["Idempotent-Replayed"] == "true"
        other = client.post("/samples", json={"vectors": X, "ids": ids[::-1]}, headers=key)
        assert_problem(other, 409, "idempotency-key-reused")  # other ids: other request
        assert log_rows(redis_client, model_name) == 24


def test_concurrent_requests_store_one_id_once(redis_url: str, model_name: str) -> None:
    """Many appends racing with overlapping ids: each id is stored exactly once, and
    every refused request stored nothing (rows in the log = ids in the map)."""

    async def race() -> tuple[int, int]:
        client = redis.asyncio.Redis.from_url(redis_url)
        log = AsyncSampleLog(client, model_name)
        X = np.ones((3, D), np.float32)

        async def one(i: int) -> bool:
            try:  # request i names i, i + 1, i + 2: neighbours overlap
                await log.append(X, dim=D, ids=[f"r{i + j}" for j in range(3)])
            except DuplicateSampleIdError:
                return False
            return True

        stored = sum(await asyncio.gather(*(one(i) for i in range(40))))
        n = await log.n_samples()
        await client.aclose()
        return stored, n

    stored, n = asyncio.run(race())
    sync = redis.Redis.from_url(redis_url)
    ids = id_map(sync, model_name)
    # A stored request blocks at most 5 (its neighbours): at least 40 / 5 are stored.
    assert stored >= 8 and n == 3 * stored == len(ids) == log_rows(sync, model_name)
    sync.close()


def npz_bytes(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


NPZ = {"content-type": "application/x-npz"}


def test_npz_bodies_carry_ids_as_integers_or_strings(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(20, D, K, seed=4).astype(np.float32)
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        numbers = np.arange(100, 110, dtype=np.int64)
        answer = client.post("/samples", content=npz_bytes(X=X[:10], ids=numbers), headers=NPZ)
        assert answer.status_code == 202, answer.text
        assert answer.json()["ids"] == [str(i) for i in numbers]
        words = np.array([f"w{i}" for i in range(10)])  # unicode, <U3
        weights = np.full(10, 2.0)
        answer = client.post("/samples", content=npz_bytes(X=X[10:], weights=weights, ids=words),
                             headers=NPZ)  # fmt: skip
        assert answer.status_code == 202, answer.text
        assert answer.json()["ids"] == words.tolist()
        stored = id_map(redis_client, model_name)
        entry, row = stored["w3"]
        assert np.array_equal(row_of(redis_client, model_name, entry, row), X[13])
        bad = [  # (ids member, slug)
            (np.arange(9, dtype=np.int64), "invalid-ids"),  # short
            (np.zeros(10, dtype=np.int64), "invalid-ids"),  # not distinct
            (np.linspace(0, 1, 10), "invalid-ids"),  # floats
            (np.array(["ok"] * 9 + ["x" * 129]), "invalid-ids"),  # too long a dtype
            (np.array([f"a b{i}" for i in range(10)]), "invalid-ids"),
            (np.arange(10)[:, None], "invalid-ids"),  # 2-D
            (np.ones(10, dtype=bool), "non-numeric"),
            (np.array([f"w{i}" for i in range(10)]), "duplicate-sample-id"),  # stored already
        ]
        for ids, slug in bad:
            answer = client.post("/samples", content=npz_bytes(X=X[:10], ids=ids), headers=NPZ)
            assert_problem(answer, 409 if slug == "duplicate-sample-id" else 422, slug)
        assert log_rows(redis_client, model_name) == 20


@pytest.mark.parametrize("kind", ["integers", "strings"])
def test_a_parse_with_ids_costs_a_bounded_multiple_of_its_body(kind: str) -> None:
    """docs/operations/limits.md: a parse takes at most 40 bytes per body byte, also with
    ids (the worst case: one coordinate and a short id per vector; measured 21-23)."""
    import tracemalloc

    import orjson

    from nmbatch.service.parsing import parse_samples

    n = 50_000
    ids: list[Any] = list(range(n)) if kind == "integers" else [f"a{i}" for i in range(n)]
    body = bytearray(orjson.dumps({"vectors": [[i % 10] for i in range(n)], "ids": ids}))
    parse_samples(body, "application/json", dim=None, max_vectors=10**6, max_dim=4096)
    tracemalloc.start()
    try:
        X, _, parsed = parse_samples(body, "application/json", dim=None, max_vectors=10**6,
                                     max_dim=4096)  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parsed == [str(i) for i in ids] and X.shape == (n, 1)
    assert peak <= 40 * len(body), peak / len(body)
