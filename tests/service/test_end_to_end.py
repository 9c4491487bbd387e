"""The whole service on a real Redis: blobs found, concurrent ingestion exact, restarts."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis
from service_helpers import post_npy, wait_converged

from nmbatch.engine import nearest
from nmbatch.service.main import create_app
from nmbatch.service.storage import ModelRepository
from tests.testkit import SettingsFactory, TestClient, blobs_around, logged_samples, wait_until

MEANS = np.array([[0.0, 0.0, 0.0, 0.0], [20.0, 0.0, 5.0, 0.0], [0.0, 20.0, 0.0, -5.0]])


def test_three_blobs_are_found_from_json_and_npy_requests(
    make_settings: SettingsFactory,
) -> None:
    rng = np.random.default_rng(7)
    X, blob = blobs_around(rng, MEANS, per_blob=400)
    with TestClient(create_app(make_settings(batch_size=64))) as client:
        for i, part in enumerate(np.array_split(np.arange(len(X)), 6)):
            if i % 2:
                response = post_npy(client, X[part])
            else:
                response = client.post("/samples", json={"vectors": X[part].tolist()})
            assert response.status_code == 202
        assert response.json()["n_samples"] == len(X)
        doc = wait_converged(client, len(X))

        centroids = np.array(doc["centroids"])
        # With the blobs this far apart, each centroid is exactly its blob's sample mean.
        owner = [int(np.argmin(((MEANS - c) ** 2).sum(axis=1))) for c in centroids]
        assert sorted(owner) == [0, 1, 2]
        for c, b in zip(centroids, owner, strict=True):
            np.testing.assert_allclose(c, X[blob == b].astype(np.float64).mean(axis=0), atol=1e-4)
            np.testing.assert_allclose(c, MEANS[b], atol=0.2)
        assert sorted(doc["counts"]) == [400, 400, 400]

        for b in range(3):
            answer = post_npy(client, X[blob == b], "/assign").json()
            assert answer["version"] == doc["version"]
            assert set(answer["clusters"]) == {owner.index(b)}


def test_concurrent_ingestion_is_exact_and_centroids_are_means(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    rng = np.random.default_rng(11)
    X, _ = blobs_around(rng, MEANS, per_blob=700)
    threads_n, requests_n = 4, 15
    parts = np.array_split(X, threads_n * requests_n)
    errors: list[str] = []
    # Four writers while a reader polls: shedding (503 overloaded, nothing stored; its
    # own tests are in test_admission) is off, so that every write reaches the log.
    settings = make_settings(batch_size=16, write_shed_lag_ms=0)
    with TestClient(create_app(settings)) as client:
        worker_started = threading.Event()

        def send(thread: int) -> None:
            for r in range(requests_n):
                if r == requests_n // 2:  # the rest arrives while the worker iterates
                    worker_started.wait(30)
                part = parts[thread * requests_n + r]
                if r % 2:
                    response = post_npy(client, part)
                else:
                    response = client.post("/samples", json={"vectors": part.tolist()})
                if response.status_code != 202:
                    errors.append(response.text)

        senders = [threading.Thread(target=send, args=(t,)) for t in range(threads_n)]
        for t in senders:
            t.start()
        wait_until(lambda: client.get("/stats").json()["iteration"] > 0, what="a first iteration")
        assert client.get("/stats").json()["N"] < len(X)
        worker_started.set()
        for t in senders:
            t.join()
        assert errors == []
        doc = wait_converged(client, len(X))
        stats = client.get("/stats").json()

    assert (stats["N"], stats["b"], stats["n_logged"]) == (len(X), len(X), len(X))
    logged = logged_samples(redis_client, model_name)
    assert logged.shape == X.shape
    # Same multiset of rows: every accepted sample is logged exactly once.
    np.testing.assert_array_equal(np.unique(logged, axis=0), np.unique(X, axis=0))

    # Converged with b = N: each sample sits with its nearest centroid, and each centroid
    # is the mean of its samples (one sample, one vote), with v(j) their number.
    centroids = np.array(doc["centroids"], dtype=np.float32)
    labels, _ = nearest(logged, centroids)
    counts = np.bincount(labels, minlength=3)
    assert counts.tolist() == doc["counts"]
    for j in range(3):
        np.testing.assert_allclose(
            centroids[j], logged[labels == j].astype(np.float64).mean(axis=0), rtol=0, atol=1e-4
        )


def test_restart_keeps_samples_and_version_and_answers_at_once(
    make_settings: SettingsFactory,
) -> None:
    rng = np.random.default_rng(3)
    X, _ = blobs_around(rng, MEANS, per_blob=200)
    settings = make_settings(batch_size=32, snapshot_seconds=60.0)
    with TestClient(create_app(settings)) as client:
        post_npy(client, X[:300])
        client.post("/samples", json={"vectors": X[300:].tolist()})
        before = wait_converged(client, len(X))
    # A snapshot was due only in 60 s: the one written on shutdown is what restores.

    with TestClient(create_app(settings)) as client:
        first = client.get("/centroids")
        assigned = client.get("/assign", params={"vector": ",".join(map(str, MEANS[1]))})
        assert first.status_code == 200 and assigned.status_code == 200
        restored = first.json()
        assert restored["version"] >= before["version"]
        assert restored["n_samples"] == len(X)
        assert assigned.json()["version"] >= before["version"]
        # The worker replays the log, restores (one exact pass), iterates: a newer version.
        wait_until(
            lambda: client.get("/stats").json()["phase"] == "converged", what="the restored worker"
        )
        after = wait_converged(client, len(X))
        assert after["version"] > before["version"]
        assert client.get("/stats").json()["n_logged"] == len(X)
        np.testing.assert_allclose(
            np.sort(np.array(after["centroids"]), axis=0),
            np.sort(np.array(before["centroids"]), axis=0),
            atol=1e-4,
        )
        client.post("/samples", json={"vectors": [MEANS[2].tolist()]})
        grown = wait_converged(client, len(X) + 1)
        assert grown["version"] > after["version"]


def test_snapshot_centroids_are_served_while_the_log_replays(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    with TestClient(create_app(settings)) as client:
        client.post("/samples", json={"vectors": MEANS.tolist() * 5})
        before = wait_converged(client, 15)

    # Hold the replay of the (real) log until the test lets it go.
    replay_may_go = threading.Event()
    read_log = ModelRepository.read_log

    def held_read_log(self: ModelRepository, after_id: str, max_entries: int = 256) -> list:
        replay_may_go.wait(30)
        return read_log(self, after_id, max_entries)

    monkeypatch.setattr(ModelRepository, "read_log", held_read_log)
    with TestClient(create_app(settings)) as client:
        wait_until(lambda: client.get("/stats").json()["phase"] == "replaying", what="replay")
        assert client.get("/centroids").json() == before
        assigned = client.get("/assign", params={"vector": ",".join(map(str, MEANS[2]))}).json()
        assert assigned["version"] == before["version"] and assigned["distance"] == 0.0
        replay_may_go.set()
        wait_until(lambda: client.get("/stats").json()["phase"] == "converged", what="restore")
        assert client.get("/centroids").json()["version"] > before["version"]
