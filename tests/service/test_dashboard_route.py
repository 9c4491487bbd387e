"""``GET /dashboard``, its files and ``GET /dashboard/data`` on the real app and Redis."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from nmbatch.service.main import create_app
from nmbatch.service.routes.dashboard import ASSETS, histogram_quantile
from tests.testkit import PROBLEM, SettingsFactory, TestClient, wait_until


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
