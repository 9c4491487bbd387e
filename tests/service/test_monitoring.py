"""/healthz, /readyz, /metrics, /stats, the OpenAPI document and framework errors."""

from __future__ import annotations

from pathlib import Path

from service_helpers import wait_converged

from nmbatch.engine.algorithms.growth import B0_PER_CLUSTER
from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.main import create_app
from tests.testkit import TestClient, metric, wait_until

POINTS = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 20.0], [1.0, 20.0]]


def test_healthz_says_ok(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_reports_redis_and_worker(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    doc = response.json()
    assert doc["ready"] is True and doc["redis"] == "ok"
    assert doc["worker"] in {"starting", "waiting-for-dimension"}  # no sample yet


def test_readyz_is_503_when_redis_is_gone(tmp_path: Path, model_name: str) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    try:
        settings = Settings(redis_url=url, model=model_name, k=3, poll_seconds=0.05)
        with TestClient(create_app(settings)) as client:
            assert client.get("/readyz").status_code == 200
            server.stop()
            response = client.get("/readyz")
            assert response.status_code == 503
            assert response.json()["ready"] is False and response.json()["redis"] != "ok"
            refused = client.post("/samples", json={"vectors": [[1.0, 2.0]]})
            assert refused.status_code == 503
            assert refused.json()["type"] == "urn:nmbatch:problem:storage-unavailable"
    finally:
        server.stop()


def test_metrics_expose_ingestion_iterations_and_latencies(
    client: TestClient, model_name: str
) -> None:
    client.post("/samples", json={"vectors": POINTS})
    wait_converged(client, len(POINTS))
    text = client.get("/metrics").text
    assert metric(text, "nmbatch_samples_ingested_total", model=model_name) == 6.0
    assert metric(text, "nmbatch_samples_in_store", model=model_name) == 6.0
    assert metric(text, "nmbatch_batch_size", model=model_name) == 6.0
    for name in (
        "nmbatch_iterations_total", "nmbatch_iteration_seconds_bucket",
        "nmbatch_distances_skipped_ratio", "nmbatch_snapshot_age_seconds",
        "nmbatch_centroid_version",
    ):  # fmt: skip
        assert f"\n{name}" in text, name
    assert 'nmbatch_request_seconds_count{method="POST",route="/samples",status="202"} 1.0' in text
    wait_until(lambda: snapshot_age(client) >= 0.0, what="a first snapshot")


def snapshot_age(client: TestClient) -> float:
    return metric(client.get("/metrics").text, "nmbatch_snapshot_age_seconds")


def test_stats_show_the_course_of_the_algorithm(client: TestClient) -> None:
    client.post("/samples", json={"vectors": POINTS * 20})
    centroids = wait_converged(client, 120)
    stats = client.get("/stats").json()
    assert stats["phase"] == "converged" and stats["converged"] is True
    assert (stats["b"], stats["N"], stats["n_logged"]) == (120, 120, 120)
    # The names of /centroids too, with the same numbers.
    assert (stats["batch_size"], stats["n_samples"]) == (120, 120)
    assert (centroids["batch_size"], centroids["n_samples"]) == (120, 120)
    assert stats["iteration"] == centroids["iteration"]
    assert stats["version"] == centroids["version"]
    # Initial batch max(32, B0_PER_CLUSTER * k) = 60 doubles to min(120, N) = 120.
    assert B0_PER_CLUSTER * 3 == 60
    assert [(e["from_b"], e["to_b"]) for e in stats["doublings"]] == [(60, 120)]
    assert [(e["from_size"], e["to_size"]) for e in stats["doublings"]] == [(60, 120)]
    assert all(e["at"].endswith("+00:00") for e in stats["doublings"])
    assert stats["energy"] == 0.25  # every point is 0.5 from its cluster mean
    assert stats["distances_computed"] > 0 and 0.0 <= stats["skipped_share"] <= 1.0


def test_openapi_documents_every_route_and_body(client: TestClient) -> None:
    assert client.get("/docs").status_code == 200
    spec = client.get("/openapi.json").json()
    assert {
        "/samples",
        "/centroids",
        "/assign",
        "/healthz",
        "/readyz",
        "/metrics",
        "/stats",
    } <= set(spec["paths"])
    body = spec["paths"]["/samples"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/x-npy", "application/octet-stream"} <= set(body)
    assert (
        "application/problem+json"
        in spec["paths"]["/samples"]["post"]["responses"]["422"]["content"]
    )


def test_unknown_route_and_method_are_problems(client: TestClient) -> None:
    missing = client.get("/nowhere")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["detail"] == "no resource at /nowhere"
    wrong = client.delete("/samples")
    assert wrong.status_code == 405 and wrong.json()["status"] == 405


def test_a_models_series_leave_with_it_and_are_not_made_again() -> None:
    from prometheus_client import generate_latest

    from nmbatch.service.metrics import MODEL_METRICS, ServiceMetrics

    metrics = ServiceMetrics()
    gone, kept = metrics.for_model("gone"), metrics.for_model("kept")
    for view in (gone, kept):
        view.iterations.inc()
        view.samples_rejected.labels("store-full").inc()
        view.snapshot_written()
    text = generate_latest(metrics.registry).decode()
    for name in MODEL_METRICS:  # every one of a model's metrics carries its name
        assert getattr(kept, name) is not getattr(metrics, name), name
    assert 'nmbatch_iterations_total{model="gone"} 1.0' in text
    assert 'nmbatch_samples_rejected_requests_total{model="kept",problem="store-full"} 1.0' in text
    metrics.remove_model("gone")
    # A request still in flight for the removed model counts where nothing is exported.
    gone.samples_rejected.labels("store-full").inc()
    gone.iterations.inc()
    text = generate_latest(metrics.registry).decode()
    assert 'model="gone"' not in text and 'model="kept"' in text
    assert 'nmbatch_redis_up{model="kept"} 1.0' in text
