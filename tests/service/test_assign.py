"""GET and POST /assign: the nearest centroid by brute force, with the version used."""

from __future__ import annotations

import numpy as np
import pytest
from service_helpers import post_npy, wait_converged

from tests.testkit import TestClient

POINTS = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 20.0], [1.0, 20.0]]
QUERIES = np.array([[0.2, 0.3], [9.0, -1.0], [3.0, 15.0], [5.0, 0.5], [-4.0, 30.0]])


@pytest.fixture
def converged(client: TestClient) -> dict:
    client.post("/samples", json={"vectors": POINTS})
    return wait_converged(client, len(POINTS))


def brute_force(queries: np.ndarray, centroids: list[list[float]]) -> tuple[list[int], np.ndarray]:
    C = np.array(centroids, dtype=np.float64)
    dist = np.sqrt(((queries[:, None, :] - C[None, :, :]) ** 2).sum(axis=2))
    return dist.argmin(axis=1).tolist(), dist.min(axis=1)


def test_get_assign_gives_the_nearest_centroid(client: TestClient, converged: dict) -> None:
    labels, distances = brute_force(QUERIES, converged["centroids"])
    for query, label, distance in zip(QUERIES, labels, distances, strict=True):
        response = client.get("/assign", params={"vector": ",".join(map(str, query))})
        assert response.status_code == 200
        doc = response.json()
        assert doc["version"] == converged["version"] and doc["cluster"] == label
        assert doc["distance"] == pytest.approx(distance, rel=1e-5)


def test_post_assign_json_and_npy_agree_with_brute_force(
    client: TestClient, converged: dict
) -> None:
    labels, distances = brute_force(QUERIES, converged["centroids"])
    for response in (
        client.post("/assign", json={"vectors": QUERIES.tolist()}),
        post_npy(client, QUERIES, "/assign"),
    ):
        assert response.status_code == 200
        doc = response.json()
        assert doc["version"] == converged["version"] and doc["clusters"] == labels
        np.testing.assert_allclose(doc["distances"], distances, rtol=1e-5)


def test_assign_stores_nothing(client: TestClient, converged: dict) -> None:
    client.post("/assign", json={"vectors": QUERIES.tolist()})
    assert client.get("/stats").json()["n_logged"] == len(POINTS)


@pytest.mark.parametrize(
    ("params", "slug"),
    [({"vector": "1,2,3"}, "wrong-dimension"), ({"vector": "1,x"}, "non-numeric"),
     ({"vector": "1,nan"}, "non-finite"), ({}, "invalid-request")],
)  # fmt: skip
def test_get_assign_bad_vector_is_a_422_problem(
    client: TestClient, converged: dict, params: dict, slug: str
) -> None:
    response = client.get("/assign", params=params)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == f"urn:nmbatch:problem:{slug}"


def test_post_assign_bad_body_is_a_problem(client: TestClient, converged: dict) -> None:
    wrong_dim = client.post("/assign", json={"vectors": [[1.0, 2.0, 3.0]]})
    assert wrong_dim.status_code == 422 and wrong_dim.json()["expected_dim"] == 2
    wrong_type = client.post("/assign", content=b"1,2", headers={"content-type": "text/csv"})
    assert wrong_type.status_code == 415


def test_assign_before_any_centroids_is_a_409_problem(client: TestClient) -> None:
    response = client.get("/assign", params={"vector": "1,2"})
    assert response.status_code == 409
    assert response.json()["needed"] == 3


@pytest.mark.parametrize("method", ["OPTIONS", "PUT", "DELETE", "PATCH", "HEAD"])
def test_other_methods_are_a_405_problem_allowing_get_and_post(
    client: TestClient, method: str
) -> None:
    response = client.request(method, "/assign", params={"vector": "1,2"})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"
    assert response.headers["content-type"] == "application/problem+json"
    if method != "HEAD":  # a HEAD answer has no body
        problem = response.json()
        assert problem["status"] == 405
        assert problem["detail"] == f"{method} is not allowed on /assign"
    count = f'nmbatch_request_seconds_count{{method="{method}",route="/assign",status="405"}}'
    assert f"{count} 1.0" in client.get("/metrics").text
