"""The client's own distribution (``client/``, ``nmbatch-client``) in a venv that has
nothing else: installed offline from the wheels ``make`` keeps in ``.venv/wheelhouse``
(its dependencies and its build backend), it imports no numba, FastAPI, pydantic, Redis
client or pyarrow, and pushes, waits and assigns against a real service process."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from nmbatch.service.embedded_redis import EmbeddedRedis
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import blobs, logged_samples

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE = Path(sys.prefix) / "wheelhouse"
"""Wheels of the client's dependencies and of setuptools (the Makefile's dev set-up)."""

SCRIPT = """
import importlib.util, json, sys
import numpy as np
absent = ["numba", "fastapi", "starlette", "uvicorn", "pydantic", "redis", "sklearn",
          "tenacity", "orjson", "pyarrow", "nmbatch"]
found = [name for name in absent if importlib.util.find_spec(name) is not None]
from nmbatch_client import Client, WrongDimensionError
X = np.load(sys.argv[2])
with Client(sys.argv[1], model=sys.argv[3], max_vectors=64) as client:
    pushed = client.push(X[i : i + 100] for i in range(0, len(X), 100))
    model = client.wait_for(converged=True, min_samples=len(X), timeout=120)
    labels = client.assign(X).labels
    try:
        client.push(np.zeros((1, 5)))
        refused = None
    except WrongDimensionError as exc:
        refused = exc.slug
print(json.dumps({"found": found, "accepted": pushed.accepted, "requests": pushed.requests,
                  "k": int(model.centroids.shape[0]), "labels": labels.tolist(),
                  "refused": refused}))
"""


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command in ``cwd`` (not the checkout, whose folders would be importable)."""
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_the_client_alone_in_a_bare_venv(
    tmp_path: Path, redis_server: EmbeddedRedis
) -> None:
    if not any(WHEELHOUSE.glob("httpx-*.whl")):
        pytest.fail(f"no wheels in {WHEELHOUSE}: run `make .venv/.installed-dev` (the dev set-up)")
    venv = tmp_path / "slim"
    made = _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(python, "-m", "pip", "install", "--no-index", "--find-links", WHEELHOUSE,
                     "-q", REPO / "client", cwd=tmp_path)  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    names = _run(python, "-m", "pip", "list", "--format", "json", cwd=tmp_path)
    packages = {p["name"].lower() for p in json.loads(names.stdout)}
    assert "nmbatch-client" in packages and "numpy" in packages and "httpx" in packages
    assert not packages & {"numba", "fastapi", "pydantic", "redis", "nmbatch", "pyarrow"}

    model = f"slim-{uuid.uuid4().hex[:8]}"
    proc = ServiceProcess(tmp_path, model, redis_url=redis_server.url, model=model, k=3,
                          batch_size=64, worker_threads=1, snapshot_seconds=0.2,
                          poll_seconds=0.05).start()  # fmt: skip
    try:
        proc.ready(60)
        X = blobs(300, 2, 3, seed=5, separation=20.0)
        np.save(tmp_path / "x.npy", X)
        ran = _run(python, "-c", SCRIPT, proc.base, tmp_path / "x.npy", model, cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        out = json.loads(ran.stdout)
        assert out["found"] == []
        assert (out["accepted"], out["requests"], out["k"]) == (300, 6, 3)
        assert sorted(set(out["labels"])) == [0, 1, 2] and len(out["labels"]) == 300
        assert out["refused"] == "wrong-dimension"
        with redis.Redis.from_url(redis_server.url) as client:
            np.testing.assert_array_equal(logged_samples(client, model), X)

        # Its console script: a CSV file goes; a Parquet file needs the arrow extra.
        np.savetxt(tmp_path / "x.csv", X[:10], delimiter=",", header="a,b", comments="")
        pushed = _run(venv / "bin" / "nmbatch-client", "push", tmp_path / "x.csv",
                      "--url", proc.base, "-q", cwd=tmp_path)  # fmt: skip
        assert pushed.returncode == 0, pushed.stderr
        assert pushed.stdout.startswith("pushed 10 vectors (10 x 2) in 1 request(s)")
        pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1]}), tmp_path / "x.parquet")
        parquet = _run(venv / "bin" / "nmbatch-client", "push", tmp_path / "x.parquet",
                       "--url", proc.base, cwd=tmp_path)  # fmt: skip
        assert parquet.returncode == 2
        assert "pip install 'nmbatch-client[arrow]'" in parquet.stderr
    finally:
        proc.close()
