"""Kept versions and pins (issue 36, items 1 and 2), against a real redis-server.

Each snapshot written is kept (``nmbatch:{model}:version:{V}``, indexed by
``nmbatch:{model}:versions``) within the bound, the pinned version counted and never
forgotten; ``?version=V`` reads a kept version; ``POST /pin`` makes every read serve V
while training goes on; both need their scopes, refuse bad input with a problem naming it
and change nothing then; deleting a model deletes its versions and pin; a new app on the
same Redis (a restart) keeps both. The restart of a real service process is
``tests/faults/test_versions_restart.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
import redis
import redis.asyncio
from service_helpers import post_npy

from nmbatch.engine.state import ModelState
from nmbatch.service.identities import Lineage
from nmbatch.service.main import create_app
from nmbatch.service.models.manager import SYNC_SECONDS
from nmbatch.service.state import PublishedModel
from nmbatch.service.storage import ModelKeys, ModelRepository, Snapshot
from nmbatch.service.storage.capacity import (
    VERSION_CACHE_ENTRIES,
    plan_capacity,
    version_bytes,
    versions_bound,
    versions_footprint,
)
from nmbatch.service.storage.versions import VERSION_RECHECK_SECONDS, AsyncKeptVersions
from tests.testkit import SettingsFactory, TestClient, assert_problem, wait_until

NAMED = "versioned"
SPEC: dict[str, Any] = {"k": 3, "dim": 2, "rho": 100, "batch_size": 32, "seed": 1}
ADMIN = "admin-key-0123456789abcdef"
READ = "read-key-0123456789abcdef"
WRITE = "write-key-0123456789abcdef"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def snapshot_of(version: int, k: int = 3, d: int = 2, seed: int = 0) -> Snapshot:
    """A snapshot of version ``version`` with random centroids."""
    rng = np.random.default_rng(seed + version)
    state = ModelState(
        centroids=rng.standard_normal((k, d)).astype(np.float32),
        counts=np.arange(k, dtype=np.int64),
        batch_size=32,
        n_samples=10 * version,
        iteration=version,
        converged=False,
        initialized=True,
        energy=1.0 / version,
    )
    lineage = Lineage.start(version - 1 or None, k)  # as the worker keeps it (5 k bytes)
    model = PublishedModel.build(version=version, state=state, lineage=lineage)
    return Snapshot(model, f"{version}-0")


def kept_in_redis(client: redis.Redis, model: str) -> list[int]:
    """The kept versions, after checking that the index and the records agree exactly."""
    keys = ModelKeys(model)
    index = sorted(int(v) for v in client.zrange(keys.versions, 0, -1))
    records = sorted(
        int(key.rsplit(b":", 1)[1]) for key in client.scan_iter(match=keys.prefix + "version:*")
    )
    assert index == records, f"index {index} and records {records} differ"
    return index


def more_versions(client: TestClient, prefix: str, rng: np.random.Generator, count: int) -> None:
    """Post a batch and wait until the model settles on it (converged on every sample
    logged, its newest version kept); ``count`` times, each a new kept version."""
    for _ in range(count):
        before = client.get(f"{prefix}/versions").json()["versions"]
        last = before[-1]["version"] if before else 0
        X = rng.standard_normal((40, 2)).astype(np.float32) + rng.integers(0, 20, (1, 2))
        assert post_npy(client, X, f"{prefix}/samples").status_code == 202

        def settled(last: int = last) -> bool:
            stats = client.get(f"{prefix}/stats").json()
            kept = client.get(f"{prefix}/versions").json()["versions"]
            return bool(
                stats["converged"]
                and stats["n_samples"] == stats["n_logged"]
                and kept
                and kept[-1]["version"] == stats["version"] > last
            )

        wait_until(settled, 30, "a new kept version, the model settled")


# -- storage: the bound, the pin, the bytes --------------------------------------------------
def test_each_snapshot_is_kept_and_the_oldest_unpinned_forgotten_past_the_bound(
    redis_client: redis.Redis, model_name: str
) -> None:
    repository = ModelRepository(redis_client, model_name)
    keys = ModelKeys(model_name)
    for version in (1, 2, 3, 4):
        assert repository.write_snapshot(snapshot_of(version), keep=3)
        assert kept_in_redis(redis_client, model_name) == list(
            range(max(1, version - 2), version + 1)
        )
    # The record is the snapshot's fields: it reads back as the model served then.
    stored = Snapshot.from_fields(redis_client.hgetall(keys.version(4))).model
    np.testing.assert_array_equal(stored.state.centroids, snapshot_of(4).model.state.centroids)
    assert (stored.version, stored.state.energy) == (4, 0.25)
    # The pinned version counts in the bound and is never forgotten.
    redis_client.set(keys.pin, 2)
    for version in (5, 6):
        repository.write_snapshot(snapshot_of(version), keep=3)
    assert kept_in_redis(redis_client, model_name) == [2, 5, 6]
    # A bound of one held by the pin: newer versions are snapshotted but not kept.
    assert repository.write_snapshot(snapshot_of(7), keep=1)
    assert kept_in_redis(redis_client, model_name) == [2]
    assert int(redis_client.hget(keys.snapshot, "version")) == 7
    # Unpinned, the next snapshot brings the set back to its bound.
    redis_client.delete(keys.pin)
    repository.write_snapshot(snapshot_of(8), keep=2)
    assert kept_in_redis(redis_client, model_name) == [2, 8]
    repository.write_snapshot(snapshot_of(9), keep=0)
    assert kept_in_redis(redis_client, model_name) == []


def test_the_bound_is_the_lower_of_the_count_and_the_bytes() -> None:
    one = version_bytes(100, 128)
    assert one >= 4 * 100 * 128 + 8 * 100
    assert versions_bound(32, 10 * one, 100, 128) == 10
    assert versions_bound(32, 10 * one - 1, 100, 128) == 9
    assert versions_bound(5, 10 * one, 100, 128) == 5
    assert versions_bound(5, 0, 100, 128) == 0
    assert versions_bound(5, 0, 100, None) == 5  # the bytes apply once d is known


def test_the_kept_versions_enter_the_capacity_plan() -> None:
    memory = (8 << 30, "test")
    keep = (32, 64 << 20)
    plain = plan_capacity(None, 128, 100, memory=memory, with_redis=True)
    planned = plan_capacity(None, 128, 100, memory=memory, with_redis=True, keep=keep)
    fixed = versions_footprint(keep, 100, 128, with_redis=True)
    assert fixed == (VERSION_CACHE_ENTRIES + 1) * (4 * 100 * 128 + 13 * 100) + 32 * version_bytes(
        100, 128
    )
    per_vector = (int(0.5 * memory[0]) - fixed) // planned.max_samples
    assert planned.max_samples < plain.max_samples
    assert planned.max_samples == (int(0.5 * memory[0]) - fixed) // per_vector
    assert "kept versions" in planned.detail


@pytest.mark.parametrize(("k", "d", "n"), [(3, 8, 200), (1, 8191, 3), (100, 128, 3)])
def test_a_kept_version_takes_at_most_version_bytes(
    redis_client: redis.Redis, k: int, d: int, n: int
) -> None:
    """Exact sizes (``SAMPLES 0``): small arrays, arrays just above one of jemalloc's size
    classes (32,772 bytes: rounded up by 25%), and an index past its listpack (200)."""
    model = "m" * 64  # the longest name: the longest key names
    keys = ModelKeys(model)
    repository = ModelRepository(redis_client, model)
    for version in range(1, n + 1):
        repository.write_snapshot(snapshot_of(version, k, d), keep=1000)
        record = redis_client.memory_usage(keys.version(version), samples=0)
        assert record is not None
    index = redis_client.memory_usage(keys.versions, samples=0)
    records = sum(redis_client.memory_usage(keys.version(v), samples=0) for v in range(1, n + 1))
    assert records + index <= n * version_bytes(k, d), (records / n, index / n)


def test_a_cached_version_is_rechecked_and_dropped_once_forgotten(
    redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    repository = ModelRepository(redis_client, model_name)
    repository.write_snapshot(snapshot_of(1), keep=2)
    now = [0.0]

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            kept = AsyncKeptVersions(client, model_name, clock=lambda: now[0])
            first = await kept.model(1)
            assert first is not None and first.version == 1
            assert await kept.model(1) is first  # cached: the same object
            repository.write_snapshot(snapshot_of(2), keep=1)
            repository.write_snapshot(snapshot_of(3), keep=1)  # version 1 forgotten
            assert await kept.model(1) is first  # within the recheck time: from memory
            now[0] += VERSION_RECHECK_SECONDS
            assert await kept.model(1) is None  # rechecked against the index
            assert await kept.model(2) is None
            for version in range(10, 10 + VERSION_CACHE_ENTRIES + 2):  # bounded
                repository.write_snapshot(snapshot_of(version), keep=100)
                assert await kept.model(version) is not None
            assert len(kept._cache) == VERSION_CACHE_ENTRIES
            assert not await kept.pin(2) and await kept.pinned() is None
            assert await kept.pin(10) and await kept.pinned() == 10
        finally:
            await client.aclose()

    asyncio.run(run())


# -- the HTTP side ----------------------------------------------------------------------------
@pytest.mark.parametrize("named", [False, True], ids=["default", "named"])
def test_kept_versions_are_listed_read_and_pinned_while_newer_are_published(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, named: bool
) -> None:
    settings = make_settings(k=3, dim=2, batch_size=32, snapshot_seconds=0.05, keep_versions=4)
    name = NAMED if named else model_name
    prefix = f"/models/{NAMED}" if named else ""
    rng = np.random.default_rng(3)
    with TestClient(create_app(settings)) as client:
        if named:
            assert client.put(f"/models/{NAMED}", json=SPEC).status_code == 201
        more_versions(client, prefix, rng, 3)
        listing = client.get(f"{prefix}/versions").json()
        assert listing["model"] == name and listing["bound"] == 4 and listing["pinned"] is None
        versions = [row["version"] for row in listing["versions"]]
        assert versions == sorted(versions) and 3 <= len(versions) <= 4
        assert versions == kept_in_redis(redis_client, name)
        first = listing["versions"][0]
        assert first["changed"] == "the oldest kept version"
        assert (first["k"], first["dim"]) == (3, 2) and first["energy"] is not None
        assert "iterations" in listing["versions"][1]["changed"]

        V = versions[0]
        record = Snapshot.from_fields(redis_client.hgetall(ModelKeys(name).version(V))).model
        kept_centroids = record.state.centroids
        doc = client.get(f"{prefix}/centroids", params={"version": V}).json()
        assert doc["version"] == V
        np.testing.assert_array_equal(np.float32(doc["centroids"]), kept_centroids)
        x = np.float32([[3.0, -1.0]])
        expected = int(np.argmin(((kept_centroids - x) ** 2).sum(axis=1)))
        one = client.get(f"{prefix}/assign", params={"vector": "3,-1", "version": V}).json()
        assert (one["version"], one["cluster"]) == (V, expected)
        many = client.post(f"{prefix}/assign?version={V}", json={"vectors": x.tolist()}).json()
        assert (many["version"], many["clusters"]) == (V, [expected])

        # Pinned: every read serves V while training publishes newer versions.
        pinned = client.post(f"{prefix}/pin", json={"version": V})
        assert pinned.status_code == 200 and pinned.json()["pinned"] == V
        assert redis_client.get(ModelKeys(name).pin) == str(V).encode()
        more_versions(client, prefix, rng, 4)
        stats = client.get(f"{prefix}/stats").json()
        assert stats["version"] > V and stats["pinned_version"] == V
        assert stats["versions_kept"] == len(kept_in_redis(redis_client, name)) <= 4
        assert V in kept_in_redis(redis_client, name)  # never forgotten while pinned
        centroids = client.get(f"{prefix}/centroids")
        assert centroids.json()["version"] == V and centroids.headers["etag"] == f'"{V}"'
        np.testing.assert_array_equal(np.float32(centroids.json()["centroids"]), kept_centroids)
        assert client.get(f"{prefix}/assign", params={"vector": "3,-1"}).json()["version"] == V
        assert client.post(f"{prefix}/assign", json={"vectors": [[3, -1]]}).json()["version"] == V
        board = client.get(f"{prefix}/dashboard/data").json()
        assert board["centroids_version"] == board["centroids"]["version"] == V

        # Unpinned: the newest again.
        lifted = client.delete(f"{prefix}/pin").json()
        assert lifted["pinned"] is None and lifted["served"] >= stats["version"] > V
        assert redis_client.get(ModelKeys(name).pin) is None
        assert client.get(f"{prefix}/centroids").json()["version"] > V
        assert client.get(f"{prefix}/stats").json()["pinned_version"] is None


def test_bad_versions_and_pins_are_refused_and_change_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(k=3, dim=2, snapshot_seconds=0.05, keep_versions=2)
    rng = np.random.default_rng(4)
    with TestClient(create_app(settings)) as client:
        more_versions(client, "", rng, 3)
        kept = kept_in_redis(redis_client, model_name)
        assert len(kept) == 2
        gone = kept[0] - 1  # forgotten (or never kept)
        for path, params in (("/centroids", {}), ("/assign", {"vector": "1,2"})):
            response = client.get(path, params={"version": gone, **params})
            problem = assert_problem(response, 404, "version-not-kept")
            assert (problem["version"], problem["kept"]) == (gone, kept)
        for bad in ("0", "-3", "abc", "1.5", str(1 << 53), str(1 << 64)):
            assert_problem(client.get("/centroids", params={"version": bad}), 422)
        for body, named in (
            ({"version": "3"}, "body.version"), ({"version": 1.5}, "body.version"),
            ({"version": True}, "body.version"), ({}, "body.version"),
            ({"version": 0}, "body.version"), ({"version": None}, "body.version"),
            ({"version": 1 << 53}, "body.version"), ({"version": "abc"}, "body.version"),
            ({"version": kept[-1], "also": 1}, "body.also"), ([kept[-1]], "body"),
        ):  # fmt: skip
            problem = assert_problem(client.post("/pin", json=body), 422)
            assert problem["detail"].startswith(named), problem
        as_json = {"content-type": "application/json"}
        assert_problem(client.post("/pin", content=b"{", headers=as_json), 422)
        assert_problem(
            client.post("/pin", content=b"version=3", headers={"content-type": "text/plain"}), 415
        )
        assert_problem(client.post("/pin", content=b" " * 2000), 413)
        problem = assert_problem(
            client.post("/pin", json={"version": gone}), 404, "version-not-kept"
        )
        assert problem["kept"] == kept
        assert redis_client.get(ModelKeys(model_name).pin) is None
        assert client.get("/stats").json()["pinned_version"] is None
        assert_problem(client.get("/models/nope/versions"), 404, "unknown-model")


def test_pin_needs_the_admin_scope_and_versions_the_read_scope(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    keys = f"{READ} read; {WRITE} write; {ADMIN} admin"
    settings = make_settings(dim=2, snapshot_seconds=0.05, api_keys=keys, api_key_reads=True)
    with TestClient(create_app(settings)) as client:
        X = np.random.default_rng(5).standard_normal((50, 2)).astype(np.float32)
        client.post("/samples", json={"vectors": X.tolist()}, headers=bearer(WRITE))
        listing = wait_until(
            lambda: client.get("/versions", headers=bearer(READ)).json()["versions"],
            30, "a kept version",
        )  # fmt: skip
        V = listing[0]["version"]
        assert_problem(client.get("/versions"), 401)
        for key in (READ, WRITE):
            refused = assert_problem(
                client.post("/pin", json={"version": V}, headers=bearer(key)), 403, "forbidden"
            )
            assert refused["scope"] == "admin"
            assert_problem(client.delete("/pin", headers=bearer(key)), 403, "forbidden")
        assert redis_client.get(ModelKeys(model_name).pin) is None
        assert client.post("/pin", json={"version": V}, headers=bearer(ADMIN)).status_code == 200
        assert client.delete("/pin", headers=bearer(ADMIN)).status_code == 200


def test_deleting_a_model_deletes_its_kept_versions_and_pin(
    make_settings: SettingsFactory, redis_client: redis.Redis
) -> None:
    settings = make_settings(snapshot_seconds=0.05)
    with TestClient(create_app(settings)) as client:
        assert client.put(f"/models/{NAMED}", json=SPEC).status_code == 201
        more_versions(client, f"/models/{NAMED}", np.random.default_rng(6), 2)
        V = kept_in_redis(redis_client, NAMED)[0]
        assert client.post(f"/models/{NAMED}/pin", json={"version": V}).status_code == 200
        assert client.delete(f"/models/{NAMED}?confirm={NAMED}").status_code == 200
        assert redis_client.keys(ModelKeys(NAMED).prefix + "*") == []
        assert client.put(f"/models/{NAMED}", json=SPEC).status_code == 201
        assert client.get(f"/models/{NAMED}/versions").json()["versions"] == []
        assert client.get(f"/models/{NAMED}/stats").json()["pinned_version"] is None


def test_a_new_app_on_the_same_redis_keeps_the_versions_and_the_pin(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(dim=2, snapshot_seconds=0.05, keep_versions=3)
    rng = np.random.default_rng(7)
    with TestClient(create_app(settings)) as client:
        more_versions(client, "", rng, 4)
        before = client.get("/versions").json()["versions"]
        V = before[0]["version"]
        assert client.post("/pin", json={"version": V}).status_code == 200
    with TestClient(create_app(settings)) as client:
        after = client.get("/versions").json()
        assert after["pinned"] == V
        assert [r["version"] for r in after["versions"]][: len(before)] == [
            r["version"] for r in before
        ][: len(after["versions"])]
        assert client.get("/centroids").json()["version"] == V
        more_versions(client, "", rng, 3)
        kept = kept_in_redis(redis_client, model_name)
        assert V in kept and len(kept) <= 3
        assert client.get("/centroids").json()["version"] == V


def test_a_pin_set_or_lifted_elsewhere_is_followed_at_the_next_sync(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    """Another process's pin reaches this one through its registry sync (every 2 s); a
    pin whose record is missing (never expected) is not served: reads follow the newest."""
    settings = make_settings(dim=2, snapshot_seconds=0.05)
    pin = ModelKeys(model_name).pin
    with TestClient(create_app(settings)) as client:
        more_versions(client, "", np.random.default_rng(8), 3)
        kept = kept_in_redis(redis_client, model_name)
        newest = client.get("/centroids").json()["version"]
        redis_client.set(pin, kept[0])  # as POST /pin in another process does
        wait_until(lambda: client.get("/centroids").json()["version"] == kept[0], 10, "the pin")
        assert client.get("/stats").json()["pinned_version"] == kept[0]
        redis_client.delete(pin)
        wait_until(lambda: client.get("/centroids").json()["version"] == newest, 10, "unpinned")
        redis_client.set(pin, newest + 1000)  # no such record
        time.sleep(2 * SYNC_SECONDS + 0.5)
        assert client.get("/centroids").json()["version"] == newest
        assert client.get("/stats").json()["pinned_version"] is None
