"""The load benchmark's parts that need no server (benchmarks/loadtest): request bytes, the
HTTP/1.1 client against a local socket server, /proc probes, statistics, targets, options."""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path

import numpy as np
import orjson
import pytest

from benchmarks.loadtest import client, probes, summary
from benchmarks.loadtest.cli import build_parser
from benchmarks.loadtest.phases import phase_specs
from benchmarks.loadtest.report import markdown

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "bench" / "load"


def test_the_bodies_decode_to_the_same_float32_vectors() -> None:
    X = client.synthetic(5, 3, seed=1)
    assert X.shape == (5, 3) and X.dtype == np.float32
    npy = np.load(io.BytesIO(client.encode_body("npy", X)), allow_pickle=False)
    octet = np.frombuffer(client.encode_body("octet", X), dtype="<f4").reshape(5, 3)
    vectors = np.asarray(orjson.loads(client.encode_body("json", X))["vectors"], np.float32)
    for decoded in (npy, octet, vectors):
        np.testing.assert_array_equal(decoded, X)


def test_a_request_has_its_headers_and_a_length_when_it_posts() -> None:
    raw = client.http_request("POST", "/samples", b"abc", {"Content-Type": "application/x-npy"})
    assert raw == (
        b"POST /samples HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-npy\r\n"
        b"Content-Length: 3\r\n\r\nabc"
    )
    get = client.http_request("GET", "/healthz")
    assert get == b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    assign = client.assign_requests(dim=4, seed=0)
    assert len(set(assign)) == len(assign) > 1
    vector = assign[0].split(b" ")[1].split(b"=")[1]
    assert len(vector.split(b",")) == 4


def test_the_client_reads_sized_chunked_and_empty_bodies_on_one_connection() -> None:
    answers = [
        b"HTTP/1.1 202 Accepted\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
        b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 2\r\n\r\nno",
    ]
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        for answer in answers:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        writer.close()

    async def run() -> list[tuple[int, bytes]]:
        server = await asyncio.start_server(serve, client.HOST, 0)
        port = server.sockets[0].getsockname()[1]
        conn = client.Connection(port)
        got = [await conn.request(client.http_request("GET", "/x")) for _ in answers]
        conn.close()
        server.close()
        await server.wait_closed()
        return got

    got = asyncio.run(run())
    assert got == [(202, b"hello"), (200, b"abcde"), (304, b""), (422, b"no")]
    assert connections == 1


def test_the_proc_probes_read_this_process_and_the_machine() -> None:
    pid = os.getpid()
    assert probes.rss_bytes(pid) > 1 << 20
    assert probes.cpu_seconds(pid) > 0
    assert probes.cpu_seconds(pid, children=True) >= probes.cpu_seconds(pid)
    assert probes.machine_busy_seconds() > 0
    assert probes.rss_bytes(None) is None and probes.cpu_seconds(None) is None
    assert probes.rss_bytes(2**22 + 1) is None  # above Linux's largest pid
    info = probes.machine()
    assert info["cores"] >= 1 and info["versions"]["numpy"] == np.__version__


def _report(ends: list[float], latencies: list[float], vectors: list[int]) -> dict:
    return {
        "ends": np.asarray(ends),
        "latencies": np.asarray(latencies),
        "vectors": np.asarray(vectors, dtype=np.int64),
        "errors": ["e1"],
        "cpu_seconds": 0.5,
    }


def test_only_requests_completed_inside_the_window_count() -> None:
    reports = [
        _report([9.5, 10.2, 10.7, 11.9], [0.1, 0.2, 0.3, 0.4], [100, 100, 100, 100]),
        _report([12.5], [0.9], [100]),  # after the deadline
    ]
    out = summary._requests_summary(reports, start=10.0, deadline=12.0)
    assert out["requests"] == 3 and out["vectors"] == 300
    assert out["vectors_per_second"] == 150.0 and out["requests_per_second"] == 1.5
    assert out["per_second"] == [200.0, 100.0]
    assert out["latency_ms"]["max"] == pytest.approx(400.0)
    assert out["latency_ms"]["median"] == pytest.approx(300.0)
    assert out["errors"] == 2 and out["client_cpu_seconds"] == 1.0
    assert summary._distribution(np.zeros(0)) == dict.fromkeys(
        ("median", "p90", "p99", "p999", "max")
    )


def test_memory_growth_is_explained_only_within_the_slack() -> None:
    args = build_parser().parse_args(["--out", "x", "--dim", "8", "--k", "4"])
    first = {"n_logged": 0, "server_rss": 1 << 30, "redis_rss": 1 << 28}
    vectors = 1_000_000
    server_expected = vectors * (4 * 8 + 8) + vectors * (4 * 4 + 24)
    last = dict(first, n_logged=vectors, redis_rss=(1 << 28) + vectors * 4 * 8)
    last["server_rss"] = (1 << 30) + server_expected
    ok = summary.memory_check(first, last, args, {"b": vectors})
    assert ok["explained"] and ok["server"]["expected_from_data"] == server_expected
    assert ok["server"]["ratio"] == 1.0 and ok["redis"]["ratio"] == 1.0
    last["server_rss"] = (1 << 30) + int(server_expected * 1.15) + (129 << 20)
    grown = summary.memory_check(first, last, args, {"b": vectors})
    assert not grown["explained"] and not grown["server"]["explained"]
    assert grown["redis"]["explained"]


def test_the_targets_of_the_committed_run_are_its_stored_judgement() -> None:
    result = json.loads((RESULTS / "loadtest.json").read_text())
    assert summary.targets(result) == result["targets"]
    slow = json.loads(json.dumps(result))
    npy = next(p for p in slow["phases"] if p["name"] == "ingest-npy")
    npy["ingest"]["vectors_per_second"] = summary.TARGETS["npy_vectors_per_second"] - 1
    row = next(r for r in summary.targets(slow) if r["target"].startswith("npy ingestion"))
    assert row["met"] is False


def test_the_options_make_the_phases_and_a_run_of_this_tool_names_its_server() -> None:
    args = build_parser().parse_args(["--out", "x", "--soak-rate", "1000"])
    specs = phase_specs(args)
    assert list(specs) == args.phases.split(",")
    assert specs["soak"].ingest_kinds == ["npy", "octet", "json"]
    assert specs["soak"].ingest_rate == 1000 and specs["soak"].sample_every == 5.0
    assert specs["assign-alone"].ingest_kinds == [] and specs["assign-alone"].assign_rate == 2000
    assert specs["assign-max"].ingest_rate is None
    result = json.loads((RESULTS / "loadtest.json").read_text())
    result["command"] = "python -m benchmarks.loadtest --out x"
    text = markdown(result)
    assert "Command: `python -m benchmarks.loadtest --out x`" in text
    assert "Server: one `python -m nmbatch` process" in text
