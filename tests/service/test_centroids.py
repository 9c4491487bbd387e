"""GET /centroids: problem before k samples, JSON and npy forms, ETag and 304."""

from __future__ import annotations

import io

import numpy as np
import pytest
from service_helpers import wait_converged

from nmbatch.service.context import etag_matches, wants_npy
from tests.testkit import TestClient

POINTS = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 20.0], [1.0, 20.0]]


def test_before_k_samples_the_problem_says_how_many_are_missing(client: TestClient) -> None:
    client.post("/samples", json={"vectors": [[1.0, 2.0]]})
    response = client.get("/centroids")
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "urn:nmbatch:problem:not-enough-samples"
    assert problem["needed"] == 2 and problem["n_samples"] == 1 and problem["k"] == 3
    assert "2 more" in problem["detail"]


def test_converged_centroids_are_the_cluster_means(client: TestClient) -> None:
    client.post("/samples", json={"vectors": POINTS})
    doc = wait_converged(client, len(POINTS))
    assert set(doc) == {
        "version", "k", "dim", "centroids", "counts", "n_samples", "n_ingested", "retention",
        "metric", "batch_size", "iteration", "converged", "updated_at",
    }  # fmt: skip
    assert (doc["k"], doc["dim"], doc["batch_size"]) == (3, 2, len(POINTS))
    assert doc["n_ingested"] == doc["n_samples"] and doc["retention"] == "all"
    assert doc["iteration"] >= 1 and doc["version"] >= 1
    order = np.argsort([c[0] + 2 * c[1] for c in doc["centroids"]])
    centroids = np.array(doc["centroids"])[order]
    np.testing.assert_allclose(centroids, [[0.0, 0.5], [10.0, 0.5], [0.5, 20.0]], rtol=1e-6)
    assert np.array(doc["counts"])[order].tolist() == [2, 2, 2]


def test_npy_form_is_the_same_array(client: TestClient) -> None:
    client.post("/samples", json={"vectors": POINTS})
    doc = wait_converged(client, len(POINTS))
    response = client.get("/centroids", headers={"accept": "application/x-npy"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-npy"
    assert response.headers["etag"] == f'"{doc["version"]}"'
    array = np.load(io.BytesIO(response.content), allow_pickle=False)
    assert array.dtype == np.float32
    np.testing.assert_array_equal(array, np.float32(doc["centroids"]))


def test_etag_is_the_version_and_if_none_match_gives_304(client: TestClient) -> None:
    client.post("/samples", json={"vectors": POINTS})
    doc = wait_converged(client, len(POINTS))
    etag = f'"{doc["version"]}"'
    assert client.get("/centroids").headers["etag"] == etag
    not_modified = client.get("/centroids", headers={"if-none-match": etag})
    assert not_modified.status_code == 304 and not_modified.content == b""
    assert not_modified.headers["etag"] == etag
    assert client.get("/centroids", headers={"if-none-match": f"W/{etag}"}).status_code == 304
    stale = client.get("/centroids", headers={"if-none-match": f'"{doc["version"] - 1}"'})
    assert stale.status_code == 200 and stale.json() == doc


def test_new_samples_give_a_newer_version(client: TestClient) -> None:
    client.post("/samples", json={"vectors": POINTS})
    first = wait_converged(client, len(POINTS))
    client.post("/samples", json={"vectors": [[10.0, 2.0]]})
    second = wait_converged(client, len(POINTS) + 1)
    assert second["version"] > first["version"]
    etag = f'"{first["version"]}"'
    assert client.get("/centroids", headers={"if-none-match": etag}).status_code == 200


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (None, False),
        ("", False),
        ('"7"', True),
        ('W/"7"', True),
        ('"6", "7"', True),
        ('"6",W/"7"', True),
        ("*", True),
        ('"6"', False),
        ("7", False),
    ],
)
def test_if_none_match_names_the_etag_weakly_or_is_a_star(
    header: str | None, matches: bool
) -> None:
    assert etag_matches(header, '"7"') is matches


@pytest.mark.parametrize(
    ("accept", "npy"),
    [
        (None, False),
        ("application/json", False),
        ("application/x-npy", True),
        ("Application/X-NPY", True),
        ("application/json, application/x-npy;q=0.5", True),
        ("application/x-npy; q=0", False),
        ("application/x-npy;q=bad", True),
        ("*/*", False),
    ],
)
def test_accept_asks_for_npy_with_a_positive_quality(accept: str | None, npy: bool) -> None:
    assert wants_npy(accept) is npy
