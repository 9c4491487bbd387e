"""Log lines: NMBATCH_LOG_FORMAT=json (one JSON object per line, with the request id and
the model), X-Request-ID, and the .env file the server reads."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nmbatch.service.embedded_redis import free_port
from nmbatch.service.logs import (
    MODEL,
    REQUEST_ID,
    JsonFormatter,
    RequestContext,
    about_model,
    request_id_of,
)
from nmbatch.service.main import create_app
from tests.service.test_server_process import wait_healthy
from tests.testkit import SettingsFactory, TestClient, stop_process

REPO = Path(__file__).resolve().parents[2]


def _record(message: str, *args: object, name: str = "service") -> logging.LogRecord:
    return logging.LogRecord(name, logging.INFO, __file__, 1, message, args, None)


def test_a_json_line_holds_the_request_id_and_the_model() -> None:
    formatter = JsonFormatter()
    line = formatter.format(_record("plain %s", "text"))
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["message"] == "plain text" and entry["level"] == "INFO"
    assert entry["request_id"] is None and entry["model"] is None
    assert entry["time"].endswith("Z") and entry["logger"] == "service"
    token = REQUEST_ID.set("r-1")
    try:
        with about_model("tenant-a"):
            entry = json.loads(formatter.format(_record("x")))
        assert (entry["request_id"], entry["model"]) == ("r-1", "tenant-a")
        assert MODEL.get() is None  # back to what it was
    finally:
        REQUEST_ID.reset(token)


def test_an_access_line_has_its_fields_and_an_exception_its_traceback() -> None:
    formatter = JsonFormatter()
    access = _record('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/assign?vector=1", "1.1",
                     200, name="uvicorn.access")  # fmt: skip
    entry = json.loads(formatter.format(access))
    assert entry["message"] == '127.0.0.1:5 - "GET /assign?vector=1 HTTP/1.1" 200'
    assert (entry["method"], entry["path"], entry["status"]) == ("GET", "/assign?vector=1", 200)
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("service", logging.ERROR, __file__, 1, "failed", (),
                                   sys.exc_info())  # fmt: skip
    line = formatter.format(record)
    assert "\n" not in line
    assert "ValueError: boom\nsecond line" in json.loads(line)["exception"]


def test_a_request_id_is_the_clients_token_or_a_new_one() -> None:
    assert request_id_of([(b"x-request-id", b"abc-1.2:3_x")]) == "abc-1.2:3_x"
    for bad in (b"", b"a b", b'"quoted"', b"x" * 129, b"caf\xc3\xa9"):
        new = request_id_of([(b"x-request-id", bad)])
        assert len(new) == 32 and int(new, 16) >= 0
    assert request_id_of([]) != request_id_of([])


def test_the_model_of_a_path() -> None:
    context = RequestContext(None, "main", frozenset({"samples", "assign"}))  # type: ignore[arg-type]
    assert context.model_of("/samples") == "main"
    assert context.model_of("/assign") == "main"
    assert context.model_of("/models/tenant-a/samples") == "tenant-a"
    assert context.model_of("/models/tenant-a") == "tenant-a"
    for path in ("/models", "/models/", "/healthz", "/metrics", "/", ""):
        assert context.model_of(path) is None, path


def test_every_answer_carries_its_request_id(make_settings: SettingsFactory) -> None:
    with TestClient(create_app(make_settings(k=2))) as client:
        given = client.get("/healthz", headers={"X-Request-ID": "trace-42"})
        assert given.headers["x-request-id"] == "trace-42"
        made = client.post("/samples", json={"vectors": [[1.0, 2.0]]})
        assert made.status_code == 202 and len(made.headers["x-request-id"]) == 32
        refused = client.post("/samples", json={"vectors": "no"}, headers={"X-Request-ID": "a b"})
        assert refused.status_code == 422 and refused.headers["x-request-id"] != "a b"
        assert len(refused.headers.get_list("x-request-id")) == 1


def test_the_server_logs_json_lines_and_reads_its_dotenv(tmp_path: Path) -> None:
    """A real `python -m nmbatch`: settings from a .env file under the environment's own;
    every line on stderr is a JSON object; a request's lines name its id and model."""
    port = free_port()
    (tmp_path / ".env").write_text(
        "# settings of this folder's server\n"
        "NMBATCH_LOG_FORMAT=json\n"
        "NMBATCH_MODEL=from-dotenv\n"
        "NMBATCH_K=3\n"
        "NMBATCH_PORT=1\n"  # the environment's NMBATCH_PORT wins
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
    env.update(
        PYTHONPATH=str(REPO),
        NMBATCH_PORT=str(port),
        NMBATCH_DATA_DIR=str(tmp_path / "data"),
        NMBATCH_BATCH_SIZE="16",
        NMBATCH_WORKER_THREADS="1",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmbatch"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base)
        with httpx.Client(base_url=base, timeout=10) as http:
            posted = http.post("/samples", json={"vectors": [[0.0, 1.0]] * 4},
                               headers={"X-Request-ID": "push-1"})  # fmt: skip
            assert posted.status_code == 202 and posted.headers["x-request-id"] == "push-1"
            created = http.put("/models/tenant-a", json={"k": 2, "dim": 2},
                               headers={"X-Request-ID": "create-1"})  # fmt: skip
            assert created.status_code == 201, created.text
            assert http.get("/centroids").json()["k"] == 3  # NMBATCH_K of the .env file
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
    finally:
        stop_process(proc)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line parses
    assert all({"time", "level", "logger", "message", "request_id", "model"} <= set(e)
               for e in entries)  # fmt: skip
    by_id = {e["request_id"]: e for e in entries if e["logger"] == "uvicorn.access"}
    assert by_id["push-1"]["model"] == "from-dotenv"
    assert (by_id["push-1"]["method"], by_id["push-1"]["path"]) == ("POST", "/samples")
    assert by_id["push-1"]["status"] == 202
    assert by_id["create-1"]["model"] == "tenant-a" and by_id["create-1"]["status"] == 201
    started = [e for e in entries if "model 'tenant-a' started" in e["message"]]
    assert started and started[0]["request_id"] == "create-1"
    # The default model's start-up and its worker thread's lines name it too.
    assert any(e["model"] == "from-dotenv" and e["request_id"] is None for e in entries)
    assert any(e["message"].startswith("Uvicorn running") for e in entries)


@pytest.mark.parametrize("value", ["yaml", ""])
def test_an_unknown_log_format_is_refused(
    make_settings: SettingsFactory, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value:
        with pytest.raises(ValueError, match="log_format"):
            make_settings(log_format=value)
    else:
        monkeypatch.setenv("NMBATCH_LOG_FORMAT", value)  # empty: unset, the default
        assert make_settings().log_format == "text"
