"""``GET /dashboard``, its files and ``GET /dashboard/data`` on the real app and Redis."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Histogram
from service_helpers import post_npy, wait_converged

from nmbatch.engine.state import ModelState
from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.main import create_app
from nmbatch.service.routes.dashboard import ASSETS, histogram_quantile
from nmbatch.service.state import (
    ENERGY_HISTORY,
    EnergyPoint,
    ModelBoard,
    PublishedModel,
    PublishedStats,
)
from tests.testkit import PROBLEM, SettingsFactory, TestClient, blobs, wait_until

# Members of /stats that the same state gives twice (Redis's memory and the log's size vary).
STABLE = ("phase", "role", "version", "b", "N", "iteration", "converged", "energy",
          "doublings", "max_samples", "retention", "n_ingested")  # fmt: skip


def same_stats(data: dict[str, Any], stats: dict[str, Any]) -> bool:
    return data.keys() == stats.keys() and all(data[m] == stats[m] for m in STABLE)


def test_the_page_and_its_files_are_served_with_their_types(client: TestClient) -> None:
    page = client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name in ("dashboard/static/dashboard.js", "dashboard/static/vendor/uPlot.iife.min.js"):
        assert name in page.text
    for name, media_type in ASSETS.items():
        response = client.get(f"/dashboard/static/{name}")
        assert response.status_code == 200 and response.headers["content-type"] == media_type
        again = client.get(f"/dashboard/static/{name}",
                           headers={"if-none-match": response.headers["etag"]})  # fmt: skip
        assert again.status_code == 304
    assert "MIT License" in client.get("/dashboard/static/vendor/uPlot.LICENSE").text
    for bad in ("../main.py", "index.html.bak", "vendor/../../main.py", "nothing"):
        response = client.get(f"/dashboard/static/{bad}")
        assert response.status_code == 404 and response.headers["content-type"] == PROBLEM


def test_data_gives_the_assign_latency_and_the_error_counts(client: TestClient) -> None:
    empty = client.get("/dashboard/data").json()
    assert empty["assign_latency"] == {"count": 0, "p50": None, "p90": None, "p99": None}
    assert empty["redis_up"] is True and empty["server_rss_bytes"] > 10_000_000
    client.post("/samples", json={"vectors": [[0.0], [1.0], [10.0], [11.0], [20.0], [21.0]]})
    wait_until(lambda: client.get("/centroids").status_code == 200, what="centroids")
    for x in range(25):
        assert client.get("/assign", params={"vector": str(x)}).status_code == 200
    assert client.get("/assign", params={"vector": "a"}).status_code == 422
    doc = client.get("/dashboard/data").json()
    latency = doc["assign_latency"]
    assert latency["count"] == 25
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] < 10
    assert doc["client_errors"] >= 1 and doc["assign_errors"] == 0
    assert doc["requests"] >= 28


def test_data_needs_the_key_when_reads_do(make_settings: SettingsFactory) -> None:
    settings = make_settings(api_key="dashboard-route-secret", api_key_reads=True)
    with TestClient(create_app(settings)) as client:
        assert client.get("/dashboard").status_code == 200  # the page holds no data
        refused = client.get("/dashboard/data")
        assert refused.status_code == 401 and refused.headers["content-type"] == PROBLEM
        ok = client.get(
            "/dashboard/data", headers={"authorization": "Bearer dashboard-route-secret"}
        )
        assert ok.status_code == 200


def test_histogram_quantile_lies_in_the_bucket_of_numpys_quantile() -> None:
    rng = np.random.default_rng(0)
    bounds = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, float("inf")]
    values = rng.lognormal(-4.0, 1.2, size=5000)
    histogram = Histogram("h", "h", buckets=bounds, registry=CollectorRegistry())
    for v in values:
        histogram.observe(v)
    samples = [s for s in histogram.collect()[0].samples if s.name == "h_bucket"]
    cumulative = [s.value for s in samples]
    assert [float(s.labels["le"]) for s in samples] == bounds
    edges = [0.0, *bounds]
    for q in (0.1, 0.5, 0.9, 0.99):
        estimate = histogram_quantile(q, bounds, cumulative)
        true = float(np.quantile(values, q))
        i = int(np.searchsorted(bounds, true))  # the bucket holding the true quantile
        assert edges[i] <= estimate <= edges[i + 1], (q, estimate, true)
        # Linear interpolation of the empirical CDF between the bucket's edges.
        below = cumulative[i - 1] if i else 0.0
        expected = edges[i] + (edges[i + 1] - edges[i]) * (q * len(values) - below) / (
            cumulative[i] - below
        )
        assert estimate == expected
    assert histogram_quantile(0.5, bounds, [0.0] * len(bounds)) is None
    assert histogram_quantile(0.99, [0.1, float("inf")], [0.0, 4.0]) == 0.1  # the +Inf bucket


def test_data_carries_stats_and_centroids_or_their_problems(client: TestClient) -> None:
    # Before the first centroids: /centroids' 409 problem, as a member of a 200 answer.
    deadline = time.monotonic() + 30  # the worker's phase settles first (no samples yet)
    settled = ("waiting-for-dimension", "waiting-for-samples")
    while client.get("/readyz").json()["worker"] not in settled:
        assert time.monotonic() < deadline, client.get("/readyz").json()
        time.sleep(0.05)
    data = client.get("/dashboard/data")
    assert data.status_code == 200 and data.headers["content-type"] == "application/json"
    doc = data.json()
    refused = client.get("/centroids")
    assert refused.status_code == 409
    assert doc["centroids"] is None and doc["centroids_version"] is None
    assert doc["centroids_problem"] == refused.json()
    assert doc["stats_problem"] is None and same_stats(doc["stats"], client.get("/stats").json())
    assert doc["ready"] == client.get("/readyz").json() and doc["energy_history"] == []

    post_npy(client, blobs(300, 4, 3, seed=1))
    centroids = wait_converged(client, 300)
    doc = client.get("/dashboard/data").json()
    assert doc["centroids"] == centroids and doc["centroids_problem"] is None
    assert doc["centroids_version"] == centroids["version"]
    assert same_stats(doc["stats"], client.get("/stats").json())
    # The version held is not sent again; another one is.
    same = client.get("/dashboard/data", params={"since": centroids["version"]}).json()
    assert same["centroids"] is None and same["centroids_version"] == centroids["version"]
    older = client.get("/dashboard/data", params={"since": centroids["version"] - 1}).json()
    assert older["centroids"] == centroids


def test_the_energy_history_grows_with_the_versions(client: TestClient) -> None:
    X = blobs(900, 4, 3, seed=2)
    lengths = []
    for n, part in zip((300, 600, 900), np.array_split(X, 3), strict=True):
        post_npy(client, part)
        wait_converged(client, n)
        lengths.append(len(client.get("/dashboard/data").json()["energy_history"]))
    assert lengths[0] >= 1 and lengths[0] < lengths[1] < lengths[2], lengths
    doc = client.get("/dashboard/data").json()
    history, stats = doc["energy_history"], doc["stats"]
    versions = [p["version"] for p in history]
    assert versions == sorted(set(versions)) and versions[-1] == stats["version"]
    assert history[-1]["energy"] == stats["energy"]  # what /stats shows with that version
    assert all(p["energy"] >= 0 and p["at"].endswith("+00:00") for p in history)
    tail = client.get("/dashboard/data", params={"energy_since": versions[-2]}).json()
    assert tail["energy_history"] == history[-2:]


def test_the_board_keeps_one_energy_point_per_version_and_the_last_500() -> None:
    board = ModelBoard()

    def publish(version: int) -> None:
        state = ModelState(np.zeros((2, 1), np.float32), np.zeros(2, np.int64), 2, 2, version,
                           False, True)  # fmt: skip
        assert board.publish(PublishedModel.build(version=version, state=state))

    board.publish_stats(PublishedStats(energy=1.0))  # no model yet: no point
    publish(1)
    board.publish_stats(PublishedStats(energy=None))  # no energy: no point
    assert board.energy_history == ()
    board.publish_stats(PublishedStats(energy=2.0))
    first = board.energy_history
    board.publish_stats(PublishedStats(phase="converged", energy=2.0))  # same: kept as is
    assert board.energy_history is first and first[0].version == 1
    board.publish_stats(PublishedStats(energy=1.5))  # a later estimate, same version
    assert [(p.version, p.energy) for p in board.energy_history] == [(1, 1.5)]
    for version in range(2, ENERGY_HISTORY + 11):
        publish(version)
        board.publish_stats(PublishedStats(energy=1.0 / version))
    history = board.energy_history
    assert len(history) == ENERGY_HISTORY
    assert [p.version for p in history] == list(range(11, ENERGY_HISTORY + 11))
    assert isinstance(history[-1], EnergyPoint)
    assert history[-1].energy == 1.0 / (ENERGY_HISTORY + 10)


def test_data_gives_the_problem_stats_answers_while_redis_is_away(
    tmp_path: Path, model_name: str
) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    try:
        settings = Settings(redis_url=url, model=model_name, k=3, poll_seconds=0.05)
        with TestClient(create_app(settings)) as client:
            client.post("/samples", json={"vectors": [[0.0], [1.0], [10.0], [11.0]]})
            centroids = wait_converged(client, 4)  # no new version while Redis is away
            server.stop()
            stats = client.get("/stats")
            assert stats.status_code == 503
            data = client.get("/dashboard/data", params={"since": centroids["version"]})
            assert data.status_code == 200
            doc = data.json()
            assert doc["stats"] is None
            problem = doc["stats_problem"]
            assert problem["type"] == "urn:nmbatch:problem:storage-unavailable"
            assert {m: problem[m] for m in ("type", "title", "status", "retry_after")} == {
                m: stats.json()[m] for m in ("type", "title", "status", "retry_after")
            }
            assert doc["ready"]["ready"] is False and doc["ready"]["redis"] != "ok"
            # The centroids are served from memory: still there, not sent again.
            assert doc["centroids_problem"] is None and doc["centroids"] is None
            assert doc["centroids_version"] >= centroids["version"]
    finally:
        server.stop()
