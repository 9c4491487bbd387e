"""OpenTelemetry traces (NMBATCH_TRACING, service/tracing.py), caught with the SDK's
in-memory exporter: a span per request, a child of the caller's traceparent, with the
route's template, the model and the request id; the worker's steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from nmbatch.service import tracing
from nmbatch.service.embedded_redis import free_port
from nmbatch.service.main import create_app
from tests.service.test_server_process import wait_healthy
from tests.testkit import SettingsFactory, TestClient, wait_until

REPO = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
POINTS = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 20.0], [1.0, 20.0]]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans of this test's apps, in memory."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)
        provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_request_is_a_server_span_under_the_callers_trace(
    spans: InMemorySpanExporter, make_settings: SettingsFactory, model_name: str
) -> None:
    with TestClient(create_app(make_settings(tracing="console", k=3))) as client:
        answer = client.post(
            "/samples",
            json={"vectors": POINTS},
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-ID": "tr-1"},
        )
        assert answer.status_code == 202
        assert client.get("/models/absent/centroids").status_code == 404
        assert client.request("BREW", "/made/up").status_code in (404, 405)

        def converged() -> bool:
            doc = client.get("/centroids").json()
            return doc.get("converged") is True and doc.get("n_samples") == 6

        wait_until(converged, 60, "convergence")
        wait_until(lambda: named(spans, "nmbatch.worker.snapshot"), 30, "a snapshot span")

    (post,) = named(spans, "POST /samples")
    assert post.kind == SpanKind.SERVER
    assert format(post.context.trace_id, "032x") == TRACE_ID
    assert post.parent is not None and format(post.parent.span_id, "016x") == PARENT_ID
    assert post.attributes is not None
    assert dict(post.attributes) == {
        "http.request.method": "POST", "http.route": "/samples",
        "http.response.status_code": 202, "nmbatch.model": model_name,
        "nmbatch.request_id": "tr-1",
    }  # fmt: skip
    (absent,) = named(spans, "GET /models/{name}/centroids")
    assert absent.attributes is not None and absent.attributes["nmbatch.model"] == "absent"
    assert absent.parent is None and absent.status.status_code != StatusCode.ERROR
    # No made-up method or path becomes a span name (the metrics' closed label sets).
    assert named(spans, "other unmatched") and not any(
        "BREW" in s.name or "made" in s.name for s in spans.get_finished_spans()
    )
    # The worker's steps, each about its model (an earlier test's worker, still stopping,
    # may add spans about its own).
    for name in ("nmbatch.worker.pull", "nmbatch.worker.step", "nmbatch.worker.snapshot"):
        found = named(spans, name)
        assert all(s.attributes and "nmbatch.model" in s.attributes for s in found), name
        assert [s for s in found if s.attributes and s.attributes["nmbatch.model"] == model_name]


def test_without_tracing_no_span_is_made(
    spans: InMemorySpanExporter, make_settings: SettingsFactory
) -> None:
    tracing.use_provider(None)  # as the server process with NMBATCH_TRACING=off
    with TestClient(create_app(make_settings(k=3))) as client:
        assert client.post("/samples", json={"vectors": POINTS}).status_code == 202
        assert client.get("/healthz").status_code == 200
    assert spans.get_finished_spans() == ()


def test_tracing_without_the_sdk_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n.startswith("opentelemetry")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails
    with pytest.raises(tracing.TracingError, match=r"pip install 'nmbatch\[otel\]'"):
        tracing.install("otlp")


def test_the_server_prints_its_spans_with_tracing_console(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NMBATCH_", "OTEL_"))}
    env.update(
        PYTHONPATH=str(REPO), NMBATCH_PORT=str(port), NMBATCH_DATA_DIR=str(tmp_path / "data"),
        NMBATCH_K="3", NMBATCH_WORKER_THREADS="1", NMBATCH_TRACING="console",
        NMBATCH_LOG_LEVEL="warning",
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmbatch"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The console exporter writes each span as an indented JSON object.
    decoder, found, at = json.JSONDecoder(), [], 0
    while (start := out.find("{", at)) >= 0:
        document, at = decoder.raw_decode(out, start)
        found.append(document)
    health = [s for s in found if s.get("name") == "GET /healthz"]
    assert health and health[0]["kind"] == "SpanKind.SERVER"
    assert health[0]["resource"]["attributes"]["service.name"] == "nmbatch"


def test_a_json_log_line_inside_a_span_names_its_trace(spans: InMemorySpanExporter) -> None:
    import logging

    from nmbatch.service.logs import JsonFormatter

    record = logging.LogRecord("service", logging.INFO, __file__, 1, "inside", (), None)
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
    with tracing.span("nmbatch.worker.step", "m") as made:
        entry = json.loads(JsonFormatter().format(record))
    context = made.get_span_context()
    assert entry["trace_id"] == format(context.trace_id, "032x")
    assert entry["span_id"] == format(context.span_id, "016x")
