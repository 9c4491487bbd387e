"""The soak benchmark's parts that need no service (benchmarks/soak): sizes and cgroup files,
the cgroup wrapper, OOM lines, the open-loop pacing against a local socket server, the
RSS of a real process tree, the figures and checks, and the report rendered from its
JSON (also the committed runs in docs/bench/soak/)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.loadtest.client import HOST, Connection, http_request
from benchmarks.loadtest.probes import cpu_seconds, rss_bytes
from benchmarks.soak import analysis, cgroup, sampling, traffic
from benchmarks.soak.cli import build_parser
from benchmarks.soak.report import markdown, write_results
from benchmarks.soak.settings import memory_limit, service_settings
from nmbatch.service.storage.capacity import engine_bytes_per_vector, redis_bytes_per_vector

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "bench" / "soak"

OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
MEMORY_STAT = "cache 4096\nrss 8192\nshmem 0\ntotal_rss 12288\ntotal_cache 4096\nbogus x\n"


# -- cgroup helpers -----------------------------------------------------------------------
def test_sizes_read_binary_units_and_refuse_anything_else() -> None:
    assert cgroup.parse_size("7g") == 7 << 30
    assert cgroup.parse_size("6.5GiB") == int(6.5 * (1 << 30))
    assert cgroup.parse_size("512M") == 512 << 20
    assert cgroup.parse_size(" 1000 ") == 1000
    assert cgroup.parse_size("2kb") == 2048
    for bad in ("", "seven", "7x", "-1g"):
        with pytest.raises(ValueError):
            cgroup.parse_size(bad)


def test_keyed_files_parse_to_integers() -> None:
    assert cgroup.parse_keyed(OOM_CONTROL) == {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 2}
    stat = cgroup.parse_keyed(MEMORY_STAT)
    assert stat["total_rss"] == 12288 and "bogus" not in stat


def test_a_cgroup_folder_reads_its_counters(tmp_path: Path) -> None:
    (tmp_path / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    group = cgroup.MemoryCgroup.create("soak", 3 << 30, root=tmp_path)
    assert (tmp_path / "soak" / "memory.limit_in_bytes").read_text() == f"{3 << 30}\n"
    for name, text in {
        "memory.usage_in_bytes": "16384\n",
        "memory.max_usage_in_bytes": "20480\n",
        "memory.failcnt": "3\n",
        "memory.oom_control": OOM_CONTROL,
        "memory.stat": MEMORY_STAT,
        "cgroup.procs": "12\n34\n",
    }.items():
        (group.path / name).write_text(text)
    got = group.read()
    assert got["limit_bytes"] == 3 << 30 and got["usage_bytes"] == 16384
    assert got["max_usage_bytes"] == 20480 and got["failcnt"] == 3
    assert got["oom_kill"] == 2 and got["under_oom"] == 0
    assert got["stat"] == {
        "rss": 8192,
        "cache": 4096,
        "shmem": 0,
        "total_rss": 12288,
        "total_cache": 4096,
    }
    assert group.anonymous() == 12288 and group.pids() == [12, 34]
    with pytest.raises(FileExistsError):
        cgroup.MemoryCgroup.create("soak", 1 << 30, root=tmp_path)
    with pytest.raises(FileNotFoundError):
        cgroup.MemoryCgroup.create("x", 1 << 30, root=tmp_path / "soak" / "nothing")


def test_the_wrapper_writes_the_commands_own_pid_then_execs_it(tmp_path: Path) -> None:
    group = cgroup.MemoryCgroup(tmp_path)
    command = group.wrap([sys.executable, "-c", "import os; print(os.getpid())"])
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    written = (tmp_path / "cgroup.procs").read_text().strip()
    assert written == out.stdout.strip()  # the shell's pid is the command's (exec)


def test_oom_lines_are_the_new_ones_that_tell_of_the_oom_killer() -> None:
    before = ["[1.0] boot", "[2.0] eth0 up"]
    after = [
        *before,
        "[3.0] python invoked oom-killer: gfp_mask=0xcc0, order=0",
        "[3.1] Memory cgroup out of memory: Killed process 42 (nmbatch-engine)",
        "[3.2] eth0 down",
    ]
    assert cgroup.oom_reports(before, after) == after[2:4]
    assert cgroup.oom_reports(after, after) == []
    # The ring buffer dropped its oldest lines: the last line seen before still anchors.
    wrapped = ["[2.0] eth0 up", "[4.0] oom_reaper: reaped process 42"]
    assert cgroup.oom_reports(before, wrapped) == wrapped[1:]


@pytest.mark.skipif(
    os.geteuid() != 0 or not (cgroup.MEMORY_ROOT / "memory.limit_in_bytes").is_file(),
    reason="needs root and a cgroup-v1 memory controller",
)
def test_a_real_cgroup_takes_the_wrapped_process_and_goes_away() -> None:
    group = cgroup.MemoryCgroup.create(cgroup.cgroup_name("nmbatch-soak-test"), 256 << 20)
    try:
        proc = subprocess.Popen(
            group.wrap([sys.executable, "-c", "import sys; sys.stdin.read()"]),
            stdin=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while proc.pid not in group.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.pid in group.pids()
        got = group.read()
        assert got["limit_bytes"] == 256 << 20 and got["oom_kill"] == 0
        assert (group.usage() or 0) > 0
        proc.communicate(b"", timeout=10)
    finally:
        assert group.remove(timeout=10)
    assert not group.path.exists()


# -- pacing -------------------------------------------------------------------------------
def test_due_times_are_evenly_spaced_or_none_for_a_closed_loop() -> None:
    assert traffic.due_time(10.0, 4.0, 0) == 10.0
    assert traffic.due_time(10.0, 4.0, 6) == 11.5
    assert traffic.due_time(10.0, None, 3) is None
    assert traffic.due_time(10.0, 0.0, 3) is None


async def _serve_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def _paced_run(n: int | None, rate: float | None, stop_after: float | None = None) -> tuple:
    """Run :func:`traffic.paced` against a local server; (sent, answers, start)."""
    answers: list[tuple[int, float, float, int]] = []

    async def run() -> tuple[int, float]:
        server = await asyncio.start_server(_serve_ok, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        conns = [Connection(port) for _ in range(3)]
        start = time.monotonic() + 0.05
        stop = (lambda: time.monotonic() >= start + stop_after) if stop_after else (lambda: False)
        sent = await traffic.paced(
            lambda i: http_request("GET", f"/x?i={i}"),
            n,
            rate,
            conns,
            start,
            lambda i, due, end, status, body: answers.append((i, due, end, status)),
            stop,
        )
        for c in conns:
            c.close()
        server.close()
        await server.wait_closed()
        return sent, start

    sent, start = asyncio.run(run())
    return sent, answers, start


def test_an_open_loop_sends_each_request_when_due_and_times_it_from_then() -> None:
    sent, answers, start = _paced_run(60, 300.0)
    assert sent == 60 and len(answers) == 60
    answers.sort()
    assert [a[0] for a in answers] == list(range(60))
    for i, due, end, status in answers:
        assert status == 200
        assert due == pytest.approx(start + i / 300.0)
        assert end >= due
    # Paced: the last answer comes about 59/300 s after the start, not at once.
    assert answers[-1][2] - start >= 59 / 300.0
    assert answers[-1][2] - start < 2.0


def test_a_closed_loop_goes_back_to_back_and_a_stop_ends_an_open_one() -> None:
    sent, answers, _ = _paced_run(40, None)
    assert sent == 40 and {a[3] for a in answers} == {200}
    sent, answers, _ = _paced_run(None, 200.0, stop_after=0.2)
    assert 30 <= sent <= 50 and len(answers) == sent


def test_a_refused_connection_is_an_answer_with_status_0() -> None:
    answers = []

    async def run() -> int:
        server = await asyncio.start_server(_serve_ok, HOST, 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()  # nothing listens there any more
        return await traffic.paced(
            lambda i: http_request("GET", "/x"),
            3,
            100.0,
            [Connection(port)],
            time.monotonic(),
            lambda *a: answers.append(a),
        )

    assert asyncio.run(run()) == 3
    assert [a[3] for a in answers] == [0, 0, 0]


def test_a_record_reads_the_answers_counts() -> None:
    rec = traffic.Record()
    assert rec.add(0.0, 0.1, 202, b'{"accepted": 10, "n_samples": 30}') == (10, 30)
    assert rec.add(0.1, 0.2, 507, b'{"type": "x", "n_samples": 30}') == (0, 30)
    assert rec.add(0.2, 0.3, 0, b"ConnectionResetError: x") == (-1, -1)
    arrays = rec.arrays()
    assert arrays["status"].tolist() == [202, 507, 0]
    assert arrays["accepted"].dtype == np.int32 and arrays["n_samples"].tolist() == [30, 30, -1]
    assert set(arrays["examples"]) == {"507", "0"}


# -- process tree -------------------------------------------------------------------------
_TREE = """
import subprocess, sys
kids = [subprocess.Popen([path, "30"]) for path in sys.argv[1:]]
print(" ".join(str(k.pid) for k in kids), flush=True)
sys.stdin.read()
for k in kids:
    k.kill()
    k.wait()
"""


def test_the_tree_rss_counts_the_children_but_not_redis(tmp_path: Path) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    names = [sampling.REDIS_NAME, sampling.ENGINE_NAME, "helper"]
    paths = []
    for name in names:  # the same program under three OS names
        paths.append(tmp_path / name)
        shutil.copy(sleep, paths[-1])
    parent = subprocess.Popen(
        [sys.executable, "-c", _TREE, *map(str, paths)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        redis_pid, engine_pid, helper_pid = map(int, parent.stdout.readline().split())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until each child has exec'd its program
            tree = sampling.process_tree(parent.pid)
            if sorted(p.name for p in tree[1:]) == sorted(names):
                break
            time.sleep(0.05)
        tree = sampling.process_tree(parent.pid, exclude=(sampling.REDIS_NAME,))
        assert [p.pid for p in tree] == [parent.pid, engine_pid, helper_pid] or [
            p.pid for p in tree
        ] == [parent.pid, helper_pid, engine_pid]
        assert all(p.ppid == parent.pid for p in tree[1:])
        got = sampling.tree_rss(parent.pid)
        assert got["processes"] == 3 and got["engines"] == 1
        assert got["engine"] == pytest.approx(rss_bytes(engine_pid), rel=0.2)
        expected = sum(rss_bytes(p) or 0 for p in (parent.pid, engine_pid, helper_pid))
        assert got["total"] == pytest.approx(expected, rel=0.1)
        assert redis_pid not in {p.pid for p in tree}
    finally:
        parent.communicate("", timeout=30)
    assert sampling.tree_rss(parent.pid)["total"] is None  # gone


def test_metrics_sum_the_samples_of_each_name() -> None:
    text = (
        "# HELP nmbatch_engine_restarts_total x\n"
        'nmbatch_engine_restarts_total{model="a"} 2.0\n'
        'nmbatch_engine_restarts_total{model="b"} 1.0\n'
        "nmbatch_other 5\n"
    )
    got = sampling.metric_values(text, ("nmbatch_engine_restarts_total",))
    assert got == {"nmbatch_engine_restarts_total": 3.0}


# -- figures, checks, report --------------------------------------------------------------
def _machine() -> dict:
    return {
        "cpu": "Test CPU",
        "cores": 2,
        "memory_bytes": 8 << 30,
        "platform": "Linux-test",
        "versions": {"python": "3.11", "numpy": "2"},
    }


def _samples(n: int, warmup: int, per_step: int, rss0: float, rss_per_vector: float) -> list:
    out = []
    for i in range(n):
        acked = min(i * per_step, 200)
        out.append(
            {
                "t": float(i),
                "server_rss": int(rss0 + rss_per_vector * (acked + warmup)),
                "engine_rss": 1000,
                "redis_rss": 2000 + acked,
                "redis_used_memory": 1500 + acked,
                "cgroup_usage": 5000,
                "cgroup_rss": 4000,
                "readyz": 200 if i != 3 else 503,
                "stats": {"N": acked + warmup, "b": acked + warmup, "n_logged": acked + warmup},
                "traffic": {"acked_vectors": acked, "s507": int(acked >= 200)},
            }
        )
    return out


def _result(retention: str) -> dict:
    """A run's record as :func:`benchmarks.soak.run.run` makes it, from synthetic traffic:
    20 batches of 10 accepted (after a warm-up of 20), then 10 refused with 507 at the
    capacity 220; 300 /assign, one refused."""
    argv = ["--out", "x", "--max-samples", "220", "--batch", "10", "--assign-rate", "100"]
    if retention == "window":
        argv += ["--retention", "window"]
    args = build_parser().parse_args(argv)
    batch, warmup = 10, 20
    status = np.array([202] * 20 + [507] * 10, dtype=np.int16)
    due = np.arange(30) * 0.1
    ingest = {
        "due": due,
        "end": due + 0.05,
        "status": status,
        "accepted": np.where(status == 202, batch, 0).astype(np.int32),
        "n_samples": np.minimum((np.arange(30) + 1) * batch + warmup, 220),
        "examples": {"507": ['{"type":"urn:nmbatch:problem:store-full"}']},
    }
    adue = np.arange(300) * 0.01
    astatus = np.full(300, 200, dtype=np.int16)
    astatus[7] = 503
    assign = {
        "due": adue,
        "end": adue + 0.001 + (np.arange(300) % 3) * 0.001,
        "status": astatus,
        "examples": {"503": ["busy"]},
    }
    samples = _samples(12, warmup, 20, 1000.0, 600.0)
    result = {
        "command": "python -m benchmarks.soak " + " ".join(argv),
        "machine": _machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "retention": retention,
        "max_samples": 220,
        "settings": service_settings(args),
        "capacity_model": {"engine_per_vector": 616, "redis_per_vector": 641, "row_bytes": 512},
        "notes": ["a note"],
        "cgroup": {
            "limit_bytes": 1 << 30,
            "rule": "given",
            "after_run": {"max_usage_bytes": 6000, "failcnt": 0, "oom_kill": 0, "stat": {}},
        },
        "before_start": {"waited_seconds": 3.0, "background_cores": 0.1},
        "baseline": samples[0],
        "samples": samples,
        "traffic_seconds": 3.0,
        "catch_up_seconds": 0.5,
        "machine_cores_busy": 1.5,
        "server_cores_busy": 1.0,
        "ingest": analysis.ingest_summary(ingest, batch, warmup),
        "assign": analysis.assign_summary(assign, 1.0),
        "final": {"stats": {"N": 220, "n_logged": 220, "b": 220, "converged": True}},
        "loss_check": {
            "log_rows": 220,
            "log_entries": 22,
            "meta_n_samples": 220,
            "acked": 220,
            "in_doubt": 0,
            "nothing_lost": True,
        },
        "exit_code": 0,
        "service_log": ["INFO capacity 220"],
        "oom": {"cgroup_oom_kill": 0, "kernel_log": [], "engine_restarts": 0},
    }
    result["readiness"] = analysis.readiness(samples)
    if retention == "window":
        result["memory_after_window"] = analysis.memory_after_window(
            samples, samples[0], 100, 100 * 512, warmup
        )
    result["checks"] = analysis.checks(result)
    return result


def test_the_ingest_figures_find_the_first_507() -> None:
    ing = _result("all")["ingest"]
    assert ing["requests"] == 30 and ing["vectors_acked"] == 200 and ing["acked_total"] == 220
    assert ing["statuses"] == {"202": 20, "507": 10}
    first = ing["first_507"]
    assert first["t"] == pytest.approx(2.05) and first["n_samples"] == 220
    assert first["acked_before"] == 220 and first["accepted_after"] == 0
    assert first["refused_after"] == 10
    assert ing["vectors_per_second"] == pytest.approx(200 / 1.95)


def test_latency_slices_and_readiness() -> None:
    due = np.array([0.0, 0.5, 1.0, 1.5, 2.5])
    end = due + np.array([0.001, 0.003, 0.002, 0.010, 0.004])
    status = np.array([200, 200, 500, 200, 200])
    slices = analysis.latency_slices(due, end, status, 1.0)
    assert [s["t"] for s in slices] == [0.0, 1.0, 2.0]
    assert [s["requests"] for s in slices] == [2, 2, 1]
    assert [s["failed"] for s in slices] == [0, 1, 0]
    assert slices[1]["p50_ms"] == pytest.approx(10.0) and slices[0]["max_ms"] == pytest.approx(3)
    ready = analysis.readiness(
        [
            {"t": 0, "readyz": 200},
            {"t": 1, "readyz": 503},
            {"t": 2, "readyz": 0},
            {"t": 3, "readyz": 200},
            {"t": 4, "readyz": 503},
        ]
    )
    assert ready["statuses"] == {"200": 2, "503": 2, "0": 1}
    assert ready["longest_not_ready_seconds"] == 2.0


def test_memory_after_the_window_is_judged_above_the_fixed_overhead() -> None:
    warm = 0
    samples = [
        {
            "t": float(i),
            "server_rss": 1000 + (130 if i >= 3 else 0),
            "redis_used_memory": 10 + 10 * i,
            "traffic": {"acked_vectors": 50 * i},
        }
        for i in range(12)
    ]
    fixed = {"server_rss": 1000, "redis_used_memory": 10}
    mem = analysis.memory_after_window(
        samples, fixed, 100, 100, warm, model_bytes={"server_rss": 130}
    )
    assert mem["samples"] == 10
    assert mem["server_rss"]["ratio"] == pytest.approx(1.3) and mem["server_rss"]["within"]
    assert mem["server_rss"]["model_ratio"] == pytest.approx(1.0)
    assert "model_ratio" not in mem["redis_used_memory"]
    assert mem["server_rss"]["slope_bytes_per_million"] == pytest.approx(0.0, abs=1e-3)
    red = mem["redis_used_memory"]
    assert red["ratio"] == pytest.approx(1.1) and red["within"]
    assert red["slope_bytes_per_million"] == pytest.approx(0.2e6)  # 10 bytes per 50 vectors


def test_the_capacity_checks() -> None:
    rows = {r["check"]: r for r in _result("all")["checks"]}
    assert rows["samples held at the first 507"]["met"] is True
    assert rows["202 after the first 507"]["met"] is True
    assert rows["errors other than 507"]["measured"] == 1  # the /assign 503
    assert rows["errors other than 507"]["met"] is False
    assert rows["acknowledged samples in the log"]["met"] is True
    assert rows["/readyz answers not 200 (1 a second)"]["measured"] == 1
    assert rows["/assign p99 ms"]["met"] is True
    assert rows["OOM kills (cgroup counter, kernel log) and engine restarts"]["met"] is True


def test_the_window_checks() -> None:
    rows = {r["check"]: r for r in _result("window")["checks"]}
    assert rows["vectors acknowledged"]["met"] is False  # 10 batches were refused
    assert rows["ingestion, vectors/s"]["met"] is False  # 103 vectors/s
    assert rows["errors (any non-2xx or no answer)"]["measured"] == 11
    key = "server + engine RSS after the first window, x window bytes above the fixed overhead"
    assert rows[key]["measured"] is not None


@pytest.mark.parametrize("retention", ["all", "window"])
def test_the_report_renders_again_from_its_json(tmp_path: Path, retention: str) -> None:
    result = _result(retention)
    write_results(result, tmp_path)
    text = (tmp_path / "soak.md").read_text()
    assert text == markdown(json.loads((tmp_path / "soak.json").read_text()))
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert f"# Soak: retention `{retention}`, NMBATCH_MAX_SAMPLES = 220" in text
    assert "| 202 after the first 507 | 0 | 0 | yes |" in text or retention == "window"
    assert "| errors other than 507 | 1 | 0 | **no** |" in text or retention == "window"
    assert "First `507` at 2.0 s, the model holding 220 samples" in text


def test_settings_and_the_automatic_limit() -> None:
    args = build_parser().parse_args(
        [
            "--out",
            "x",
            "--retention",
            "window",
            "--max-samples",
            "2000000",
            "--setting",
            "SNAPSHOT_SECONDS=2",
            "--setting",
            "NMBATCH_POLL_SECONDS=1",
        ]
    )
    assert service_settings(args) == {
        "NMBATCH_K": "16",
        "NMBATCH_DIM": "128",
        "NMBATCH_RETENTION": "window",
        "NMBATCH_MAX_SAMPLES": "2000000",
        "NMBATCH_SNAPSHOT_SECONDS": "2",
        "NMBATCH_POLL_SECONDS": "1",
    }
    assert memory_limit(args) is None
    args = build_parser().parse_args(
        ["--out", "x", "--max-samples", "5000000", "--memory-limit", "auto"]
    )
    limit, rule = memory_limit(args)
    engine, redis = engine_bytes_per_vector(128, 16), redis_bytes_per_vector(128)
    need = 1.1 * 5_000_000 * (engine + redis) + (1 << 30)
    assert limit == -(-need // (256 << 20)) * (256 << 20)  # rounded up to 256 MiB
    assert limit - need < 256 << 20
    assert f"5,000,000 x ({engine} engine + {redis} Redis)" in rule
    args = build_parser().parse_args(["--out", "x", "--memory-limit", "6.5g"])
    assert memory_limit(args)[0] == int(6.5 * (1 << 30))


@pytest.mark.parametrize("folder", sorted(p.parent for p in RESULTS.glob("*/soak.json")))
def test_a_committed_report_is_the_rendering_of_its_json(folder: Path) -> None:
    result = json.loads((folder / "soak.json").read_text())
    assert markdown(result) == (folder / "soak.md").read_text()


def test_rewrite_spans_and_the_latency_outside_them() -> None:
    samples = [{"t": float(t), "redis_rewriting": int(t in (5, 6, 7, 20))} for t in range(30)]
    spans = analysis.rewrite_intervals(samples, 1.0)
    assert spans == [(4.0, 8.0), (19.0, 21.0)]
    due = np.arange(0.0, 40.0, 0.5)
    late = (due >= 4.0) & (due <= 18.0)  # a rewrite and the 10 s after it
    end = due + np.where(late, 0.2, 0.001)
    got = analysis.latency_outside(
        {"due": due, "end": end, "status": np.full(due.shape, 200)}, spans[:1]
    )
    assert got["left_out_share"] == pytest.approx(late.mean())
    assert got["latency_ms"]["max"] == pytest.approx(1.0)
    assert got["spans"] == [[4.0, 8.0]]


def test_a_failed_restart_is_reported_with_the_logs_last_lines(tmp_path: Path) -> None:
    result = _result("all")
    result["restart"] = {
        "error": "the service exited with code 3",
        "failed_after_seconds": 21.5,
        "log_tail": {"service": ["ERROR redis-server did not answer within 20 s"], "redis": []},
        "expected": 220,
        "exact": False,
        "oom_kill": 0,
    }
    result["checks"] = analysis.checks(result)
    rows = {r["check"]: r for r in result["checks"]}
    row = rows["after a restart on the same data: samples the engine holds"]
    assert row["measured"] == "failed to start" and row["met"] is False
    write_results(result, tmp_path, with_plot=False)
    text = (tmp_path / "soak.md").read_text()
    assert "**failed** after 21.5 s: the service exited with code 3" in text
    assert "  ERROR redis-server did not answer within 20 s" in text
    assert (
        "| after a restart on the same data: samples the engine holds | failed to start |" in text
    )


def test_slices_are_annotated_with_what_else_ran() -> None:
    # Other programs take half a core from t = 10 s on; Redis rewrites at t = 12 s.
    samples = [
        {
            "t": float(t),
            "redis_rewriting": int(t == 12),
            "cpu": {
                "machine": t * 1.0 + max(0, t - 10) * 0.5,
                "service": t * 0.8,
                "clients": t * 0.2,
            },
        }
        for t in range(21)
    ]
    slices = [{"t": 0.0}, {"t": 10.0}, {"t": 20.0}]
    analysis.annotate_slices(slices, samples, 10.0)
    assert slices[0]["other_cores"] == pytest.approx(0.0)
    assert slices[1]["other_cores"] == pytest.approx(0.5)
    assert slices[2]["other_cores"] is None  # one sample only
    assert [s["rewriting"] for s in slices] == [False, True, False]


def test_other_programs_are_named_with_the_cores_they_took() -> None:
    before = sampling.cpu_by_process()
    started = time.monotonic()
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"]
    )
    busy.wait(timeout=30)
    after = sampling.cpu_by_process()
    seconds = time.monotonic() - started
    # The finished child counts in this process (its parent, which reaped it) unless ours.
    rows = sampling.other_programs(before, after, set(), seconds)
    mine = [r for r in rows if r["pid"] == os.getpid()]
    assert mine and mine[0]["cores"] > 0.3
    assert "/" not in mine[0]["command"] and len(mine[0]["command"]) <= 80
    assert all(
        r["pid"] != os.getpid()
        for r in sampling.other_programs(before, after, {os.getpid()}, seconds)
    )


_THREAD_CHILD = """
import subprocess, sys, threading
burn = "import time\\nt = time.time()\\nwhile time.time() - t < 0.5: pass\\nprint(1, flush=True)\\n"
burn += "import sys\\nsys.stdin.read()"
done, kids = threading.Event(), []

def start_and_wait():  # the thread that started the child lives on, like the worker
    kids.append(subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE))
    done.wait()

thread = threading.Thread(target=start_and_wait)
thread.start()
while not kids:
    pass
kids[0].stdout.readline()
print("burnt", flush=True)
sys.stdin.read()
kids[0].communicate(b"")
done.set()
"""


def test_the_tree_cpu_counts_a_child_started_by_another_thread() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _THREAD_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "burnt"
        total = sampling.tree_cpu_seconds(parent.pid)
        main_thread_only = cpu_seconds(parent.pid, children=True) or 0.0
        assert total is not None and total >= main_thread_only + 0.4
    finally:
        parent.communicate("", timeout=30)


def test_scheduler_waits_reads_this_threads_run_and_wait_times() -> None:
    before = sampling.scheduler_waits(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # some CPU time for the main thread
        pass
    after = sampling.scheduler_waits(os.getpid())
    assert before["loop_run"] is not None and after["loop_run"] is not None
    assert after["loop_run"] - before["loop_run"] >= 0.04
    assert after["loop_wait"] is not None and after["loop_wait"] >= before["loop_wait"]
    assert sampling.scheduler_waits(2**22 + 12345)["loop_run"] is None  # no such process
