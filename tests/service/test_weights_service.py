"""Sample weights over HTTP (``POST /samples`` with a JSON ``weights`` member or an
``application/x-npz`` body of ``X`` and ``weights``).

Real parts: the session's redis-server, the app with its lifespan, its worker and the
engine in a child process (the service's default host) or, where the test reads the
engine's store, in the worker thread. Tested: a model fed rows with integer weights
reaches the centroids of a model fed the repeated rows (same seed), and its published
centroids are the weighted means of the logged rows nearest them, its counts their
weights (weight 0: stored, counted nowhere); the log holds the weights exactly as sent
and unweighted entries exactly as before (no ``w`` field); bad weights are a 422 problem
naming the fault (and the row) with nothing stored; an idempotent retry covers the
weights; retention (window, reservoir with compactions and a restart) removes a
weighted vote exactly.
"""

from __future__ import annotations

import io
import time
import tracemalloc
import zipfile
from typing import Any

import numpy as np
import pytest
import redis

from nmbatch.service.main import create_app
from nmbatch.service.parsing import parse_samples
from nmbatch.service.storage.codec import decode_chunk, decode_weights
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.worker import retention as worker_retention
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_problem,
    blobs,
    log_state,
    npy_bytes,
    pickled_object_npy,
    wait_until,
)

D, K = 4, 3
NAMED = "repeats"
NPZ = {"content-type": "application/x-npz"}


def npz_bytes(compressed: bool = False, **arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(out, **arrays)
    return out.getvalue()


def post_weighted(client: TestClient, prefix: str, X: np.ndarray, w: np.ndarray, how: str) -> Any:
    if how == "json":
        body = {"vectors": X.tolist(), "weights": w.tolist()}
        return client.post(f"{prefix}/samples", json=body)
    return client.post(f"{prefix}/samples", content=npz_bytes(X=X, weights=w), headers=NPZ)


def logged(client: redis.Redis, model: str) -> tuple[np.ndarray, np.ndarray, list[set[bytes]]]:
    """Rows ``(N, d)``, weights ``(N,)`` (1 for entries without ``w``) and each entry's
    field names, in log order."""
    entries = client.xrange(ModelKeys(model).log)
    rows = [decode_chunk(fields) for _, fields in entries]
    weights = [decode_weights(fields) for _, fields in entries]
    w = [np.ones(X.shape[0]) if v is None else v for X, v in zip(rows, weights, strict=True)]
    return np.concatenate(rows), np.concatenate(w), [set(fields) for _, fields in entries]


def converged(
    client: TestClient, prefix: str, n: int, ingested: int | None = None, timeout: float = 60
) -> dict[str, Any]:
    """The centroids document once converged on ``n`` samples (of ``ingested``, for a
    retention that keeps ``n`` of more)."""

    def ready() -> dict[str, Any] | None:
        response = client.get(f"{prefix}/centroids")
        doc = response.json() if response.status_code == 200 else None
        done = doc and doc["converged"] and doc["n_samples"] == n
        return doc if done and (ingested is None or doc["n_ingested"] == ingested) else None

    return wait_until(ready, timeout, f"{prefix or 'default'} converged on {n} samples")


def assert_weighted_means(doc: dict[str, Any], rows: np.ndarray, w: np.ndarray) -> None:
    """Converged: each centroid is the weighted mean of the rows nearest it, each count
    the sum of their weights (exact: the weights are integers or dyadic)."""
    C = np.asarray(doc["centroids"], dtype=np.float64)
    X = rows.astype(np.float64)
    labels = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)
    sums = np.bincount(labels, weights=w, minlength=C.shape[0])
    assert np.array_equal(np.asarray(doc["counts"], dtype=np.float64), sums)
    for j in range(C.shape[0]):
        if sums[j] > 0:
            mean = (w[labels == j, None] * X[labels == j]).sum(0) / sums[j]
            np.testing.assert_allclose(C[j], mean, rtol=1e-5, atol=1e-5)


def same_centroids(a: dict[str, Any], b: dict[str, Any]) -> None:
    """The same centroids and counts, whatever their order."""
    A, B = np.asarray(a["centroids"]), np.asarray(b["centroids"])
    match = ((A[:, None, :] - B[None]) ** 2).sum(-1).argmin(1)
    assert sorted(match.tolist()) == list(range(A.shape[0]))
    np.testing.assert_allclose(B[match], A, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.asarray(b["counts"], float)[match], np.asarray(a["counts"], float))


def test_weights_equal_repeats_through_the_service(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(240, D, K, seed=3)
    w = np.random.default_rng(4).integers(0, 4, size=240).astype(np.float64)  # 0 to 3
    repeated = np.repeat(X, w.astype(np.int64), axis=0)
    settings = make_settings(k=K, dim=D, batch_size=64, seed=5)
    with TestClient(create_app(settings)) as client:
        spec = {"k": K, "dim": D, "batch_size": 64, "seed": 5}
        assert client.put(f"/models/{NAMED}", json=spec).status_code == 201
        for part, how in zip(np.array_split(np.arange(240), 2), ("json", "npz"), strict=True):
            answer = post_weighted(client, "", X[part], w[part], how)
            assert answer.status_code == 202, answer.text
            assert answer.json()["accepted"] == part.shape[0]
        for part in np.array_split(repeated, 3):
            answer = client.post(f"/models/{NAMED}/samples", json={"vectors": part.tolist()})
            assert answer.status_code == 202, answer.text

        weighted = converged(client, "", 240)  # weight-0 rows are stored samples
        plain = converged(client, f"/models/{NAMED}", repeated.shape[0])
        rows, weights, fields = logged(redis_client, model_name)
        assert np.array_equal(rows, X) and np.array_equal(weights, w)
        assert all(f == {b"n", b"d", b"x", b"w"} for f in fields)
        assert sum(weighted["counts"]) == w.sum()  # weight 0 counts nowhere
        assert_weighted_means(weighted, X, w)
        assert_weighted_means(plain, repeated, np.ones(repeated.shape[0]))
        same_centroids(plain, weighted)
        stats = client.get("/stats").json()
        assert stats["n_samples"] == 240 and stats["n_logged"] == 240
        # The repeats' log has no weights: its entries are what they always were.
        assert all(f == {b"n", b"d", b"x"} for f in logged(redis_client, NAMED)[2])


def test_weights_of_one_are_no_weights_and_fractions_are_kept(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(120, D, K, seed=6)
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        ones = post_weighted(client, "", X[:60], np.ones(60), "json")
        assert ones.status_code == 202
        assert logged(redis_client, model_name)[2] == [{b"n", b"d", b"x"}]
        w = np.full(60, 0.25)
        w[::3] = 2.5  # dyadic: exact sums
        assert post_weighted(client, "", X[60:], w, "npz").status_code == 202
        doc = converged(client, "", 120)
        rows, weights, fields = logged(redis_client, model_name)
        assert fields[1] == {b"n", b"d", b"x", b"w"}
        assert np.array_equal(weights, np.concatenate([np.ones(60), w]))
        assert_weighted_means(doc, rows, weights)
        assert any(c != int(c) for c in doc["counts"])  # float sums of weights, served


BAD_JSON = [  # (name, weights member, slug, row)
    ("negative", [1.0, -0.5, 1.0, 1.0], "invalid-weights", 1),
    ("too-large", "1e999", "non-finite", None),  # not finite once parsed
    ("short", [1.0, 1.0, 1.0], "invalid-weights", None),
    ("long", [1.0] * 5, "invalid-weights", None),
    ("string", [1.0, 1.0, "2", 1.0], "non-numeric", 2),
    ("bool", [True, 1.0, 1.0, 1.0], "non-numeric", 0),
    ("null", [1.0, 1.0, 1.0, None], "non-numeric", 3),
    ("nested", [[1.0], 1.0, 1.0, 1.0], "non-numeric", 0),
    ("scalar", 2.0, "invalid-weights", None),
    ("null member", None, "invalid-weights", None),
]


def _bad_npz() -> list[tuple[str, bytes, int, str, int | None]]:
    X = np.ones((4, D))
    w = np.ones(4)
    nan, inf, neg = w.copy(), w.copy(), w.copy()
    nan[2], inf[3], neg[0] = np.nan, np.inf, -1.0
    cases = [
        ("nan", npz_bytes(X=X, weights=nan), 422, "invalid-weights", 2),
        ("inf", npz_bytes(X=X, weights=inf), 422, "invalid-weights", 3),
        ("negative", npz_bytes(X=X, weights=neg), 422, "invalid-weights", 0),
        ("short", npz_bytes(X=X, weights=w[:3]), 422, "invalid-weights", None),
        ("2-d", npz_bytes(X=X, weights=w[:, None]), 422, "invalid-weights", None),
        ("bool", npz_bytes(X=X, weights=w > 0), 422, "non-numeric", None),
        ("compressed", npz_bytes(True, X=X, weights=w), 422, "compressed-member", None),
        ("unknown", npz_bytes(X=X, weights=w, labels=w), 422, "unknown-member", None),
        ("no-X", npz_bytes(vectors=X, weights=w), 422, "unknown-member", None),
        ("only-weights", npz_bytes(weights=w), 422, "not-a-matrix", None),
        ("not-a-zip", npy_bytes(X), 400, "malformed-body", None),
        ("truncated", npz_bytes(X=X, weights=w)[:-30], 400, "malformed-body", None),
    ]
    pickled = io.BytesIO()  # a weights member that is a pickle: refused, never unpickled
    with zipfile.ZipFile(pickled, "w") as archive:
        archive.writestr("X.npy", npy_bytes(X))
        archive.writestr("weights.npy", pickled_object_npy(1.0, 1.0, 1.0, 1.0))
    cases.append(("pickle", pickled.getvalue(), 422, "non-numeric", None))
    return cases


@pytest.mark.parametrize("named", [False, True])
def test_bad_weights_are_a_422_naming_the_fault_and_store_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, named: bool
) -> None:
    X = np.arange(4 * D, dtype=np.float64).reshape(4, D)
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        prefix, model = "", model_name
        if named:
            assert client.put("/models/bad", json={"k": K, "dim": D}).status_code == 201
            prefix, model = "/models/bad", "bad"
        assert client.post(f"{prefix}/samples", json={"vectors": X.tolist()}).status_code == 202
        before = log_state(redis_client, model)
        for name, weights, slug, row in BAD_JSON:
            if weights == "1e999":
                body = b'{"vectors": %s, "weights": [1, 1e999, 1, 1]}' % str(X.tolist()).encode()
                answer = client.post(f"{prefix}/samples", content=body,
                                     headers={"content-type": "application/json"})  # fmt: skip
            else:
                answer = client.post(f"{prefix}/samples",
                                     json={"vectors": X.tolist(), "weights": weights})  # fmt: skip
            problem = assert_problem(answer, 422, slug)
            assert problem.get("row") == row, (name, problem)
            assert log_state(redis_client, model) == before, name
        for name, body, status, slug, row in _bad_npz():
            answer = client.post(f"{prefix}/samples", content=body, headers=NPZ)
            problem = assert_problem(answer, status, slug)
            assert problem.get("row") == row, (name, problem)
            assert log_state(redis_client, model) == before, name
        # /assign takes vectors only: a weights member is unknown, an .npz body unsupported.
        converged(client, prefix, 4)
        assign = client.post(f"{prefix}/assign", json={"vectors": X.tolist(), "weights": [1] * 4})
        assert_problem(assign, 422, "unknown-member")
        assign = client.post(f"{prefix}/assign", content=npz_bytes(X=X), headers=NPZ)
        assert_problem(assign, 415, "unsupported-media-type")


def test_an_npz_directory_of_many_entries_is_refused_before_it_is_read(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("X.npy", npy_bytes(np.ones((2, D))))
        for i in range(2000):
            archive.writestr(f"{i}", b"")
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        answer = client.post("/samples", content=out.getvalue(), headers=NPZ)
        assert "2001 members" in assert_problem(answer, 422, "unknown-member")["detail"]
        assert log_state(redis_client, model_name)[:2] == (0, 0)


def test_an_idempotent_retry_covers_the_weights(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    X = blobs(20, D, K, seed=8)
    w = np.arange(20, dtype=np.float64)
    key = {"idempotency-key": "weighted-1"}
    with TestClient(create_app(make_settings(k=K, dim=D))) as client:
        body = npz_bytes(X=X, weights=w)
        first = client.post("/samples", content=body, headers=NPZ | key)
        assert first.status_code == 202
        again = client.post("/samples", json={"vectors": X.tolist(), "weights": w.tolist()},
                            headers=key)  # fmt: skip  # the same rows and weights as JSON
        assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
        other = client.post("/samples", content=npz_bytes(X=X, weights=w + 1), headers=NPZ | key)
        assert_problem(other, 409, "idempotency-key-reused")
        unweighted = client.post("/samples", json={"vectors": X.tolist()}, headers=key)
        assert_problem(unweighted, 409, "idempotency-key-reused")
        rows, weights, fields = logged(redis_client, model_name)
        assert np.array_equal(rows, X) and np.array_equal(weights, w)
        assert fields == [{b"n", b"d", b"x", b"w"}]


# -- retention ------------------------------------------------------------------------------
def _engine(client: TestClient) -> Any:
    worker = client.app.state.models.default.worker
    wait_until(lambda: worker.engine is not None and worker.phase == "converged", 30, "engine")
    return worker.engine


@pytest.mark.parametrize("in_process", [False, True], ids=["thread", "child-process"])
def test_a_window_retires_weighted_votes_exactly(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, in_process: bool
) -> None:
    W = 200
    settings = make_settings(k=K, dim=D, retention="window", max_samples=W,
                             worker_process=in_process)  # fmt: skip
    X = blobs(800, D, K, seed=9)
    w = np.random.default_rng(10).integers(0, 5, size=800) / 4.0  # dyadic: exact sums
    with TestClient(create_app(settings)) as client:
        for start in range(0, 800, 100):
            part = slice(start, start + 100)
            how = "json" if start % 200 else "npz"
            assert post_weighted(client, "", X[part], w[part], how).status_code == 202
        doc = converged(client, "", W, 800)
        # The window's rows and their weights, from the end of the stream.
        assert_weighted_means(doc, X[-W:], w[-W:])
        assert sum(doc["counts"]) == w[-W:].sum()
        engine = _engine(client)
        ids = np.arange(800 - W, 800)
        assert np.array_equal(engine.weights_of(ids), w[-W:])
        assert np.array_equal(engine.rows_of(ids), X[-W:])


def test_age_retires_weighted_votes_exactly_by_redis_time(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(k=K, dim=D, retention="age", max_age_seconds=2.0)
    old, new = blobs(300, D, K, seed=13), blobs(200, D, K, seed=14)
    w_old = np.full(300, 4.0)
    w_new = np.random.default_rng(15).integers(0, 6, size=200) / 2.0
    with TestClient(create_app(settings)) as client:
        worker = client.app.state.models.default.worker
        wait_until(lambda: worker.phase == "waiting-for-samples", 60, "the engine")
        posted = time.monotonic()
        assert post_weighted(client, "", old, w_old, "npz").status_code == 202
        time.sleep(max(0.0, posted + 2.1 - time.monotonic()))
        assert post_weighted(client, "", new, w_new, "json").status_code == 202
        doc = converged(client, "", 200, 500)
        assert_weighted_means(doc, new, w_new)  # the old votes left whole
        assert sum(doc["counts"]) == w_new.sum()


def test_a_reservoir_keeps_the_weights_through_compactions_and_a_restart(
    make_settings: SettingsFactory,
    redis_client: redis.Redis,
    model_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    M = 300
    monkeypatch.setattr(worker_retention, "MIN_COMPACTION", 0)  # compact at every M samples
    settings = make_settings(k=K, dim=D, retention="reservoir", max_samples=M, batch_size=64,
                             worker_process=False)  # fmt: skip
    X = blobs(1500, D, K, seed=11)
    w = np.random.default_rng(12).integers(1, 9, size=1500) / 2.0
    keys = ModelKeys(model_name)
    with TestClient(create_app(settings)) as client:
        for start in range(0, 1500, 150):
            part = slice(start, start + 150)
            assert post_weighted(client, "", X[part], w[part], "npz").status_code == 202
            if start % 600 == 450:
                converged(client, "", M, start + 150)
        doc = converged(client, "", M, 1500)
        worker = client.app.state.models.default.worker
        assert worker.retention.compactions >= 2 and worker.retention.weighted
        engine = _engine(client)
        ids = np.sort(engine._algo.store.ids())
        assert np.array_equal(engine.rows_of(ids), X[ids])  # ids are stream positions
        assert np.array_equal(engine.weights_of(ids), w[ids])
        assert_weighted_means(doc, X[ids], w[ids])
        base = keys.base(int(redis_client.hget(keys.meta, "base_generation")))
        assert all(b"w" in fields for _, fields in redis_client.xrange(base))
        counts = sorted(doc["counts"])
    with TestClient(create_app(settings)) as client:  # the base, then the log after it
        doc = converged(client, "", M, 1500)
        engine = _engine(client)
        again = np.sort(engine._algo.store.ids())
        assert np.array_equal(again, ids)
        assert np.array_equal(engine.weights_of(ids), w[ids])
        assert_weighted_means(doc, X[ids], w[ids])
        assert sorted(doc["counts"]) == counts  # the snapshot's float counts, served first
        # The engine rebuilt from the base and the log: the same sums of weights.
        assert sorted(engine.state.counts.tolist()) == counts


@pytest.mark.parametrize("kind", ["npz-int8", "json"])
def test_a_weighted_parse_costs_a_bounded_multiple_of_its_body(kind: str) -> None:
    """docs/operations/limits.md: a parse takes at most 40 bytes per body byte; an
    ``.npz`` body at most 10 (a copy of the archive, one of each member, then ``int8``
    vectors as ``float32`` and ``int8`` weights as ``float64``)."""
    n, d = 100_000, 16
    if kind == "json":
        rng = np.random.default_rng(0)
        body = orjson_body(rng.standard_normal((n // 10, d)), rng.uniform(0, 9, n // 10))
        content_type, bound = "application/json", 40
    else:
        X = np.ones((n, d), dtype=np.int8)
        body = npz_bytes(X=X, weights=np.full(n, 3, dtype=np.int8))
        content_type, bound = NPZ["content-type"], 10
    body = bytearray(body)
    parse_samples(body, content_type, dim=None, max_vectors=10**6, max_dim=4096)  # first use
    tracemalloc.start()
    try:
        X, w, _ = parse_samples(body, content_type, dim=None, max_vectors=10**6, max_dim=4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert w is not None and X.shape[0] == w.shape[0]
    assert peak <= bound * len(body), peak / len(body)


def orjson_body(X: np.ndarray, w: np.ndarray) -> bytes:
    """A JSON body of ``X`` and weights ``w`` whose numbers the JSON kernel does not take
    (a ``weights`` member: orjson parses it)."""
    import orjson

    return orjson.dumps({"vectors": X.tolist(), "weights": w.tolist()})
