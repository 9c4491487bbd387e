"""One sample by its id: ``GET /samples/{id}``, ``DELETE /samples/{id}`` and
``POST /samples/delete``, on the default and a named model.

Real parts: the session's redis-server, the app with its lifespan, its worker and the
engine (in a child process, the default, or in the worker thread where the test reads
the engine). Tested: a sample's cluster is the brute-force nearest centroid of its row
under the served centroids, its distance the distance to it (similarity under cosine);
an unknown id is a 404 problem; a deletion is exact (once converged the served
centroids are the means of the remaining rows nearest them, the counts theirs), the
deleted ids answer 404, their client ids are free again, and a restart of the app, with
the tombstones consulted on the replay, brings none of them back; a reservoir's
deleted samples stay out through compactions and a restart (the slots they emptied
kept), and the samples of the reloaded base are found, and deleted, by id.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from nmbatch import Client
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.main import create_app
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.worker import retention as worker_retention
from nmbatch_client.errors import NotFoundError
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_centroids_are_means,
    assert_problem,
    blobs,
    wait_until,
)

D, K = 4, 3
NAMED = "named-deletion"


def converged(client: TestClient, prefix: str, n: int, timeout: float = 60) -> dict[str, Any]:
    """The centroids document once converged on ``n`` samples."""

    def ready() -> dict[str, Any] | None:
        response = client.get(f"{prefix}/centroids")
        doc = response.json() if response.status_code == 200 else None
        return doc if doc and doc["converged"] and doc["n_samples"] == n else None

    return wait_until(ready, timeout, f"{prefix or 'default'} converged on {n} samples")


def nearest(doc: dict[str, Any], row: np.ndarray) -> tuple[int, float]:
    C = np.asarray(doc["centroids"], dtype=np.float64)
    d2 = ((C - row.astype(np.float32).astype(np.float64)) ** 2).sum(1)
    return int(d2.argmin()), float(np.sqrt(d2.min()))


@pytest.mark.parametrize("prefix", ["", f"/models/{NAMED}"])
def test_a_sample_is_on_its_nearest_centroid_and_unknown_ids_are_404(
    make_settings: SettingsFactory, prefix: str
) -> None:
    X = blobs(150, D, K, seed=21)
    with TestClient(create_app(make_settings(k=K, dim=D, batch_size=64))) as client:
        if prefix:
            assert client.put(f"/models/{NAMED}", json={"k": K, "dim": D}).status_code == 201
        named = client.post(f"{prefix}/samples", json={"vectors": X[:100].tolist(),
                                                      "ids": list(range(100))})  # fmt: skip
        assigned = client.post(f"{prefix}/samples", json={"vectors": X[100:].tolist()})
        assert named.status_code == assigned.status_code == 202
        ids = named.json()["ids"] + assigned.json()["ids"]
        doc = converged(client, prefix, 150)
        for i in range(0, 150, 7):
            answer = client.get(f"{prefix}/samples/{ids[i]}")
            assert answer.status_code == 200, answer.text
            body = answer.json()
            cluster, distance = nearest(doc, X[i])
            assert body["cluster"] == cluster and body["retained"] is True
            assert body["id"] == ids[i] and "similarity" not in body
            assert body["distance"] == pytest.approx(distance, rel=1e-5, abs=1e-6)
        for unknown in ("nope", "100", "1-0-0", str(2**63), "a%20b"):
            assert_problem(client.get(f"{prefix}/samples/{unknown}"), 404, "unknown-sample")


def test_cosine_samples_answer_their_similarity(make_settings: SettingsFactory) -> None:
    X = blobs(90, D, K, seed=22) + 5.0
    settings = make_settings(k=K, dim=D, metric="cosine")
    with TestClient(create_app(settings)) as client:
        answer = client.post("/samples", json={"vectors": X.tolist(), "ids": ["c" + str(i)
                                                                           for i in range(90)]})
        assert answer.status_code == 202
        doc = converged(client, "", 90)
        unit = X / np.linalg.norm(X, axis=1, keepdims=True)
        body = client.get("/samples/c5").json()
        cluster, distance = nearest(doc, unit[5])
        assert body["cluster"] == cluster
        assert body["similarity"] == pytest.approx(1 - distance**2 / 2, abs=1e-5)


def test_deletion_is_exact_and_survives_a_restart(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(300, D, K, seed=23)
    settings = make_settings(k=K, dim=D, batch_size=64, seed=3)
    keys = ModelKeys(model_name)
    with TestClient(create_app(settings)) as client:
        named = client.post("/samples", json={"vectors": X[:200].tolist(),
                                              "ids": [f"s{i}" for i in range(200)]})  # fmt: skip
        assigned = client.post("/samples", json={"vectors": X[200:].tolist()})
        ids = named.json()["ids"] + assigned.json()["ids"]
        converged(client, "", 300)
        gone = np.random.default_rng(24).choice(300, size=60, replace=False)
        body = {"ids": [ids[i] for i in gone] + ["never-stored"]}
        answer = client.post("/samples/delete", json=body)
        assert answer.status_code == 200, answer.text
        assert sorted(answer.json()["deleted"]) == sorted(ids[i] for i in gone)
        assert answer.json()["not_found"] == ["never-stored"]
        # One more by DELETE; a second DELETE of it, and of any deleted id, is a 404.
        last = next(i for i in range(300) if i not in set(gone.tolist()))
        assert client.delete(f"/samples/{ids[last]}").status_code == 204
        assert_problem(client.delete(f"/samples/{ids[last]}"), 404, "unknown-sample")
        gone = np.append(gone, last)
        for i in gone[:10]:
            assert_problem(client.get(f"/samples/{ids[i]}"), 404, "unknown-sample")
        kept = np.setdiff1d(np.arange(300), gone)
        doc = converged(client, "", kept.shape[0])
        assert_centroids_are_means(doc, X[kept])
        assert redis_client.hlen(keys.deleted) == gone.shape[0]
        assert redis_client.hlen(keys.sample_ids) == 200 - int((gone < 200).sum())
        # A deleted client id is free again: a new sample may take it.
        freed = next(ids[i] for i in gone if i < 200)
        again = client.post("/samples", json={"vectors": X[:1].tolist(), "ids": [freed]})
        assert again.status_code == 202, again.text
        kept_rows = np.concatenate([X[kept], X[:1]])
        assert_centroids_are_means(converged(client, "", kept_rows.shape[0]), kept_rows)
    with TestClient(create_app(settings)) as client:  # the replay consults the tombstones
        doc = converged(client, "", kept_rows.shape[0])
        assert_centroids_are_means(doc, kept_rows)
        for i in gone[:10]:
            if ids[i] != freed:
                assert_problem(client.get(f"/samples/{ids[i]}"), 404, "unknown-sample")
        assert client.get(f"/samples/{freed}").status_code == 200


def test_bad_delete_requests_are_refused_and_delete_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(30, D, K, seed=25)
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        assert client.post("/samples", json={"vectors": X.tolist(),
                                             "ids": list(range(30))}).status_code == 202
        converged(client, "", 30)
        for body in ({"ids": []}, {"ids": ["1", 1]}, {"ids": ["a b"]}, {"ids": "1"},
                     {"ids": ["1"] + ["x"] * 10_000}, {"other": [1]}):  # fmt: skip
            answer = client.post("/samples/delete", json=body)
            assert answer.status_code in (413, 422), (body, answer.text)
        assert redis_client.exists(ModelKeys(model_name).deleted) == 0
        assert converged(client, "", 30)["n_samples"] == 30


def test_a_reservoir_keeps_deleted_samples_out_through_compactions_and_a_restart(
    make_settings: SettingsFactory,
    redis_client: redis.Redis,
    model_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    M = 200
    monkeypatch.setattr(worker_retention, "MIN_COMPACTION", 0)  # compact at every M samples
    settings = make_settings(k=K, dim=D, retention="reservoir", max_samples=M, batch_size=64,
                             worker_process=False)  # fmt: skip
    X = blobs(900, D, K, seed=26)
    with TestClient(create_app(settings)) as client:
        ids: list[str] = []
        for start in range(0, 600, 150):
            answer = client.post("/samples", json={"vectors": X[start : start + 150].tolist()})
            ids += answer.json()["ids"]
        settled(client, 600)
        worker = client.app.state.models.default.worker
        assert worker.retention.compactions >= 1
        stored = np.sort(engine_of(client)._algo.store.ids())  # stream ids = positions in X
        doomed = stored[::4]
        answer = client.post("/samples/delete", json={"ids": [ids[i] for i in doomed]})
        assert sorted(answer.json()["deleted"]) == sorted(ids[i] for i in doomed)
        left = np.setdiff1d(stored, doomed)
        assert_centroids_are_means(converged(client, "", left.shape[0]), X[left])
        for start in range(600, 900, 150):  # more samples: compactions with holes
            answer = client.post("/samples", json={"vectors": X[start : start + 150].tolist()})
            assert answer.status_code == 202
        compactions = worker.retention.compactions
        settled(client, 900)
        assert worker.retention.compactions > compactions
        now = np.sort(engine_of(client)._algo.store.ids())
        assert not np.isin(doomed, now).any()
    with TestClient(create_app(settings)) as client:  # the base, then the log after it
        settled(client, 900)
        restored = np.sort(engine_of(client)._algo.store.ids())
        assert np.array_equal(restored, now)
        for i in doomed[:5]:
            assert_problem(client.get(f"/samples/{ids[i]}"), 404, "unknown-sample")
        # The base's samples are found by id after the restart, and deleted exactly.
        in_base = [i for i in now.tolist() if i < 600][:20]
        assert in_base
        for i in in_base[:5]:
            assert client.get(f"/samples/{ids[i]}").status_code == 200
        answer = client.post("/samples/delete", json={"ids": [ids[i] for i in in_base]})
        assert sorted(answer.json()["deleted"]) == sorted(ids[i] for i in in_base)
        left = np.setdiff1d(now, in_base)
        assert np.array_equal(np.sort(engine_of(client)._algo.store.ids()), left)


def engine_of(client: TestClient) -> Any:
    worker = client.app.state.models.default.worker
    wait_until(lambda: worker.engine is not None and worker.phase == "converged", 30, "engine")
    return worker.engine


def settled(client: TestClient, ingested: int) -> None:
    """Wait until the worker converged on every sample ingested (``ingested``)."""

    def ready() -> bool | None:
        response = client.get("/centroids")
        doc = response.json() if response.status_code == 200 else None
        return bool(doc and doc["converged"] and doc["n_ingested"] == ingested) or None

    wait_until(ready, 60, f"converged with {ingested} ingested")
    engine_of(client)


def test_the_python_client_looks_up_and_deletes_samples(
    tmp_path: Path, redis_server: EmbeddedRedis, redis_client: redis.Redis
) -> None:
    """``Client.sample`` and ``Client.delete_samples`` against a service process: the
    answers of the routes, a deleted id a :class:`NotFoundError`."""
    X = blobs(60, D, K, seed=27)
    model = f"client-ids-{uuid.uuid4().hex[:8]}"
    proc = ServiceProcess(tmp_path, model, redis_url=redis_server.url, model=model, k=K,
                          batch_size=64, worker_threads=1, poll_seconds=0.05).start()  # fmt: skip
    try:
        proc.ready(60)
        with Client(proc.base) as client:
            client.push(X[:30])  # assigned ids
            answer = httpx.post(f"{proc.base}/samples",
                                json={"vectors": X[30:].tolist(), "ids": list(range(30))})
            assert answer.status_code == 202
            C = client.wait_for(converged=True, min_samples=60).centroids
            found = client.sample(5)
            deleted = client.delete_samples([5, "6", "missing"])
            with pytest.raises(NotFoundError):
                client.sample("5")
        d2 = ((np.asarray(C, dtype=np.float64) - X[35].astype(np.float32)) ** 2).sum(1)
        assert found["cluster"] == int(d2.argmin())
        assert deleted == {"deleted": ["5", "6"], "not_found": ["missing"]}
        assert redis_client.hlen(ModelKeys(model).deleted) == 2
    finally:
        proc.close()


def test_a_process_that_is_not_the_worker_answers_503_and_deletes_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    """Two apps on one model: the second stands by (the first holds the lease), so its
    sample requests are ``503 samples-unavailable`` with ``Retry-After``, and nothing is
    tombstoned; the worker's own answers are unchanged."""
    X = blobs(60, D, K, seed=28)
    settings = make_settings(k=K, dim=D)
    with TestClient(create_app(settings)) as first:
        first.post("/samples", json={"vectors": X.tolist(), "ids": list(range(60))})
        converged(first, "", 60)
        with TestClient(create_app(settings)) as second:
            assert second.app.state.models.default.worker.role == "standby"
            for answer in (second.get("/samples/3"), second.delete("/samples/3"),
                           second.post("/samples/delete", json={"ids": [3]})):  # fmt: skip
                problem = assert_problem(answer, 503, "samples-unavailable")
                assert answer.headers["Retry-After"] == "1" and problem["model"] == model_name
            assert redis_client.exists(ModelKeys(model_name).deleted) == 0
        assert first.get("/samples/3").status_code == 200
