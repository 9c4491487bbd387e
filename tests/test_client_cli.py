"""``nmbatch push`` and ``nmbatch watch`` as users run them, against a real service process."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis

from nmbatch.service.embedded_redis import EmbeddedRedis, free_port
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import blobs, logged_samples

REPO = Path(__file__).resolve().parents[1]
KEY = "cli-test-key-0123456789"
Served = tuple[ServiceProcess, str]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m nmbatch.cli ARGS`` with no ``NMBATCH_*`` variable but those of ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
    clean.update(PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "nmbatch.cli", *args],
        cwd=REPO,
        env=clean,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def serve(tmp_path: Path, redis_server: EmbeddedRedis) -> Iterator[Callable[..., Served]]:
    """``serve(**settings)``: a ready service process on a fresh model; (process, model)."""
    procs: list[ServiceProcess] = []

    def start(**settings: Any) -> Served:
        model = f"cli-{uuid.uuid4().hex[:10]}"
        values: dict[str, Any] = dict(
            redis_url=redis_server.url, model=model, k=3, batch_size=64, worker_threads=1
        )
        values.update(settings)
        proc = ServiceProcess(tmp_path, model, **values).start()
        procs.append(proc)
        proc.ready(60)
        return proc, model

    try:
        yield start
    finally:
        for proc in procs:
            proc.close()


@pytest.fixture
def redis_log(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        client.close()


def test_push_npy_in_chunks_then_wait_then_watch(
    serve: Callable[..., Served], redis_log: redis.Redis, tmp_path: Path
) -> None:
    proc, model = serve()
    X = blobs(600, 3, 3, seed=1, separation=20.0)
    np.save(tmp_path / "x.npy", X)
    pushed = run_cli(
        "push", str(tmp_path / "x.npy"), "--url", proc.base, "--max-vectors", "200", "--wait"
    )
    assert pushed.returncode == 0, pushed.stderr
    lines = pushed.stdout.splitlines()
    assert lines[0] == (
        "pushed 600 vectors (600 x 3) in 3 request(s), 0 replayed, 0 retried; "
        "the model holds 600 samples"
    )
    assert lines[1].startswith("converged: version ") and "N=600" in lines[1]
    np.testing.assert_array_equal(logged_samples(redis_log, model), X)

    watched = run_cli("watch", "--url", proc.base, "--count", "2", "--interval", "0.2")
    assert watched.returncode == 0, watched.stderr
    header, *rows = watched.stdout.splitlines()
    assert header.split()[:4] == ["time", "version", "new", "N"]
    assert len(rows) == 2
    version = int(lines[1].split()[2].rstrip(","))
    for row in rows:
        fields = row.split()
        assert int(fields[1]) >= version and fields[3] == "600"
        assert "converged" in fields
    assert rows[1].split()[2] == "+0"  # converged: no new version between the two lines


def test_push_csv_with_a_header_line(
    serve: Callable[..., Served], redis_log: redis.Redis, tmp_path: Path
) -> None:
    proc, model = serve()
    X = np.rint(blobs(50, 4, 3, seed=2) * 100) / 100
    path = tmp_path / "x.csv"
    np.savetxt(path, X, delimiter=",", header="a,b,c,d", comments="", fmt="%.2f")
    pushed = run_cli("push", str(path), "--url", proc.base, "-q")
    assert pushed.returncode == 0, pushed.stderr
    assert pushed.stdout.startswith("pushed 50 vectors (50 x 4) in 1 request(s)")
    np.testing.assert_array_equal(logged_samples(redis_log, model), X.astype(np.float32))


def test_push_and_watch_a_named_model(
    serve: Callable[..., Served], redis_log: redis.Redis, tmp_path: Path
) -> None:
    proc, default = serve()
    name = f"cli-{uuid.uuid4().hex[:10]}"
    X = blobs(300, 3, 3, seed=4, separation=20.0)
    np.save(tmp_path / "x.npy", X)
    with httpx.Client(base_url=proc.base, timeout=30) as http:
        spec = {"k": 3, "dim": 3, "batch_size": 64, "seed": 0}
        assert http.put(f"/models/{name}", json=spec).status_code == 201
        try:
            pushed = run_cli(
                "push", str(tmp_path / "x.npy"), "--url", proc.base, "--model", name, "--wait"
            )
            assert pushed.returncode == 0, pushed.stderr
            assert "the model holds 300 samples" in pushed.stdout
            np.testing.assert_array_equal(logged_samples(redis_log, name), X)
            assert logged_samples(redis_log, default).shape[0] == 0
            watched = run_cli("watch", "--url", proc.base, "--model", name, "--once")
            assert watched.returncode == 0, watched.stderr
            assert watched.stdout.splitlines()[1].split()[3] == "300"
            unknown = run_cli("watch", "--url", proc.base, "--model", "no-such-model", "--once")
            assert unknown.returncode == 1
            assert "no model named 'no-such-model'" in unknown.stdout + unknown.stderr
        finally:  # the session's Redis is shared: later services would start the model
            http.delete(f"/models/{name}", params={"confirm": name})


def test_push_refused_says_why_and_how_to_finish(
    serve: Callable[..., Served], tmp_path: Path
) -> None:
    proc, _ = serve(api_key=KEY)
    np.save(tmp_path / "three.npy", np.ones((5, 3), dtype=np.float32))
    np.save(tmp_path / "five.npy", np.ones((5, 5), dtype=np.float32))

    anonymous = run_cli("push", str(tmp_path / "three.npy"), "--url", proc.base)
    assert anonymous.returncode == 1
    assert "401 Unauthorized" in anonymous.stderr

    with_key = {"NMBATCH_API_KEY": KEY, "NMBATCH_URL": proc.base}
    assert run_cli("push", str(tmp_path / "three.npy"), env=with_key).returncode == 0
    wrong = run_cli("push", str(tmp_path / "five.npy"), "--idempotency-key", "f5", env=with_key)
    assert wrong.returncode == 1
    assert "422 Unprocessable Entity: vectors have 5 coordinates" in wrong.stderr
    assert f"nmbatch push {tmp_path / 'five.npy'} --idempotency-key f5" in wrong.stderr

    missing = run_cli("push", str(tmp_path / "none.npy"), env=with_key)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_watch_once_without_a_service_exits_1() -> None:
    result = run_cli("watch", "--url", f"http://127.0.0.1:{free_port()}", "--once")
    assert result.returncode == 1
    header, line = result.stdout.splitlines()
    assert header.startswith("time")
    assert "unavailable: GET /stats: no answer" in line


def test_push_a_parquet_column_of_vectors_and_an_iterator_of_arrays(
    serve: Callable[..., Served], redis_log: redis.Redis, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nmbatch import Client

    proc, model = serve()
    X = blobs(300, 3, 3, seed=3)
    column = pa.FixedSizeListArray.from_arrays(pa.array(X.ravel(), pa.float32()), 3)
    pq.write_table(pa.table({"id": np.arange(300), "embedding": column}),
                   tmp_path / "x.parquet", row_group_size=100)  # fmt: skip
    pushed = run_cli("push", str(tmp_path / "x.parquet"), "--url", proc.base, "--column",
                     "embedding", "--batch-rows", "64", "--max-vectors", "50", "-q")  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    # Batches of 64 rows within each row group of 100 (64 + 36), sent 50 rows at most.
    assert pushed.stdout.startswith("pushed 300 vectors (300 x 3) in 9 request(s)")
    np.testing.assert_array_equal(logged_samples(redis_log, model), X)
    # A column that is not there: exit status 2, nothing sent.
    missing = run_cli("push", str(tmp_path / "x.parquet"), "--url", proc.base, "--column", "v")
    assert missing.returncode == 2 and "no column 'v'" in missing.stderr
    # Any iterator of arrays, through the library.
    with Client(proc.base) as client:
        result = client.push(X[i : i + 40] for i in range(0, 300, 40))
    assert (result.accepted, result.n_samples, result.requests) == (300, 600, 8)
    np.testing.assert_array_equal(logged_samples(redis_log, model), np.concatenate([X, X]))
