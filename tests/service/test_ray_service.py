"""The service with its worker's engine on a Ray cluster (``NMBATCH_RAY_ADDRESS``).

One local Ray cluster for the module (``ray.cluster_utils.Cluster``: a head node and a
worker node on 127.0.0.1, no dashboard, a small object store), the session's real
redis-server, and the real app (``TestClient(create_app(settings))``): its worker joins
the cluster by address (``ray.init`` in the worker thread of this process), runs the
coordinator and puts its shard actors on the nodes. Tested: ingest -> /centroids (the
blob means) -> /assign; a restart rebuilds from the Redis log; a shard actor killed
mid-run is replaced and nothing logged is lost; a node removed mid-stream (the same,
with the API answering throughout); retention ``window`` on the cluster
(the default model and a named one) serves the last samples only; a ``reservoir`` is
read by the shards from Redis, from its base after a compaction, also by a replacement
and after a restart; sample weights vote their weight; samples by id are looked up and
deleted exactly, and stay deleted after a shard process is killed; a cosine model
(``metric=cosine``, spherical k-means) runs on the cluster: unit rows on the shards, a
zero vector refused, unit centroids at the spherical fixed point, ``/assign`` answering
the similarity.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
from service_helpers import post_npy, wait_converged

from nmbatch.engine.metric import unit_rows
from nmbatch.engine.rows import SourceRows
from nmbatch.service.main import create_app
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.worker import retention as worker_retention
from tests.testkit import (
    SettingsFactory,
    TestClient,
    blobs_around,
    two_node_ray_cluster,
    wait_until,
)

ray = pytest.importorskip("ray")

MEANS = np.array([[0.0, 0.0, 0.0, 0.0], [20.0, 0.0, 5.0, 0.0], [0.0, 20.0, 0.0, -5.0]])
STORE = 80 * 2**20


@pytest.fixture(scope="module")
def ray_cluster():
    """A two-node local Ray cluster, shut down after the module (another module's
    connection is closed first: the engine must join this one)."""
    with two_node_ray_cluster(STORE) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def ray_address(ray_cluster) -> str:
    return ray_cluster.address


def shard_names() -> list[str]:
    """Names of the live shard actors (this process is the engine's Ray driver)."""
    return sorted(a for a in ray.util.list_named_actors() if a.startswith("nmbatch-shard-"))


def engine_on_ray(client: TestClient) -> bool:
    """The worker has joined Ray and its engine has converged on the log."""
    return ray.is_initialized() and client.get("/stats").json()["phase"] == "converged"


def three_shards() -> list[str] | None:
    """The live shard actors' names, once there are three."""
    names = shard_names()
    return names if len(names) == 3 else None


def assert_each_sample_in_one_shard_voted(names: list[str], n: int) -> None:
    """Every logged sample (ids ``0 .. n-1``) is in exactly one of the shards ``names``,
    and voted (the prefix is all of them)."""
    parts = ray.get([ray.get_actor(name).assignments.remote() for name in names])
    ids = np.concatenate([p[0] for p in parts])
    np.testing.assert_array_equal(np.sort(ids), np.arange(n))
    assert all((p[2] >= 0).all() for p in parts)


def check_blobs(client: TestClient, X: np.ndarray, blob: np.ndarray) -> dict:
    """The model converged on every sample, each centroid its blob's mean; /assign right."""
    doc = wait_converged(client, len(X), timeout=40.0)
    centroids = np.array(doc["centroids"])
    owner = [int(np.argmin(((MEANS - c) ** 2).sum(axis=1))) for c in centroids]
    assert sorted(owner) == [0, 1, 2]
    for c, b in zip(centroids, owner, strict=True):
        np.testing.assert_allclose(c, X[blob == b].astype(np.float64).mean(axis=0), atol=1e-4)
        np.testing.assert_allclose(c, MEANS[b], atol=0.2)
    assert sorted(doc["counts"]) == [np.sum(blob == b) for b in range(3)]
    for b in range(3):
        answer = post_npy(client, X[blob == b], "/assign").json()
        assert set(answer["clusters"]) == {owner.index(b)}
    return doc


def test_blobs_found_on_the_cluster_and_rebuilt_after_a_restart(
    make_settings: SettingsFactory, ray_address: str
) -> None:
    rng = np.random.default_rng(7)
    X, blob = blobs_around(rng, MEANS, per_blob=400)
    settings = make_settings(batch_size=64, ray_address=ray_address, ray_shards=2)
    with TestClient(create_app(settings)) as client:
        for part in np.array_split(np.arange(len(X)), 6):
            assert post_npy(client, X[part]).status_code == 202
        doc = check_blobs(client, X, blob)
        stats = client.get("/stats").json()
        assert stats["n_samples"] == len(X)
        # The worker's engine is the coordinator; its shards are actors on the cluster.
        assert len(shard_names()) == 2
    # A restart: the new worker replays the Redis log into new shards, restores.
    with TestClient(create_app(settings)) as client:
        wait_until(
            lambda: client.get("/stats").json()["phase"] == "converged", 40.0, "the rebuilt worker"
        )
        again = check_blobs(client, X, blob)
        assert again["version"] > doc["version"]
        np.testing.assert_allclose(again["centroids"], doc["centroids"], atol=1e-4)


def test_a_killed_shard_is_replaced_and_nothing_is_lost(
    make_settings: SettingsFactory, ray_address: str
) -> None:
    rng = np.random.default_rng(3)
    X, blob = blobs_around(rng, MEANS, per_blob=300)
    settings = make_settings(batch_size=48, ray_address=ray_address, ray_shards=3)
    with TestClient(create_app(settings)) as client:
        half = len(X) // 2
        for part in np.array_split(np.arange(half), 3):
            assert post_npy(client, X[part]).status_code == 202
        wait_converged(client, half, timeout=40.0)
        names = shard_names()
        assert len(names) == 3
        ray.kill(ray.get_actor(sorted(names)[0]))
        for part in np.array_split(np.arange(half, len(X)), 3):
            assert post_npy(client, X[part]).status_code == 202
        check_blobs(client, X, blob)
        now = shard_names()
        assert len(now) == 3 and sorted(names)[0] not in now  # replaced, a new generation
        assert_each_sample_in_one_shard_voted(now, len(X))


def test_a_node_lost_mid_stream_loses_nothing_and_the_service_keeps_answering(
    make_settings: SettingsFactory, ray_cluster
) -> None:
    """A third node joins; a node other than the head that holds one shard is removed
    (its raylet and workers stopped, as when a machine goes away) while samples keep
    arriving: the coordinator takes back that shard's votes and a new shard on a
    surviving node rebuilds its rows, unvoted; ``/centroids`` and ``/assign`` answer 200
    throughout, and every logged sample ends in exactly one shard, voted, in a model of
    all of them."""
    rng = np.random.default_rng(5)
    X, blob = blobs_around(rng, MEANS, per_blob=300)
    half = len(X) // 2
    extra = ray_cluster.add_node(num_cpus=1, object_store_memory=STORE)
    ray_cluster.wait_for_nodes()
    settings = make_settings(batch_size=48, ray_address=ray_cluster.address, ray_shards=3)
    # Shards go round robin over the nodes with a soft affinity: Ray may place one
    # elsewhere while a new node's resources are not yet known to the scheduler (on a
    # busy machine, for seconds). The test needs a node besides the head that holds one
    # shard; else a restart (new shards, the log replayed), a moment later, a few times.
    for attempt in range(6):
        time.sleep(attempt)
        client = TestClient(create_app(settings)).__enter__()
        if attempt == 0:
            for part in np.array_split(np.arange(half), 3):
                assert post_npy(client, X[part]).status_code == 202
        wait_converged(client, half, timeout=40.0)
        # Ray joined by the worker (a restart serves the snapshot before) and the log
        # replayed into its shards: only then may this thread ask Ray.
        wait_until(functools.partial(engine_on_ray, client), 40.0, "the worker's shards")
        names = shard_names()
        nodes = {n: ray.get(ray.get_actor(n).node_id.remote()) for n in names}
        held = list(nodes.values())
        removable = (extra, *ray_cluster.worker_nodes)  # the extra node first
        victim = next((w for w in removable if held.count(w.node_id) == 1), None)
        lost = sorted(n for n, node in nodes.items() if victim and node == victim.node_id)
        if len(names) == 3 and len(lost) == 1:
            break
        client.__exit__(None, None, None)
    assert len(names) == 3 and len(lost) == 1, nodes  # one shard per node
    try:
        statuses: list[int] = []
        stop = threading.Event()

        def keep_asking() -> None:
            while not stop.is_set():
                statuses.append(client.get("/centroids").status_code)
                statuses.append(post_npy(client, X[:5], "/assign").status_code)
                time.sleep(0.02)

        asker = threading.Thread(target=keep_asking)
        asker.start()
        try:
            ray_cluster.remove_node(victim)
            for part in np.array_split(np.arange(half, len(X)), 3):
                assert post_npy(client, X[part]).status_code == 202
            check_blobs(client, X, blob)
        finally:
            stop.set()
            asker.join()
        assert len(statuses) > 10 and set(statuses) == {200}
        # Replaced, a new generation (listed once Ray has placed it).
        now = wait_until(three_shards, 30.0, "a shard for each lost one")
        assert lost[0] not in now
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        assert all(ray.get(ray.get_actor(n).node_id.remote()) in alive for n in now)
        assert_each_sample_in_one_shard_voted(now, len(X))
    finally:
        client.__exit__(None, None, None)


def test_a_sliding_window_on_the_cluster_serves_the_recent_samples(
    make_settings: SettingsFactory, ray_address: str
) -> None:
    """Retention ``window`` on the cluster: the shards retire the rows that leave the
    window (votes taken back), so the model is the blobs of the last samples only, and
    a restart rebuilds the same window from the trimmed log."""
    rng = np.random.default_rng(11)
    old, _ = blobs_around(rng, MEANS + 60.0, per_blob=200)  # to be forgotten
    X, blob = blobs_around(rng, MEANS, per_blob=300)
    settings = make_settings(batch_size=48, ray_address=ray_address, ray_shards=2,
                             retention="window", max_samples=len(X))  # fmt: skip
    with TestClient(create_app(settings)) as client:
        for part in np.array_split(np.arange(len(old)), 3):
            assert post_npy(client, old[part]).status_code == 202
        wait_converged(client, len(old), timeout=40.0)
        for part in np.array_split(np.arange(len(X)), 4):
            assert post_npy(client, X[part]).status_code == 202
        doc = check_blobs(client, X, blob)  # counts: exactly the window's rows
        assert client.get("/stats").json()["n_samples"] == len(X)
    with TestClient(create_app(settings)) as client:
        wait_until(
            lambda: client.get("/stats").json()["phase"] == "converged", 40.0, "the rebuilt worker"
        )
        again = check_blobs(client, X, blob)
        np.testing.assert_allclose(again["centroids"], doc["centroids"], atol=1e-4)


def test_a_named_model_with_a_window_runs_on_the_cluster(
    ray_address: str, make_settings: SettingsFactory
) -> None:
    rng = np.random.default_rng(12)
    X, _ = blobs_around(rng, MEANS, per_blob=100)
    spec = {"k": 3, "dim": 4, "retention": "window", "max_samples": 200, "batch_size": 30}
    with TestClient(create_app(make_settings(ray_address=ray_address))) as client:
        assert client.put("/models/windowed", json=spec).status_code == 201
        for part in np.array_split(np.arange(len(X)), 3):
            assert post_npy(client, X[part], "/models/windowed/samples").status_code == 202

        def converged() -> dict | None:
            doc = client.get("/models/windowed/centroids")
            body = doc.json() if doc.status_code == 200 else {}
            return body if body.get("converged") and body["n_samples"] == 200 else None

        doc = wait_until(converged, 40.0, "the named model's window")
        assert sum(doc["counts"]) == 200
        last = X[-200:].astype(np.float64)
        mine = np.array(post_npy(client, last, "/models/windowed/assign").json()["clusters"])
        for j, c in enumerate(np.array(doc["centroids"])):
            np.testing.assert_allclose(c, last[mine == j].mean(axis=0), atol=1e-4)


def test_a_reservoir_on_the_cluster_is_read_by_the_shards_from_redis(
    make_settings: SettingsFactory, ray_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention ``reservoir`` on the cluster, the rows fed by reference: the worker
    hands the engine the log entries' heads, the shards read the rows from Redis. After
    a compaction the coordinator's records name the new base's entries (the log entries
    the rows came from are trimmed), and a shard killed then is rebuilt by reading them
    there: the shards hold exactly the reservoir, each row the one posted under its id,
    and the centroids are its cells' means."""
    M = 300
    monkeypatch.setattr(worker_retention, "MIN_COMPACTION", 0)  # compact at every M samples
    rng = np.random.default_rng(21)
    X, _ = blobs_around(rng, MEANS, per_blob=300)
    settings = make_settings(batch_size=48, ray_address=ray_address, ray_shards=2,
                             retention="reservoir", max_samples=M)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        worker = client.app.state.models.default.worker
        posted = 0

        def caught_up() -> dict | None:
            assert worker.error is None, f"the worker failed: {worker.error!r}"
            doc = client.get("/centroids").json() if engine_on_ray(client) else {}
            done = doc.get("n_ingested") == posted and doc.get("n_samples") == min(posted, M)
            return doc if done and doc["converged"] else None

        parts = np.array_split(np.arange(len(X)), 6)
        for part in parts[:4]:
            assert post_npy(client, X[part]).status_code == 202
            posted += len(part)
            wait_until(caught_up, 40.0, f"the reservoir of {posted} samples")
        assert worker.retention.compactions >= 2
        coord = worker.engine.coordinator
        base = worker.retained_log.read_base()
        named = [rows for chunks in coord.chunks for rows, *_ in chunks]
        assert all(isinstance(rows, SourceRows) for rows in named)
        assert {rows.ref[0] for rows in named} <= {ModelKeys(settings.model).base(base.generation),
                                                   ModelKeys(settings.model).log}  # fmt: skip
        doomed = coord.shards[0]
        ray.kill(doomed)
        for part in parts[4:]:
            assert post_npy(client, X[part]).status_code == 202
            posted += len(part)
            doc = wait_until(caught_up, 40.0, f"the reservoir of {posted} samples")
        assert coord.n_lost >= 1
        slots = np.sort(worker.retention.policy.slots[:M])
        parts_held = ray.get([shard.assignments.remote() for shard in coord.shards])
        np.testing.assert_array_equal(np.sort(np.concatenate([p[0] for p in parts_held])), slots)
        np.testing.assert_array_equal(worker.engine.rows_of(slots), X[slots])
        C, rows = np.array(doc["centroids"]), X[slots].astype(np.float64)
        nearest = np.argmin(((rows[:, None, :] - C[None]) ** 2).sum(axis=2), axis=1)
        for j in range(C.shape[0]):
            np.testing.assert_allclose(C[j], rows[nearest == j].mean(axis=0), atol=1e-4)
    # A restart: the new worker names the base's entries and the log's after it to new
    # shards, which read them from Redis: the same reservoir.
    with TestClient(create_app(settings)) as client:
        worker = client.app.state.models.default.worker
        wait_until(caught_up, 40.0, "the rebuilt reservoir")
        coord = worker.engine.coordinator
        parts_held = ray.get([shard.assignments.remote() for shard in coord.shards])
        np.testing.assert_array_equal(np.sort(np.concatenate([p[0] for p in parts_held])), slots)
        np.testing.assert_array_equal(worker.engine.rows_of(slots), X[slots])


def nearest_means(C: np.ndarray, X: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(weighted means (k, d), weight sums (k,))`` of the rows of ``X`` nearest each
    centroid of ``C`` (float64)."""
    X64 = X.astype(np.float64)
    near = np.argmin(((X64[:, None, :] - C[None]) ** 2).sum(axis=2), axis=1)
    sums = np.array([w[near == j].sum() for j in range(C.shape[0])])
    means = np.array([(w[near == j, None] * X64[near == j]).sum(axis=0) for j in
                      range(C.shape[0])]) / sums[:, None]  # fmt: skip
    return means, sums


def test_weighted_samples_on_the_cluster_vote_their_weight(
    ray_address: str, make_settings: SettingsFactory
) -> None:
    """Weights (JSON and ``.npz``) go to the shards with the rows, read by reference from
    the log: at the fixed point each centroid is the weighted mean of the rows nearest
    it and ``counts`` are the sums of their weights (a weight-0 row counts nowhere)."""
    import io

    rng = np.random.default_rng(13)
    X, _ = blobs_around(rng, MEANS, per_blob=60)
    w = rng.uniform(0.1, 4.0, len(X))
    w[::11] = 0.0
    half = len(X) // 2
    out = io.BytesIO()
    np.savez(out, X=X[half:], weights=w[half:])
    settings = make_settings(batch_size=48, ray_address=ray_address, ray_shards=2)
    with TestClient(create_app(settings)) as client:
        answer = client.post("/samples", json={"vectors": X[:half].tolist(),
                                               "weights": w[:half].tolist()})  # fmt: skip
        assert answer.status_code == 202
        answer = client.post("/samples", content=out.getvalue(),
                             headers={"content-type": "application/x-npz"})  # fmt: skip
        assert answer.status_code == 202
        doc = wait_converged(client, len(X), timeout=60.0)
        C = np.array(doc["centroids"], dtype=np.float64)
        means, sums = nearest_means(C, X, w)
        np.testing.assert_allclose(C, means, atol=1e-4)
        np.testing.assert_allclose(doc["counts"], sums, rtol=1e-9)
        assert client.app.state.models.default.worker.engine.coordinator.v.dtype == np.float64


def shard_pid(actor) -> int:
    """The process id of a shard actor (the cluster runs on this machine)."""
    return ray.get(actor.__ray_call__.remote(lambda shard: __import__("os").getpid()))


def test_samples_by_id_are_deleted_exactly_on_the_cluster_and_stay_so_after_a_kill(
    ray_address: str, make_settings: SettingsFactory
) -> None:
    """Ids and exact deletion with the engine on the cluster: ``GET /samples/{id}``
    answers the nearest centroid, ``DELETE`` takes the sample's vote out of ``S`` and
    ``v`` at once (the published counts drop), it answers 404 after, and at the next
    fixed point the centroids are the means of the remaining rows. The shard process
    that held a deleted row is killed (``SIGKILL``): its replacement holds the retained
    rows only, the model converges on them and the new ones, the ids stay deleted."""
    import os
    import signal

    from tests.testkit import assert_problem

    rng = np.random.default_rng(17)
    X, _ = blobs_around(rng, MEANS, per_blob=120)
    more, _ = blobs_around(rng, MEANS, per_blob=20)
    n = len(X)
    ids = [f"s{i}" for i in range(n)]
    settings = make_settings(batch_size=48, ray_address=ray_address, ray_shards=2)
    with TestClient(create_app(settings)) as client:
        for part in np.array_split(np.arange(n), 3):
            body = {"vectors": X[part].tolist(), "ids": [ids[i] for i in part]}
            assert client.post("/samples", json=body).status_code == 202
        doc = wait_converged(client, n, timeout=60.0)
        C = np.array(doc["centroids"], dtype=np.float64)
        found = client.get("/samples/s5").json()
        assert found["cluster"] == int(np.argmin(((C - X[5]) ** 2).sum(axis=1)))
        coord = client.app.state.models.default.worker.engine.coordinator
        held = [ray.get(a.holdings.remote())[0] for a in coord.shards]
        victim = next(s for s, rows in enumerate(held) if (rows == X[5]).all(axis=1).any())
        assert client.delete("/samples/s5").status_code == 204
        answer = client.post("/samples/delete", json={"ids": ["s6", "s7", "nope"]}).json()
        assert answer == {"deleted": ["s6", "s7"], "not_found": ["nope"]}
        assert coord.v.sum() == n - 3  # the votes left S and v at once
        assert sum(client.get("/centroids").json()["counts"]) == n - 3
        for gone in ("s5", "s6", "s7"):
            assert_problem(client.get(f"/samples/{gone}"), 404, "unknown-sample")
        kept = np.delete(np.arange(n), [5, 6, 7])
        C = np.array(wait_converged(client, n - 3, timeout=60.0)["centroids"])
        means, _ = nearest_means(C, X[kept], np.ones(kept.shape[0]))
        np.testing.assert_allclose(C, means, atol=1e-4)

        os.kill(shard_pid(coord.shards[victim]), signal.SIGKILL)
        assert post_npy(client, more).status_code == 202
        rows = np.concatenate([X[kept], more])
        doc = wait_converged(client, rows.shape[0], timeout=60.0)
        assert coord.n_lost >= 1
        C = np.array(doc["centroids"])
        means, sums = nearest_means(C, rows, np.ones(rows.shape[0]))
        np.testing.assert_allclose(C, means, atol=1e-4)
        assert doc["counts"] == sums.astype(int).tolist()
        held = np.concatenate([ray.get(a.holdings.remote())[0] for a in coord.shards])
        assert held.shape[0] == rows.shape[0]
        assert not (held[:, None, :] == X[[5, 6, 7]][None]).all(axis=2).any()
        for gone in ("s5", "s6", "s7"):
            assert_problem(client.get(f"/samples/{gone}"), 404, "unknown-sample")
        assert client.get("/samples/s8").status_code == 200


def test_a_cosine_model_runs_on_the_cluster(
    ray_address: str, make_settings: SettingsFactory
) -> None:
    from tests.testkit import assert_problem

    rng = np.random.default_rng(21)
    k, d, n = 3, 5, 450
    axes = np.eye(d)[:k] + 0.2  # about 70 degrees apart
    X = (axes[rng.integers(k, size=n)] + 0.1 * rng.normal(size=(n, d))).astype(np.float32)
    X *= rng.uniform(0.5, 50.0, (n, 1)).astype(np.float32)
    U, spec = unit_rows(X), {"k": k, "dim": d, "batch_size": 32, "seed": 0, "metric": "cosine"}
    with TestClient(create_app(make_settings(ray_address=ray_address, ray_shards=2))) as client:
        assert client.put("/models/sph", json=spec).status_code == 201
        for part in np.array_split(np.arange(n), 3):
            assert post_npy(client, X[part], "/models/sph/samples").status_code == 202
        zero = X[:3].copy()
        zero[1] = 0.0
        problem = assert_problem(post_npy(client, zero, "/models/sph/samples"), 422, "zero-vector")
        assert problem["row"] == 1

        def converged() -> dict | None:
            doc = client.get("/models/sph/centroids").json()
            return doc if doc.get("converged") and doc["n_samples"] == n else None

        doc = wait_until(converged, 40.0, "the cosine model on the cluster")
        engine = client.app.state.models.running["sph"].handle.worker.engine
        held = ray.get([shard.holdings.remote() for shard in engine.coordinator.shards])
        assert len(held) == 2 and all(part[0].shape[0] for part in held)
        for rows, ids, *_ in held:  # the shards hold the unit rows
            np.testing.assert_array_equal(rows, U[ids])
        C, U64 = np.array(doc["centroids"], dtype=np.float64), U.astype(np.float64)
        np.testing.assert_allclose((C * C).sum(axis=1), 1.0, atol=2.0**-21)
        labels = np.argmax(U64 @ C.T, axis=1)
        for j in range(k):  # the spherical fixed point: each the direction of its sum
            total = U64[labels == j].sum(axis=0)
            np.testing.assert_allclose(C[j], total / np.linalg.norm(total), atol=1e-6)
        assert doc["metric"] == "cosine"
        assert doc["counts"] == np.bincount(labels, minlength=k).tolist()
        energy = client.get("/models/sph/stats").json()["energy"]
        assert energy == pytest.approx(np.mean(1.0 - np.max(U64 @ C.T, axis=1)), rel=1e-3)
        answer = post_npy(client, 7.0 * X[:20], "/models/sph/assign").json()
        cos = U64[:20] @ C.T
        assert answer["clusters"] == cos.argmax(axis=1).tolist()
        np.testing.assert_allclose(answer["similarities"], cos.max(axis=1), atol=1e-6)
