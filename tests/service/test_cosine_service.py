"""Spherical k-means over HTTP (``NMBATCH_METRIC=cosine``, a model spec's ``metric``).

Real parts: the session's redis-server, the app with its lifespan (worker and engine
process). Tested: the rows are normalised before they are logged (the log holds exactly
the engine's ``unit_rows`` of what was sent, on every ingestion path: JSON read by the
kernel and by orjson, ``.npy``, raw ``float32``, a named model's ``samples``); the
converged centroids are unit vectors and the normalised sums of the logged rows nearest
them; a zero vector is a 422 ``zero-vector`` problem naming its row and stores nothing;
``/assign`` (GET through the fast path and the route, ``?version=``, POST) answers the
similarity, checked against numpy; ``/centroids``, ``/stats`` and ``GET /models`` say the
metric; a restart with another metric is refused like another ``k``; Euclidean answers are
the documents they were, byte for byte (a cosine model on the Ray engine:
``tests/service/test_ray_service.py``).
"""

from __future__ import annotations

import math
import tracemalloc
from typing import Any, get_args

import numpy as np
import orjson
import pytest
import redis
from service_helpers import post_npy

from nmbatch.engine import nearest
from nmbatch.engine.metric import METRICS, UNIT_TOLERANCE, unit_rows
from nmbatch.service.config import Settings
from nmbatch.service.main import StartupError, create_app
from nmbatch.service.models import REGISTRY_KEY, ModelSpec
from nmbatch.service.parsing import parse_vectors
from nmbatch.service.storage import ModelConfigError, ModelKeys, ModelRepository
from nmbatch.service.usecases.serving import metric_vectors
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_problem,
    log_state,
    logged_samples,
    npy_bytes,
    wait_until,
)

D = 5
K = 3


def directions(n: int, seed: int = 0) -> np.ndarray:
    """``n`` samples around ``K`` well-separated directions in ``R^D``, each scaled by a
    magnitude between 0.5 and 50 (spherical k-means sees only the direction):
    ``(n, D)`` float32, in random order."""
    rng = np.random.default_rng(seed)
    axes = np.eye(D)[:K] + 0.2  # three directions about 70 degrees apart
    which = rng.integers(0, K, size=n)
    U = axes[which] + 0.15 * rng.standard_normal((n, D))
    scale = rng.uniform(0.5, 50.0, size=(n, 1))
    return (U * scale).astype(np.float32)


def spherical_centroids(rows: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The direction of the sum of the unit ``rows`` nearest each centroid (float64)."""
    labels = np.argmax(rows.astype(np.float64) @ centroids.T, axis=1)
    sums = np.stack([rows[labels == j].astype(np.float64).sum(axis=0) for j in range(K)])
    return sums / np.linalg.norm(sums, axis=1, keepdims=True)


def converged_on(client: TestClient, prefix: str, n: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        response = client.get(f"{prefix}/centroids")
        if response.status_code != 200:
            return None
        doc = response.json()
        return doc if doc["converged"] and doc["n_samples"] == n else None

    return wait_until(ready, 60, f"{prefix or 'default'} converged on {n} samples")


def slow_json(X: np.ndarray) -> bytes:
    """A vectors body whose numbers have 20 significant digits: more than the JSON kernel
    converts exactly, so orjson parses it (same float32 values after rounding)."""
    rows = ",".join("[" + ",".join(f"{v:.19e}" for v in row) + "]" for row in X.tolist())
    return b'{"vectors": [' + rows.encode() + b"]}"


def post_all_ways(client: TestClient, prefix: str, parts: list[np.ndarray]) -> None:
    """Each part by another path: kernel JSON, orjson JSON, .npy (float64), raw float32."""
    sends = [
        lambda X: client.post(f"{prefix}/samples", json={"vectors": X.tolist()}),
        lambda X: client.post(f"{prefix}/samples", content=slow_json(X),
                              headers={"content-type": "application/json"}),
        lambda X: post_npy(client, X.astype(np.float64), f"{prefix}/samples"),
        lambda X: client.post(f"{prefix}/samples", content=X.astype("<f4").tobytes(),
                              headers={"content-type": "application/octet-stream"}),
    ]  # fmt: skip
    for send, X in zip(sends, parts, strict=True):
        answer = send(X)
        assert answer.status_code == 202, answer.text


def test_the_metric_setting_names_the_engines_metrics() -> None:
    assert get_args(Settings.model_fields["metric"].annotation) == METRICS
    assert Settings(metric="cosine").metric == "cosine"
    assert ModelSpec(k=2, dim=3).metric == "euclidean"
    with pytest.raises(ValueError, match="metric"):
        ModelSpec(k=2, dim=3, metric="manhattan")


@pytest.mark.parametrize("named", [False, True])
def test_a_cosine_model_logs_unit_rows_and_converges_on_their_directions(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, named: bool
) -> None:
    X = directions(400, seed=1)
    settings = make_settings(k=K) if named else make_settings(k=K, metric="cosine", dim=D)
    with TestClient(create_app(settings)) as client:
        prefix, model = "", model_name
        if named:
            spec = {"k": K, "dim": D, "batch_size": 32, "seed": 0, "metric": "cosine"}
            created = client.put("/models/spherical", json=spec)
            assert created.status_code == 201, created.text
            assert created.json()["settings"]["metric"] == "cosine"
            prefix, model = "/models/spherical", "spherical"
            # Another metric for the same name is another model: a conflict.
            other = client.put("/models/spherical", json=spec | {"metric": "euclidean"})
            assert assert_problem(other, 409, "model-conflict")["current"]["metric"] == "cosine"
        post_all_ways(client, prefix, np.array_split(X, 4))
        doc = converged_on(client, prefix, len(X))

        # The log holds exactly the engine's unit rows of what was sent, in order.
        logged = logged_samples(redis_client, model)
        np.testing.assert_array_equal(logged, unit_rows(X))
        norms2 = (logged.astype(np.float64) ** 2).sum(axis=1)
        assert np.abs(norms2 - 1.0).max() <= UNIT_TOLERANCE

        # Unit centroids, the directions of the sums of the rows nearest them.
        C = np.array(doc["centroids"], dtype=np.float64)
        assert doc["metric"] == "cosine"
        np.testing.assert_allclose(np.linalg.norm(C, axis=1), 1.0, atol=2e-7)
        np.testing.assert_allclose(C, spherical_centroids(logged, C), atol=2e-6)
        labels = np.argmax(logged.astype(np.float64) @ C.T, axis=1)
        assert sorted(np.bincount(labels, minlength=K).tolist()) == sorted(doc["counts"])

        stats = client.get(f"{prefix}/stats").json()
        assert stats["metric"] == "cosine" and stats["n_logged"] == len(X)
        # The energy is the mean cosine dissimilarity 1 - cos of the rows to their centroid.
        dissimilarity = 1.0 - np.max(logged.astype(np.float64) @ C.T, axis=1)
        assert stats["energy"] == pytest.approx(dissimilarity.mean(), rel=1e-3, abs=1e-6)
        listed = {m["name"]: m for m in client.get("/models").json()["models"]}
        assert listed[model]["settings"]["metric"] == "cosine"


ZERO_AT = 4


def zero_row_bodies(X: np.ndarray) -> list[tuple[str, dict[str, Any]]]:
    """``X`` with row ``ZERO_AT`` zero (all coordinates ``-0.0`` in one body) as every
    kind of body: (name, keywords of ``client.post``)."""
    Z = X.copy()
    Z[ZERO_AT] = 0.0
    N = Z.copy()
    N[ZERO_AT] = -0.0
    return [
        ("json", {"json": {"vectors": Z.tolist()}}),
        ("orjson", {"content": slow_json(N), "headers": {"content-type": "application/json"}}),
        ("npy", {"content": npy_bytes(Z.astype(np.float64)),
                 "headers": {"content-type": "application/x-npy"}}),
        ("raw", {"content": Z.astype("<f4").tobytes(),
                 "headers": {"content-type": "application/octet-stream"}}),
    ]  # fmt: skip


@pytest.mark.parametrize("named", [False, True])
def test_a_zero_vector_is_a_422_naming_its_row_and_stores_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, named: bool
) -> None:
    X = directions(8, seed=2)
    with TestClient(create_app(make_settings(k=K, metric="cosine"))) as client:
        prefix, model = "", model_name
        if named:
            spec = {"k": K, "dim": D, "batch_size": 32, "seed": 0, "metric": "cosine"}
            assert client.put("/models/z", json=spec).status_code == 201
            prefix, model = "/models/z", "z"
        # A first batch with a zero row fixes nothing, not even the dimension (default
        # model: no NMBATCH_DIM).
        first = client.post(f"{prefix}/samples", json={"vectors": [[1.0] * D, [0.0] * D]})
        problem = assert_problem(first, 422, "zero-vector")
        assert problem["row"] == 1 and "vector 1 is a zero vector" in problem["detail"]
        assert log_state(redis_client, model) == (0, 0, None if not named else b"5")

        assert client.post(f"{prefix}/samples", json={"vectors": X.tolist()}).status_code == 202
        before = log_state(redis_client, model)
        assert before == (1, len(X), str(D).encode())
        for name, body in zero_row_bodies(X):
            answer = client.post(f"{prefix}/samples", **body)
            problem = assert_problem(answer, 422, "zero-vector")
            assert problem["row"] == ZERO_AT, name
            assert log_state(redis_client, model) == before, name
        # With an Idempotency-Key: refused before the append, so no record is left and the
        # corrected batch is stored under the same key.
        key = {"Idempotency-Key": "cosine-zero-1"}
        body = zero_row_bodies(X)[0][1]["json"]
        assert_problem(client.post(f"{prefix}/samples", json=body, headers=key), 422,
                       "zero-vector")  # fmt: skip
        assert client.post(f"{prefix}/samples", json={"vectors": X.tolist()},
                           headers=key).status_code == 202  # fmt: skip
        assert log_state(redis_client, model)[1] == 2 * len(X)
        assert client.get(f"{prefix}/stats").json()["n_logged"] == 2 * len(X)


def similarities_of(queries: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid and cosine similarity of each query's direction, in float64."""
    Q = queries.astype(np.float64)
    cos = (Q / np.linalg.norm(Q, axis=1, keepdims=True)) @ C.T
    return cos.argmax(axis=1), cos.max(axis=1)


@pytest.mark.parametrize("named", [False, True])
def test_assign_answers_the_similarity_of_the_normalised_vectors(
    make_settings: SettingsFactory, named: bool
) -> None:
    X = directions(300, seed=3)
    queries = directions(20, seed=4) * np.float32(3.0)
    with TestClient(create_app(make_settings(k=K, metric="cosine"))) as client:
        prefix = ""
        if named:
            spec = {"k": K, "dim": D, "batch_size": 32, "seed": 0, "metric": "cosine"}
            assert client.put("/models/sim", json=spec).status_code == 201
            prefix = "/models/sim"
        assert post_npy(client, X, f"{prefix}/samples").status_code == 202
        doc = converged_on(client, prefix, len(X))
        C = np.array(doc["centroids"], dtype=np.float64)
        labels, cos = similarities_of(queries, C)

        many = client.post(f"{prefix}/assign", json={"vectors": queries.tolist()}).json()
        assert many["version"] == doc["version"] and many["clusters"] == labels.tolist()
        np.testing.assert_allclose(many["similarities"], cos, atol=1e-6)
        # distance: between the unit vector and the centroid, so d^2 = 2 - 2 cos
        d = np.array(many["distances"])
        np.testing.assert_allclose(d**2, 2.0 - 2.0 * np.array(many["similarities"]), atol=1e-9)
        as_npy = post_npy(client, queries, f"{prefix}/assign").json()
        assert as_npy == many

        version = doc["version"]  # kept once snapshotted (every 0.2 s)
        wait_until(lambda: client.get(f"{prefix}/versions").json()["newest"] == version
                   and client.get(f"{prefix}/versions").json()["versions"][-1]["version"]
                   == version, 30, "the converged version kept")  # fmt: skip
        for i, query in enumerate(queries[:5]):
            vector = ",".join(repr(float(v)) for v in query)
            for params in ({"vector": vector}, {"vector": vector, "version": version}):
                one = client.get(f"{prefix}/assign", params=params).json()
                assert one["cluster"] == labels[i]
                assert one["similarity"] == pytest.approx(cos[i], abs=1e-6)
                assert one["distance"] == pytest.approx(math.sqrt(max(0.0, 2 - 2 * cos[i])),
                                                        abs=1e-5)  # fmt: skip
                assert one["similarity"] == many["similarities"][i]

        # A zero query vector has no direction: 422, GET (past the fast path) and POST.
        zero = ",".join(["0"] * D)
        for params in ({"vector": zero}, {"vector": zero, "version": version}):
            problem = assert_problem(client.get(f"{prefix}/assign", params=params), 422,
                                     "zero-vector")  # fmt: skip
            assert problem["row"] == 0
        Z = queries.copy()
        Z[2] = 0.0
        problem = assert_problem(
            client.post(f"{prefix}/assign", json={"vectors": Z.tolist()}), 422, "zero-vector"
        )
        assert problem["row"] == 2 and "no vector of this request was assigned" in problem["detail"]
        assert client.get(f"{prefix}/stats").json()["n_logged"] == len(X)


def test_euclidean_answers_are_unchanged(client: TestClient) -> None:
    """The documents of a Euclidean model are those before the metric existed: no
    similarity, the same bytes as the Euclidean formula serialised as it was."""
    points = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 20.0], [1.0, 20.0]]
    client.post("/samples", json={"vectors": points})
    doc = converged_on(client, "", len(points))
    assert doc["metric"] == "euclidean"
    assert client.get("/stats").json()["metric"] == "euclidean"
    C = np.array(doc["centroids"], dtype=np.float32)
    Q = np.array([[0.2, 0.3], [9.0, -1.0], [0.0, 0.0], [-4.0, 30.0]], dtype=np.float32)
    labels, sqdist = nearest(Q, C, n_threads=1)
    many = client.post("/assign", json={"vectors": Q.tolist()})
    expected = orjson.dumps(
        {"version": doc["version"], "clusters": labels, "distances": np.sqrt(sqdist)},
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    assert many.content == expected
    for q, label, sq in zip(Q, labels, sqdist, strict=True):
        one = client.get("/assign", params={"vector": f"{float(q[0])!r},{float(q[1])!r}"})
        assert one.json() == {"version": doc["version"], "cluster": int(label),
                              "distance": math.sqrt(sq)}  # fmt: skip
        assert b"similarity" not in one.content
    # A zero vector is a vector like any other under euclidean.
    assert client.post("/samples", json={"vectors": [[0.0, 0.0]]}).status_code == 202


def test_a_restart_with_another_metric_is_refused_like_another_k(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    with TestClient(create_app(make_settings(metric="cosine"))) as client:
        assert client.post("/samples", json={"vectors": [[1.0, 2.0]]}).status_code == 202
    refused = r"NMBATCH_METRIC=euclidean but .* metric=cosine"
    with pytest.raises(StartupError, match=refused), TestClient(create_app(make_settings())):
        pass
    assert redis_client.hget(ModelKeys(model_name).meta, "metric") == b"cosine"
    with TestClient(create_app(make_settings(metric="cosine"))) as client:
        assert client.get("/stats").json()["metric"] == "cosine"


def test_a_model_recorded_before_the_metric_existed_is_euclidean(
    redis_client: redis.Redis, model_name: str
) -> None:
    keys = ModelKeys(model_name)
    redis_client.hset(keys.meta, mapping={"k": 3, "created_at": "1.0", "dim": 2})
    repository = ModelRepository(redis_client, model_name)
    assert repository.check_meta(3, None, "euclidean") == 2
    with pytest.raises(ModelConfigError, match=r"NMBATCH_METRIC=cosine but .* metric=euclidean"):
        repository.check_meta(3, None, "cosine")
    assert redis_client.hget(keys.meta, "metric") is None  # nothing recorded for it
    # A new model records its metric with its k.
    fresh = ModelRepository(redis_client, model_name + "-new")
    assert fresh.check_meta(3, None, "cosine") is None
    assert redis_client.hmget(ModelKeys(model_name + "-new").meta, ["k", "metric"]) == [
        b"3",
        b"cosine",
    ]


def test_a_registry_entry_without_a_metric_is_a_euclidean_model(
    make_settings: SettingsFactory, redis_client: redis.Redis
) -> None:
    # An entry written before the metric existed (no "metric" member) starts as Euclidean.
    old = {"k": 2, "dim": 2, "rho": 100.0, "batch_size": 32, "seed": 1, "init": "k-means++",
           "retention": "all", "max_samples": None, "max_age_seconds": None}  # fmt: skip
    redis_client.hset(REGISTRY_KEY, "legacy", orjson.dumps(old))
    with TestClient(create_app(make_settings())) as client:
        doc = wait_until(lambda: client.get("/models/legacy").json(), 30, "legacy started")
        assert doc["settings"]["metric"] == "euclidean"
        same = client.put("/models/legacy", json=old)
        assert same.status_code == 200, same.text


def test_normalising_costs_at_most_four_bytes_per_body_byte() -> None:
    """The request-cost rule (docs/operations/limits.md): normalising a parsed body adds
    one ``float32`` array, at most 4 bytes per body byte (an ``int8`` ``.npy``, whose
    values take one byte each), measured with tracemalloc (numpy reports its buffers)."""
    rng = np.random.default_rng(5)
    body = npy_bytes(rng.integers(1, 100, size=(20_000, 64), dtype=np.int8))
    X = parse_vectors(body, "application/x-npy", dim=None, max_vectors=100_000)
    metric_vectors(X[:2], "cosine", "")  # the kernel loaded (its first call's allocations)
    tracemalloc.start()
    try:
        U = metric_vectors(X, "cosine", "nothing stored")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert U.nbytes == 4 * X.size and peak <= 4 * len(body) + (64 << 10), (peak, len(body))
    np.testing.assert_array_equal(U, unit_rows(X))
    assert metric_vectors(X, "euclidean", "") is X  # nothing done, nothing allocated
