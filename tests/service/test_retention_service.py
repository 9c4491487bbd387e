"""Retention in the service (``NMBATCH_RETENTION``): what the worker keeps, what Redis
keeps, what a restart rebuilds, and what the API says. Real ``redis-server``, the real
app, the engine in the worker thread (``worker_process=False``) so the test can read the
retained rows."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import redis
from pydantic import ValidationError
from service_helpers import post_npy

from nmbatch.service.config import Settings
from nmbatch.service.main import create_app
from nmbatch.service.storage.handoff import MIN_HANDOFF_BYTES, handoff_bytes
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.worker import retention as worker_retention
from tests.testkit import (
    SettingsFactory,
    TestClient,
    blobs,
    logged_samples,
    metric,
    wait_until,
)

D = 4


def _caught_up(client: TestClient, n_samples: int, n_ingested: int, timeout: float = 30.0):
    """The /centroids document once converged on ``n_samples`` of ``n_ingested``."""

    worker = client.app.state.models.default.worker

    def ready() -> dict[str, Any] | None:
        assert worker.error is None, f"the worker failed: {worker.error!r}"
        response = client.get("/centroids")
        if response.status_code != 200:
            return None
        doc = response.json()
        done = doc["n_samples"] == n_samples and doc["n_ingested"] == n_ingested
        return doc if done and doc["converged"] else None

    return wait_until(ready, timeout, f"convergence on {n_samples} of {n_ingested} samples")


def _retained(client: TestClient) -> tuple[np.ndarray, np.ndarray]:
    """(stream ids sorted, their rows) held by the worker's engine, once it has caught up
    with the log and converged (after a restart, the snapshot is served before)."""
    worker = client.app.state.models.default.worker
    wait_until(lambda: worker.engine is not None and worker.phase == "converged", 10, "engine")
    engine = worker.engine
    ids = np.sort(engine._algo.store.ids())
    return ids, engine.rows_of(ids)


def _assert_centroids_are_cell_means(doc: dict[str, Any], rows: np.ndarray) -> None:
    """Converged: each centroid is the mean of the retained rows nearest to it."""
    C = np.asarray(doc["centroids"], dtype=np.float64)
    d2 = ((rows[:, None, :].astype(np.float64) - C[None]) ** 2).sum(-1)
    labels = d2.argmin(1)
    assert sum(doc["counts"]) == rows.shape[0]
    for j in range(C.shape[0]):
        if (labels == j).any():
            np.testing.assert_allclose(C[j], rows[labels == j].mean(0), rtol=1e-4, atol=1e-4)


def _post_all(client: TestClient, X: np.ndarray, batch: int) -> None:
    for start in range(0, X.shape[0], batch):
        response = post_npy(client, X[start : start + batch])
        assert response.status_code == 202, response.text


# -- settings ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"retention": "window"}, "needs NMBATCH_MAX_SAMPLES"),
        ({"retention": "reservoir"}, "needs NMBATCH_MAX_SAMPLES"),
        ({"retention": "window", "max_samples": 5, "k": 8}, "window size could never hold"),
        ({"retention": "age"}, "needs NMBATCH_MAX_AGE_SECONDS"),
        ({"retention": "window", "max_samples": 100, "max_age_seconds": 3}, "only used by"),
        ({"retention": "forever"}, "retention"),
        ({"retention": "age", "max_age_seconds": 0}, "greater than 0"),
    ],
)
def test_retention_settings_are_validated_at_start_up(overrides: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**overrides)


def test_retention_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NMBATCH_RETENTION", "age")
    monkeypatch.setenv("NMBATCH_MAX_AGE_SECONDS", "90.5")
    settings = Settings()
    assert settings.retention == "age" and settings.max_age_seconds == 90.5


# -- window --------------------------------------------------------------------------------
def test_window_keeps_the_last_samples_trims_the_log_and_restarts_exactly(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    W = 600
    settings = make_settings(retention="window", max_samples=W, worker_process=False)
    X = blobs(3000, D, 3, seed=7)
    with TestClient(create_app(settings)) as client:
        _post_all(client, X, 300)  # five windows: never a 507
        doc = _caught_up(client, W, 3000)
        assert doc["retention"] == "window"
        rows = _retained(client)[1]
        assert np.array_equal(rows, X[-W:])  # ids count from the log's first entry
        assert client.app.state.models.default.worker.engine._algo.swap  # swaps follow the window
        local = client.app.state.models.default.worker.repository.local  # bounded by the window
        assert local is not None and local.max_bytes == handoff_bytes(W, D) == MIN_HANDOFF_BYTES
        _assert_centroids_are_cell_means(doc, rows)
        logged = logged_samples(redis_client, model_name)
        assert logged.shape[0] == W and np.array_equal(logged, X[-W:])  # whole entries trimmed
        stats = client.get("/stats").json()
        assert stats["retention"] == "window" and stats["retained"] == W
        assert stats["n_retired"] == 3000 - W and stats["n_ingested"] == 3000
        assert stats["log_entries"] == 2 and stats["log_bytes"] > 0
        metrics = client.get("/metrics").text
        assert metric(metrics, "nmbatch_samples_retired") == 3000 - W
        assert metric(metrics, "nmbatch_log_entries_trimmed_total") == 8.0
    with TestClient(create_app(settings)) as client:  # a restart rebuilds the window
        doc = _caught_up(client, W, 3000)
        assert np.array_equal(_retained(client)[1], X[-W:])
        more = blobs(250, D, 3, seed=8)
        _post_all(client, more, 250)
        _caught_up(client, W, 3250)
        assert np.array_equal(_retained(client)[1], np.concatenate([X, more])[-W:])


def test_a_window_entry_that_straddles_the_boundary_stays_in_the_log(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(retention="window", max_samples=250, worker_process=False)
    X = blobs(1000, D, 3, seed=9)
    with TestClient(create_app(settings)) as client:
        _post_all(client, X, 200)
        _caught_up(client, 250, 1000)
        assert np.array_equal(_retained(client)[1], X[-250:])
        # Entries of 200 rows: the last two hold the window (one only in part).
        assert logged_samples(redis_client, model_name).shape[0] == 400


# -- age -----------------------------------------------------------------------------------
@pytest.mark.parametrize("in_process", [False, True], ids=["thread", "child-process"])
def test_age_retires_by_redis_time_without_new_samples(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, in_process: bool
) -> None:
    # Each batch must be seen before it ages: AGE leaves a loaded machine's engine (a
    # child process sharing the cores with other tests) 3 s for it (1.5 s was too tight).
    AGE = 4.0
    settings = make_settings(
        retention="age", max_age_seconds=AGE, worker_process=in_process, dim=D
    )
    old, new = blobs(300, D, 3, seed=10), blobs(200, D, 3, seed=11)
    with TestClient(create_app(settings)) as client:
        worker = client.app.state.models.default.worker
        wait_until(lambda: worker.phase == "waiting-for-samples", 60, "the engine")
        posted = time.monotonic()
        _post_all(client, old, 300)
        _caught_up(client, 300, 300, timeout=AGE - 1)
        time.sleep(max(0.0, posted + AGE + 0.1 - time.monotonic()))
        _post_all(client, new, 200)
        doc = _caught_up(client, 200, 500, timeout=AGE - 1)
        rows = new if in_process else _retained(client)[1]
        assert np.array_equal(rows, new)
        _assert_centroids_are_cell_means(doc, rows)
        # With no new sample, time alone empties the model and the log.
        wait_until(lambda: client.get("/stats").json()["retained"] == 0, 10, "the age limit")
        wait_until(lambda: redis_client.xlen(ModelKeys(model_name).log) == 0, 5, "the trim")
        assert client.get("/stats").json()["n_ingested"] == 500


# -- reservoir -----------------------------------------------------------------------------
def test_reservoir_compacts_the_log_and_restarts_exactly(
    make_settings: SettingsFactory,
    redis_client: redis.Redis,
    model_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    M = 400
    monkeypatch.setattr(worker_retention, "MIN_COMPACTION", 0)  # compact at every M samples
    # batch_size >= 20 k: the first batch is not sized to k, so no swaps (the rule of
    # swap_wanted); a reservoir is all history.
    settings = make_settings(retention="reservoir", max_samples=M, worker_process=False,
                             batch_size=64)  # fmt: skip
    X = blobs(3000, D, 3, seed=12)
    keys = ModelKeys(model_name)
    with TestClient(create_app(settings)) as client:
        for start in range(0, 2900, 500):  # a compaction after each round (>= M samples)
            _post_all(client, X[start : min(start + 500, 2900)], 100)
            doc = _caught_up(client, M, min(start + 500, 2900))
        assert doc["retention"] == "reservoir"
        worker = client.app.state.models.default.worker
        assert worker.retention.compactions >= 5
        ids, rows = _retained(client)
        assert np.array_equal(rows, X[ids])  # ids are positions in the stream
        assert sorted(worker.retention.policy.slots.tolist()) == ids.tolist()
        assert not worker.engine._algo.swap  # a reservoir is all history: no swaps
        _assert_centroids_are_cell_means(doc, rows)
        generation = int(redis_client.hget(keys.meta, "base_generation"))
        assert generation >= 3
        # Redis: the base and the entries since (fewer than M samples, plus one entry).
        since = logged_samples(redis_client, model_name).shape[0]
        assert since < M + 100
        # Samples after the last compaction, then a restart.
        _post_all(client, X[2900:], 100)
        _caught_up(client, M, 3000)
        before = _retained(client)
    with TestClient(create_app(settings)) as client:
        _caught_up(client, M, 3000)
        after = _retained(client)
        assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])


def test_all_keeps_refusing_past_its_capacity_but_other_policies_never_do(
    make_settings: SettingsFactory,
) -> None:
    X = blobs(400, D, 3, seed=13)
    with TestClient(create_app(make_settings(max_samples=300))) as client:
        _post_all(client, X[:300], 300)
        assert post_npy(client, X[300:]).status_code == 507
    settings = make_settings(model="other-" + str(time.time_ns()), retention="window",
                             max_samples=300)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        _post_all(client, X, 100)
        _post_all(client, X, 100)
        _caught_up(client, 300, 800)


def test_the_trim_point_never_passes_a_retained_sample_and_the_groups_stay_few(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    """Entries of random sizes through a window of 5,120: every entry before the trim
    point holds only retired samples, the entry at it a retained one, and the worker
    remembers at most about 1,024 groups of entries, not one item per entry."""
    from nmbatch.engine.hosting import EngineConfig, LocalEngine
    from nmbatch.service.storage.retained import RetainedLog

    W = 5120
    settings = make_settings(retention="window", max_samples=W)
    retention = worker_retention.LogRetention(
        settings, W, RetainedLog(redis_client, ModelKeys(model_name))
    )
    engine = LocalEngine(EngineConfig(D, 3, "k-means++", 100.0, 32, 0))
    rng = np.random.default_rng(3)
    ends: list[tuple[str, int]] = []  # (entry id, stream id one past its last sample)
    total = 0
    for i in range(8000):
        n = int(rng.integers(1, 4))
        entry_id = f"{1000 + i // 7}-{i % 7}"
        retention.offer(engine, rng.normal(size=(n, D)).astype(np.float32), entry_id)
        total += n
        ends.append((entry_id, total))
        if i % 50 == 49:
            min_id = retention.trim_point()
            if min_id is not None:
                key = worker_retention.id_key(min_id)
                before = [end for eid, end in ends if worker_retention.id_key(eid) < key]
                assert before and max(before) <= total - W  # only retired samples
                # Kept though retired: less than two groups' worth (5 samples each).
                kept = [end for eid, end in ends if worker_retention.id_key(eid) >= key]
                assert sum(1 for end in kept if end <= total - W) < 2 * 5
    retention.trim_point()
    assert len(retention._groups) <= 1024 + 2
    assert engine.store.n_samples == W
    live = sum(1 for _, end in ends if end > total - W)  # entries holding retained samples
    assert len(retention._groups) < live / 2
