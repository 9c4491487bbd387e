"""schemathesis with all its checks against a running service with an API key.

Issue 34: ``st run --checks all`` (every check schemathesis has: no 5xx, documented
status codes, content types, headers and response schemas, schema-invalid requests
refused, schema-valid ones accepted, ``405`` with the right ``Allow`` for undocumented
methods, authentication not ignored, a deleted resource gone ...) through all its
phases (examples, coverage, fuzzing, stateful), against ``python -m nmbatch`` on the
session's Redis, with the key sent. The default model has its dimension
(``NMBATCH_DIM``, which the document states) and centroids before the run.

Schema-valid requests a service must still refuse with 422, because JSON Schema cannot
say why (the exceptions of :data:`CONFIG`, each documented in the operation's 422
answer): a named model's settings that contradict each other (``max_samples`` below
``k``, a window without a size, more memory than a model may take); binary bodies
(``.npy``, raw ``float32``) that are not whole finite rows; a vector of another length
than a named model's own dimension, or a query vector that is not comma-separated
numbers; a re-clustering or a sweep with a k the model's settings or samples cannot hold.

Bounded for CI: a few examples per operation, one worker, a fixed seed (about 30 s).
Key configurations are parametrised (:data:`KEYS`): one ``NMBATCH_API_KEY``, and scoped
keys (``NMBATCH_API_KEYS``) with reads keyed too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import wait_until

KEY = "schemathesis-key-0123456789"

#: ``(id, service settings, headers schemathesis sends)``: one entry per key configuration.
KEYS: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("one-key", {"api_key": KEY}, {"Authorization": f"Bearer {KEY}"}),
    # Scoped keys (NMBATCH_API_KEYS), reads keyed too: the run holds the admin key; the
    # others (a read key, a write key limited to other models) only have to exist.
    (
        "scoped-keys",
        {
            "api_keys": f"{KEY} admin; read-only-key-0123456789 read; "
            "tenant-writer-key-0123456 write tenant-*",
            "api_key_reads": "true",
        },
        {"Authorization": f"Bearer {KEY}"},
    ),
]

ACCEPTED_OR_UNPROVABLE = ["2xx", "3xx", "401", "403", "404", "409", "422", "429"]
CONFIG = f"""
# Schema-valid requests whose refusal JSON Schema cannot express (see the test's module).
[[operations]]
include-path-regex = "^(/models/\\\\{{name\\\\}})?/(samples|assign)$"
checks.positive_data_acceptance.expected-statuses = {ACCEPTED_OR_UNPROVABLE!r}

[[operations]]
include-path = "/models/{{name}}"
include-method = "PUT"
checks.positive_data_acceptance.expected-statuses = {ACCEPTED_OR_UNPROVABLE!r}

# A sweep with a k its samples cannot hold (k-refused).
[[operations]]
include-path-regex = "^(/models/\\\\{{name\\\\}})?/sweep$"
checks.positive_data_acceptance.expected-statuses = {ACCEPTED_OR_UNPROVABLE!r}

# Fuzzed in process by test_openapi_fuzz.py and tested in tests/service, not here yet:
# POST /samples/delete shares its path with GET and DELETE /samples/{{sample_id}} (a 405
# lists those methods in Allow), and GET /events is a stream that never ends.
[[operations]]
include-path-regex = "^(/models/\\\\{{name\\\\}})?/(samples/delete|events)$"
enabled = false

# A re-clustering restarts the model: its reads answer 503 centroids-pending (with
# Retry-After, documented) until the new k publishes, which the server-error check counts
# as a failure of whatever operation comes next. Tested in tests/service/test_recluster.py.
[[operations]]
include-path-regex = "^(/models/\\\\{{name\\\\}})?/recluster$"
enabled = false
"""
EXAMPLES = 10
DISABLED = 6  # /recluster, /samples/delete and /events, each with /models/{name} (CONFIG)
SEED = [[0.0, 0.0], [1.0, 1.0], [10.0, 10.0], [11.0, 11.0]]


@pytest.fixture(params=KEYS, ids=[k[0] for k in KEYS])
def keyed_service(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, model_name: str
) -> Iterator[tuple[ServiceProcess, dict[str, str]]]:
    _, settings, headers = request.param
    proc = ServiceProcess(
        tmp_path, "schemathesis", redis_url=redis_url, model=model_name, k=2, dim=2,
        max_body_bytes=256 * 1024, max_vectors=1000, worker_threads=1, **settings,
    ).start()  # fmt: skip
    try:
        proc.ready(60)
        with httpx.Client(base_url=proc.base, headers=headers, timeout=10) as http:
            assert http.post("/samples", json={"vectors": SEED}).status_code == 202
            wait_until(lambda: http.get("/centroids").status_code == 200, 30, "centroids")
        yield proc, headers
    finally:
        proc.close()


def test_every_check_of_schemathesis_passes(
    keyed_service: tuple[ServiceProcess, dict[str, str]], tmp_path: Path
) -> None:
    proc, headers = keyed_service
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        str(Path(sys.executable).with_name("st")),
        "--config-file", str(config),
        "run", f"{proc.base}/openapi.json",
        "--checks", "all",
        "--max-examples", str(EXAMPLES),
        "--seed", "1",
        "--workers", "1",
        "--request-timeout", "20",
        "--no-color",
    ]  # fmt: skip
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    run = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-3000:]
    # It ran: every operation but the two /recluster ones CONFIG disables, and each phase.
    selected = re.search(r"Operations: +(\d+) selected / (\d+) total", run.stdout)
    assert selected and int(selected[2]) - int(selected[1]) == DISABLED, run.stdout
    assert f"Tested: {selected[1]}" in run.stdout, run.stdout
    for phase in ("Examples", "Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in run.stdout or f"✅  {phase}" in run.stdout, run.stdout
