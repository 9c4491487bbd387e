"""POST /samples through the real app and a real Redis: what is accepted is in the log,
what is refused leaves the log untouched and says why."""

from __future__ import annotations

from collections.abc import Iterator
from unittest.mock import ANY

import numpy as np
import pytest
import redis
from service_helpers import post_npy

from nmbatch.service.config import Settings
from nmbatch.service.main import create_app
from nmbatch.service.storage import CHUNK_BYTES, ModelKeys
from tests.testkit import (
    PROBLEM,
    SettingsFactory,
    TestClient,
    assert_problem,
    log_state,
    logged_samples,
    metric,
    npy_bytes,
)


def test_json_samples_are_accepted_and_logged_as_float32(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    X = [[0.5, 1.0], [2.0, -3.25], [1e-3, 7.0]]
    response = client.post("/samples", json={"vectors": X})
    assert response.status_code == 202
    assert response.json() == {"accepted": 3, "n_samples": 3, "ids": ANY}
    np.testing.assert_array_equal(logged_samples(redis_client, model_name), np.float32(X))


def test_npy_samples_add_to_the_total(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    first = np.arange(8, dtype=np.float64).reshape(4, 2)
    second = np.arange(6, dtype=np.int16).reshape(3, 2)
    assert post_npy(client, first).json() == {"accepted": 4, "n_samples": 4, "ids": ANY}
    assert post_npy(client, second).json() == {"accepted": 3, "n_samples": 7, "ids": ANY}
    logged = logged_samples(redis_client, model_name)
    np.testing.assert_array_equal(logged, np.concatenate([first, second]).astype(np.float32))


def test_octet_stream_samples_once_the_dimension_is_known(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    raw = np.array([[1.0, 2.0], [3.0, 4.0]], dtype="<f4")
    octet = {"content-type": "application/octet-stream"}
    refused = client.post("/samples", content=raw.tobytes(), headers=octet)
    assert refused.status_code == 409
    assert refused.json()["type"].endswith(":dimension-unknown")
    client.post("/samples", json={"vectors": [[0.0, 0.0]]})
    accepted = client.post("/samples", content=raw.tobytes(), headers=octet)
    assert accepted.json() == {"accepted": 2, "n_samples": 3, "ids": ANY}
    np.testing.assert_array_equal(logged_samples(redis_client, model_name)[1:], raw)


def test_the_first_batch_fixes_the_dimension_in_redis(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    client.post("/samples", json={"vectors": [[1.0, 2.0, 3.0]]})
    assert redis_client.hget(ModelKeys(model_name).meta, "dim") == b"3"
    response = client.post("/samples", json={"vectors": [[1.0, 2.0]]})
    assert response.status_code == 422
    assert response.json()["expected_dim"] == 3 and response.json()["got_dim"] == 2


def test_a_large_request_spans_several_log_entries_atomically(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    d = 64
    rows_per_entry = CHUNK_BYTES // (4 * d)
    X = np.random.default_rng(0).normal(size=(2 * rows_per_entry + 5, d)).astype(np.float32)
    answer = post_npy(client, X).json()
    assert answer == {"accepted": X.shape[0], "n_samples": X.shape[0], "ids": ANY}
    assert len(set(answer["ids"])) == X.shape[0]  # assigned, one per row over 3 entries
    assert log_state(redis_client, model_name) == (3, X.shape[0], b"64")
    np.testing.assert_array_equal(logged_samples(redis_client, model_name), X)


def _json(body: str) -> tuple[bytes, str]:
    return body.encode(), "application/json"


def _npy(array: np.ndarray) -> tuple[bytes, str]:
    return npy_bytes(array), "application/x-npy"


BAD_REQUESTS = {
    "wrong dimension": (_json('{"vectors": [[1, 2, 3]]}'), 422, "wrong-dimension"),
    "NaN": (_npy(np.array([[1.0, np.nan]])), 422, "non-finite"),
    "infinity": (_npy(np.array([[np.inf, 1.0]])), 422, "non-finite"),
    "ragged": (_json('{"vectors": [[1, 2], [3]]}'), 422, "not-a-matrix"),
    "empty": (_json('{"vectors": []}'), 422, "empty"),
    "empty npy": (_npy(np.zeros((0, 2))), 422, "empty"),
    "non-numeric": (_json('{"vectors": [[1, "x"]]}'), 422, "non-numeric"),
    "boolean": (_json('{"vectors": [[1, false]]}'), 422, "non-numeric"),
    "null": (_json('{"vectors": [[1, null]]}'), 422, "non-numeric"),
    "malformed json": (_json('{"vectors": [[1, 2]'), 400, "malformed-body"),
    "malformed npy": ((b"\x93NUMPY\x01\x00garbage", "application/x-npy"), 400, "malformed-body"),
    "wrong content type": ((b"1,2", "text/csv"), 415, "unsupported-media-type"),
    "too many vectors": (_npy(np.zeros((11, 2))), 413, "too-many-vectors"),
    "body too large": (_npy(np.zeros((10, 2 * 1024))), 413, "body-too-large"),
}


@pytest.fixture
def small_limits_client(make_settings: SettingsFactory) -> Iterator[TestClient]:
    """The app with at most 10 vectors and 16 KiB per request."""
    settings = make_settings(max_vectors=10, max_body_bytes=16 * 1024)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("request_body", "status", "slug"), BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys()
)
def test_bad_input_is_a_problem_and_stores_nothing(
    small_limits_client: TestClient,
    redis_client: redis.Redis,
    model_name: str,
    request_body: tuple[bytes, str],
    status: int,
    slug: str,
) -> None:
    client = small_limits_client
    assert client.post("/samples", json={"vectors": [[1.0, 2.0]]}).status_code == 202
    before = log_state(redis_client, model_name)
    body, content_type = request_body
    response = client.post("/samples", content=body, headers={"content-type": content_type})
    assert_problem(response, status, slug)
    assert log_state(redis_client, model_name) == before == (1, 1, b"2")
    assert client.post("/samples", json={"vectors": [[3.0, 4.0]]}).json()["n_samples"] == 2


def test_body_over_the_limit_is_refused_without_a_content_length(
    small_limits_client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    def chunks():
        for _ in range(40):
            yield b"[" * 1024

    response = small_limits_client.post(
        "/samples", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["type"].endswith(":body-too-large")
    assert log_state(redis_client, model_name) == (0, 0, None)


def test_rejections_are_counted_in_the_metrics(small_limits_client: TestClient) -> None:
    small_limits_client.post("/samples", content=b"x", headers={"content-type": "text/plain"})
    text = small_limits_client.get("/metrics").text
    name = "nmbatch_samples_rejected_requests_total"
    assert metric(text, name, problem="unsupported-media-type") == 1.0


def test_a_dimension_fixed_by_another_process_is_used_for_raw_bodies(
    client: TestClient, redis_client: redis.Redis, model_name: str
) -> None:
    redis_client.hset(ModelKeys(model_name).meta, "dim", 2)
    raw = np.array([[1.0, 2.0]], dtype="<f4").tobytes()
    response = client.post(
        "/samples", content=raw, headers={"content-type": "application/octet-stream"}
    )
    assert response.json() == {"accepted": 1, "n_samples": 1, "ids": ANY}


VECTOR_BODIES = [("/samples", "post"), ("/assign", "post")]


def vectors_property(document: dict, path: str, method: str) -> dict:
    """The JSON schema of ``vectors`` in the body of ``method path``."""
    content = document["paths"][path][method]["requestBody"]["content"]
    return content["application/json"]["schema"]["properties"]["vectors"]


@pytest.mark.parametrize("dim", [1, 3, 100])
def test_a_configured_dimension_is_in_the_openapi_document(dim: int) -> None:
    # The document of an app that is never started: nothing connects to Redis.
    app = create_app(Settings(redis_url="redis://127.0.0.1:1/0", dim=dim))
    document = app.openapi()
    for path, method in VECTOR_BODIES:
        vectors = vectors_property(document, path, method)
        assert vectors["items"]["minItems"] == vectors["items"]["maxItems"] == dim
        for example in vectors.get("examples", []):
            assert all(len(vector) == dim for vector in example)
    assert app.openapi() is document  # built once


def test_without_a_configured_dimension_the_document_fixes_none() -> None:
    document = create_app(Settings(redis_url="redis://127.0.0.1:1/0")).openapi()
    for path, method in VECTOR_BODIES:
        items = vectors_property(document, path, method)["items"]
        assert items["minItems"] == 1 and "maxItems" not in items  # any length but none


@pytest.mark.parametrize("dim", [None, 2])
def test_the_wrong_dimension_422_is_documented(dim: int | None) -> None:
    document = create_app(Settings(redis_url="redis://127.0.0.1:1/0", dim=dim)).openapi()
    for path, method in [*VECTOR_BODIES, ("/assign", "get")]:
        refused = document["paths"][path][method]["responses"]["422"]
        assert "urn:nmbatch:problem:wrong-dimension" in refused["description"]
        assert "`expected_dim`" in refused["description"]
        assert PROBLEM in refused["content"]
