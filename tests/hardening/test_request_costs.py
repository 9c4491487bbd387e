"""No request may cost more than it carries (issue 34, items 1 and 3), against a real
``python -m nmbatch`` process on the test redis-server:

- thousands of requests with made-up methods and paths add no metric series, and the
  server's resident memory stays flat;
- hostile JSON bodies (one long string among many short ones, deep nesting, huge
  exponents, nulls, many empty vectors ...) are 4xx problems naming the fault, and the
  server's resident peak (``VmHWM``) grows by a small multiple of the body at most.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hardening_helpers import service_process, status_kib

from nmbatch.service.parsing import parse_vectors
from nmbatch.service.problems import ProblemError
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import PROBLEM, wait_until

MAX_BODY = 1024 * 1024
BODY = 512 * 1024  # the size of every hostile body below


@pytest.fixture
def server(tmp_path: Path, redis_url: str, model_name: str) -> Iterator[ServiceProcess]:
    """A service process with one sample (k = 1: centroids, so /assign answers)."""
    with service_process(
        tmp_path, redis_url=redis_url, model=model_name, k=1, worker_threads=1, seed=0,
        batch_size=32, snapshot_seconds=0.2, poll_seconds=0.05, worker_process="false",
        max_body_bytes=MAX_BODY, max_vectors=200_000, access_log="false",
    ) as proc:  # fmt: skip
        answer = httpx.post(f"{proc.base}/samples", json={"vectors": [[1.0, 2.0]]}, timeout=60)
        assert answer.status_code == 202
        wait_until(lambda: proc.get("/centroids").status_code == 200, 60, "centroids")
        yield proc


def request_series(metrics_text: str) -> list[str]:
    return [
        line.split(" ", 1)[0]
        for line in metrics_text.splitlines()
        if line.startswith("nmbatch_request_seconds_count{")
    ]


# -- item 1: closed label sets ---------------------------------------------------------------
def test_made_up_methods_and_paths_add_no_series(server: ServiceProcess) -> None:
    assert server.proc is not None
    pid = server.proc.pid

    def hammer(start: int, count: int) -> None:
        with httpx.Client(base_url=server.base, timeout=10) as client:
            for i in range(start, start + count):
                method = f"M{i:06d}X"  # a valid token h11 and uvicorn accept
                for path in (f"/made/up/{i}", "/assign", f"/models/m{i}/samples"):
                    client.request(method, path)

    hammer(0, 300)  # warm up: every route and code path has been seen
    rss_before = status_kib(pid)
    hammer(300, 3000)  # 9,000 requests, 3,000 new methods, 6,000 new paths
    rss_after = status_kib(pid)
    text = server.get("/metrics").text
    series = request_series(text)
    assert len(series) <= 12, series
    assert "M0" not in text and "made/up" not in text and "/models/m1" not in text
    assert {s.split('method="', 1)[1].split('"', 1)[0] for s in series} <= {"other", "GET", "POST"}
    # Each new series of the histogram costs a few KiB: 3,000 of them would be megabytes.
    assert rss_after - rss_before < 4 * 1024, (rss_before, rss_after)
    # The dashboard's data reads the same histogram: it stays small too.
    assert len(server.get("/dashboard/data").content) < 64 * 1024


# -- item 3: the parse is bounded by the body -------------------------------------------------
def fill(prefix: bytes, unit: bytes, suffix: bytes, size: int = BODY) -> bytes:
    return prefix + unit * ((size - len(prefix) - len(suffix)) // len(unit)) + suffix


LONG_AND_SHORT = b'{"vectors": [["' + b"x" * 2000 + b'"' + b',"a"' * ((BODY - 2000) // 4) + b"]]}"
NEST = 1000
HOSTILE = [
    # (case, body, status, slug); the model has dimension 2.
    ("one long string, many short ones", LONG_AND_SHORT, 422, "non-numeric"),
    ("a few strings, one long", b'{"vectors": [[1, "' + b"y" * (BODY - 40) + b'", "b"]]}', 422,
     "non-numeric"),
    ("many empty objects", fill(b'{"vectors": [[', b"{},", b"1]]}"), 422, "not-a-matrix"),
    ("nulls", fill(b'{"vectors": [[', b"null,", b"1]]}"), 422, "non-numeric"),
    ("true/false", fill(b'{"vectors": [[', b"true,", b"1]]}"), 422, "non-numeric"),
    ("huge exponents", fill(b'{"vectors": [[', b"1e99999999,", b"1]]}"), 422, "non-finite"),
    ("float32 overflow after many ints", fill(b'{"vectors": [[', b"257,", b"1e99]]}"), 422,
     "wrong-dimension"),
    ("many empty vectors", fill(b'{"vectors": [', b"[],", b"[]]}"), 422, "empty"),
    ("deep nesting", b'{"vectors": ' + b"[" * NEST + b"1" + b"]" * NEST + b"}", 422,
     "not-a-matrix"),
    ("ragged", fill(b'{"vectors": [', b"[1,2],", b"[1]]}"), 422, "not-a-matrix"),
]  # fmt: skip


@pytest.mark.parametrize("path", ["/assign", "/samples"])
def test_hostile_json_bodies_cost_a_bounded_multiple_of_their_size(
    server: ServiceProcess, path: str
) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    peak_before = status_kib(pid, "VmHWM")
    json_body = {"content-type": "application/json"}
    with httpx.Client(base_url=server.base, timeout=60) as client:
        for _ in range(3):  # a bound per request, not a slow leak: repeat each
            for case, body, status, slug in HOSTILE:
                answer = client.post(path, content=body, headers=json_body)
                assert answer.status_code == status, (case, answer.text[:300])
                assert answer.headers["content-type"] == PROBLEM
                assert json.loads(answer.content)["type"] == f"urn:nmbatch:problem:{slug}", case
        # Nothing stored, the server still serves.
        assert client.get("/stats").json()["n_samples"] == 1
    grown = status_kib(pid, "VmHWM") - peak_before
    # docs/operations/limits.md: a parse takes at most 40 bytes per body byte (+ 1 MiB);
    # the margin is for the thread pool's own malloc arenas and first-use code. Before
    # the types were checked first, the first body alone made numpy allocate 1 GB.
    assert grown * 1024 < 48 * BODY + (8 << 20), f"resident peak grew by {grown} KiB"


def test_one_long_string_among_many_short_ones_allocates_no_string_array(
    server: ServiceProcess,
) -> None:
    """The issue's recipe: numpy would make a ``<U2000`` array of 131,000 strings
    (1 GB) from this 512 KiB body before refusing it."""
    assert server.proc is not None
    peak_before = status_kib(server.proc.pid, "VmHWM")
    for path in ("/assign", "/samples"):
        answer = httpx.post(
            server.base + path,
            content=LONG_AND_SHORT,
            headers={"content-type": "application/json"},
            timeout=120,
        )
        assert answer.status_code == 422 and answer.json()["type"].endswith(":non-numeric")
    grown = status_kib(server.proc.pid, "VmHWM") - peak_before
    assert grown * 1024 < 48 * BODY + (8 << 20), f"resident peak grew by {grown} KiB"


def test_the_common_json_body_is_parsed_without_a_scan_holding_the_gil() -> None:
    # The byte counts that bound the orjson path's memory hold the GIL (about 1 ms per
    # MB each, the event loop waits meanwhile); the common form, read by the GIL-free
    # kernel, needs none of them. Another body still takes them.
    scans: list[bytes] = []

    class Spied(bytes):
        def count(self, sub: object, *args: object) -> int:  # type: ignore[override]
            scans.append(sub)  # type: ignore[arg-type]
            return super().count(sub, *args)  # type: ignore[arg-type]

    body = Spied(json.dumps({"vectors": [[0.5, 1.25, -3.0]] * 200}).encode())
    X = parse_vectors(body, "application/json", dim=3, max_vectors=1000)
    assert X.shape == (200, 3) and scans == []
    with pytest.raises(ProblemError):
        parse_vectors(Spied(b'{"vectors": [["a", 1.0]]}'), "application/json", dim=2,
                      max_vectors=1000)  # fmt: skip
    assert scans  # the orjson path counts before it decodes
