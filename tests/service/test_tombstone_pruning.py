"""Tombstones are pruned once no replay can read their rows (service/storage/deletions.py).

Real parts: the session's redis-server, the app with its lifespan, its worker and engine.
A ``window`` prunes the tombstones of the entries it trims and keeps those of the
entries it still holds; a ``reservoir`` prunes every tombstone its next base covers (the
base is written without the deleted rows). A restart after the pruning brings no
deleted row back, and an id deleted before, its tombstone pruned, is not found again
(no new tombstone).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis

from nmbatch.service.main import create_app
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.worker import retention as worker_retention
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_centroids_are_means,
    assert_problem,
    blobs,
    wait_until,
)

D, K = 4, 3


def converged(client: TestClient, n: int, ingested: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        response = client.get("/centroids")
        doc = response.json() if response.status_code == 200 else None
        if doc and doc["converged"] and doc["n_samples"] == n and doc["n_ingested"] == ingested:
            return doc
        return None

    return wait_until(ready, 60, f"converged on {n} of {ingested} samples")




def push(client: TestClient, X: np.ndarray, first: int | None) -> list[str]:
    """``X`` in requests of 50 rows (an entry each), ids ``r<first + i>`` (None: the
    service assigns them); the ids."""
    out: list[str] = []
    for start in range(0, X.shape[0], 50):
        body: dict[str, Any] = {"vectors": X[start : start + 50].tolist()}
        if first is not None:
            body["ids"] = [f"r{first + i}" for i in range(start, min(start + 50, X.shape[0]))]
        answer = client.post("/samples", json=body)
        assert answer.status_code == 202, answer.text
        out += answer.json()["ids"]
    return out


def test_a_window_prunes_the_tombstones_of_the_entries_it_trims(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    W = 200
    X = blobs(300, D, K, seed=51)
    settings = make_settings(k=K, dim=D, retention="window", max_samples=W, batch_size=64)
    keys = ModelKeys(model_name)
    old = np.arange(0, 100, 4)  # 25 rows of the entries the window will trim
    young = np.arange(101, 200, 10)  # 10 rows of entries it keeps
    gone = np.concatenate([old, young])
    with TestClient(create_app(settings)) as client:
        push(client, X[:200], 0)
        converged(client, 200, 200)
        answer = client.post("/samples/delete", json={"ids": [f"r{i}" for i in gone]})
        assert sorted(answer.json()["deleted"]) == sorted(f"r{i}" for i in gone)
        assert redis_client.hlen(keys.deleted) == gone.shape[0]
        push(client, X[200:], 200)  # rows 0-99 leave the window: their entries are trimmed
        kept = np.setdiff1d(np.arange(100, 300), young)
        assert_centroids_are_means(converged(client, kept.shape[0], 300), X[kept])
        wait_until(lambda: redis_client.hlen(keys.deleted) == young.shape[0] or None, 30,
                   "the trimmed entries' tombstones pruned")  # fmt: skip
        left = {f.decode().split(" ")[0] for f in redis_client.hkeys(keys.deleted)}
        assert left <= {e.decode() for e, _ in redis_client.xrange(keys.log)}
        worker = client.app.state.models.default.worker
        assert worker.tombstones.pruned == old.shape[0]
        assert worker.tombstones.tracked == young.shape[0]
    with TestClient(create_app(settings)) as client:  # the replay: none comes back
        assert_centroids_are_means(converged(client, kept.shape[0], 300), X[kept])
        for i in gone:
            assert_problem(client.get(f"/samples/r{i}"), 404, "unknown-sample")
        answer = client.post("/samples/delete", json={"ids": [f"r{i}" for i in gone[:3]]})
        assert answer.json()["deleted"] == []
        assert redis_client.hlen(keys.deleted) == young.shape[0]


def test_a_reservoir_prunes_the_tombstones_its_next_base_covers(
    make_settings: SettingsFactory,
    redis_client: redis.Redis,
    model_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    M = 200
    monkeypatch.setattr(worker_retention, "MIN_COMPACTION", 0)  # compact at every M samples
    settings = make_settings(k=K, dim=D, retention="reservoir", max_samples=M, batch_size=64,
                             worker_process=False)  # fmt: skip
    keys = ModelKeys(model_name)
    X = blobs(800, D, K, seed=52)
    with TestClient(create_app(settings)) as client:
        ids = push(client, X[:400], None)  # assigned ids: they name the entry and row
        worker = client.app.state.models.default.worker
        # Every row read (a worker converged on a first part still changes its reservoir
        # with the rest), a compaction done, converged: the store holds still.
        wait_until(lambda: (worker.retention is not None and worker.retention.compactions >= 1
                   and worker.phase == "converged"
                   and client.get("/centroids").json().get("n_ingested") == 400) or None,
                   60, "a compaction")  # fmt: skip
        engine = worker.engine
        stored = np.sort(engine._algo.store.ids())  # stream ids = rows of X
        doomed = stored[::4]
        answer = client.post("/samples/delete", json={"ids": [ids[i] for i in doomed]})
        assert sorted(answer.json()["deleted"]) == sorted(ids[i] for i in doomed)
        assert redis_client.hlen(keys.deleted) == doomed.shape[0]
        compactions = worker.retention.compactions
        ids += push(client, X[400:], None)  # a compaction after them: its base has no deleted row
        wait_until(lambda: worker.retention.compactions > compactions or None, 60,
                   "another compaction")  # fmt: skip
        wait_until(lambda: redis_client.hlen(keys.deleted) == 0 or None, 30, "pruned")
        assert worker.tombstones.pruned == doomed.shape[0]
        # Deleted before, pruned since: not found again, no tombstone written again.
        answer = client.post("/samples/delete", json={"ids": [ids[i] for i in doomed[:5]]})
        assert answer.json() == {"deleted": [], "not_found": [ids[i] for i in doomed[:5]]}
        assert redis_client.hlen(keys.deleted) == 0
        wait_until(lambda: worker.phase == "converged" or None, 60, "converged")
        now = np.sort(worker.engine._algo.store.ids())
        assert not np.isin(doomed, now).any()
    with TestClient(create_app(settings)) as client:  # the base, then the log after it
        worker = client.app.state.models.default.worker
        wait_until(lambda: (worker.engine is not None and worker.phase == "converged") or None,
                   60, "replayed")  # fmt: skip
        assert np.array_equal(np.sort(worker.engine._algo.store.ids()), now)
        for i in doomed[:10]:
            assert_problem(client.get(f"/samples/{ids[i]}"), 404, "unknown-sample")
        answer = client.post("/samples/delete", json={"ids": [ids[i] for i in doomed[:5]]})
        assert answer.json()["deleted"] == [] and redis_client.hlen(keys.deleted) == 0
