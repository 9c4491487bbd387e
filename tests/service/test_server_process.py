"""``python -m nmbatch`` as users run it: embedded Redis, real socket, SIGTERM, restart."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import ANY

import httpx
import numpy as np
import pytest

from nmbatch.service.embedded_redis import free_port, running_redis_pid
from tests.testkit import stop_process, wait_until

REPO = Path(__file__).resolve().parents[2]


def start_service(data_dir: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
    env.update(
        PYTHONPATH=str(REPO),
        NMBATCH_PORT=str(port),
        NMBATCH_DATA_DIR=str(data_dir),
        NMBATCH_K="3",
        NMBATCH_BATCH_SIZE="16",
        NMBATCH_WORKER_THREADS="1",
        NMBATCH_LOG_LEVEL="warning",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "nmbatch"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_healthy(proc: subprocess.Popen[str], base: str) -> None:
    def healthy() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"service exited with {proc.returncode}: {proc.stderr.read()[-3000:]}")
        try:
            return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, timeout=60, what="the service to be ready")


@pytest.fixture
def service_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    port, data_dir = free_port(), tmp_path / "data"
    proc = start_service(data_dir, port)
    try:
        yield proc, f"http://127.0.0.1:{port}", data_dir
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_python_m_service_runs_stops_cleanly_and_keeps_its_data(
    service_process: tuple[subprocess.Popen[str], str, Path],
) -> None:
    proc, base, data_dir = service_process
    wait_healthy(proc, base)
    redis_pid = running_redis_pid(data_dir / "redis.pid")
    assert redis_pid is not None, "the embedded redis-server is not running"

    points = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [0.0, 20.0], [1.0, 20.0]]
    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.post("/samples", json={"vectors": points[:3]}).status_code == 202
        npy = io.BytesIO()
        np.save(npy, np.array(points[3:]))
        response = http.post(
            "/samples", content=npy.getvalue(), headers={"content-type": "application/x-npy"}
        )
        assert response.json() == {"accepted": 3, "n_samples": 6, "ids": ANY}

        def converged() -> dict | None:
            doc = http.get("/centroids").json()
            return doc if doc.get("converged") and doc.get("n_samples") == 6 else None

        version = wait_until(converged, what="convergence")["version"]
        assert http.get("/assign", params={"vector": "9.5,0.5"}).json()["distance"] < 1.0
        # The server process froze its heap once started (the modules, the app and the
        # loaded kernels: ~170,000 objects): the collector's full scans stay short.
        metrics = http.get("/metrics").text
        frozen = [line for line in metrics.splitlines() if line.startswith("nmbatch_gc_frozen")]
        assert frozen and float(frozen[0].split()[-1]) > 50_000, frozen

    assert stop_process(proc, fail_on_kill=True) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(redis_pid, 0)
    assert not (data_dir / "redis.pid").exists()

    # A new process on the same data folder has everything back.
    port = free_port()
    again = start_service(data_dir, port)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(again, base)
        doc = httpx.get(f"{base}/centroids", timeout=10).json()
        assert doc["n_samples"] == 6 and doc["version"] >= version
    finally:
        assert stop_process(again, fail_on_kill=True) == 0


def test_a_contradicting_setting_stops_start_up_with_a_message(tmp_path: Path) -> None:
    port, data_dir = free_port(), tmp_path / "data"
    first = start_service(data_dir, port)
    wait_healthy(first, f"http://127.0.0.1:{port}")
    httpx.post(f"http://127.0.0.1:{port}/samples", json={"vectors": [[1.0, 2.0]]}, timeout=10)
    assert stop_process(first, fail_on_kill=True) == 0

    env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
    env.update(PYTHONPATH=str(REPO), NMBATCH_PORT=str(free_port()), NMBATCH_DATA_DIR=str(data_dir))
    env.update(NMBATCH_K="5")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "service"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "NMBATCH_K=5" in result.stderr and "k=3" in result.stderr
    assert time.monotonic() - started < 60
    assert running_redis_pid(data_dir / "redis.pid") is None
