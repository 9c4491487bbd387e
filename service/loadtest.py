"""Load test: ingestion rate (JSON and npy) and ``/assign`` latency while ingesting.

Runs the real server process (``python -m service`` with its embedded Redis in a
temporary folder) and drives it over loopback from client processes for a bounded
time per phase:

1. ``json``: ``--clients`` processes POST ``{"vectors": ...}`` batches of ``--batch``
   vectors of dimension ``--dim``;
2. ``npy``: the same with ``application/x-npy`` bodies;
3. ``assign``: one process sends ``GET /assign?vector=...`` for single vectors, one at a
   time, while ``--clients`` processes keep ingesting npy batches.

Bodies are encoded before the clock starts, so the figures measure the service, not the
client's encoder. Client and server share the machine: on a small one they compete for
the same cores, which the report states. Results go to ``--out`` as ``loadtest.json``
and ``loadtest.md``.

    python -m service.loadtest --out bench-results/loadtest --seconds 10
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import orjson

from service.embedded_redis import free_port

__all__ = ["main"]

_N_BODIES = 8  # distinct batches cycled by each client


@dataclass
class PhaseResult:
    """What one phase measured (client side)."""

    name: str
    seconds: float
    requests: int
    vectors: int
    errors: int
    vectors_per_second: float
    request_ms_median: float | None
    request_ms_p99: float | None


def _bodies(kind: str, dim: int, batch: int, seed: int) -> list[bytes]:
    """``_N_BODIES`` request bodies of ``batch`` float32 vectors around 16 centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 10.0, size=(16, dim))
    out = []
    for _ in range(_N_BODIES):
        X = (centres[rng.integers(0, 16, batch)] + rng.normal(size=(batch, dim))).astype(np.float32)
        if kind == "json":
            out.append(orjson.dumps({"vectors": X}, option=orjson.OPT_SERIALIZE_NUMPY))
        else:
            buf = io.BytesIO()
            np.save(buf, X, allow_pickle=False)
            out.append(buf.getvalue())
    return out


def _ingest_client(
    base: str, kind: str, dim: int, batch: int, seed: int, deadline: float, q
) -> None:
    """Client process: POST batches until ``deadline`` (monotonic); report to ``q``."""
    bodies = _bodies(kind, dim, batch, seed)
    content_type = "application/json" if kind == "json" else "application/x-npy"
    latencies: list[float] = []
    vectors = errors = 0
    with httpx.Client(base_url=base, timeout=60) as http:
        i = 0
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            response = http.post(
                "/samples", content=bodies[i % _N_BODIES], headers={"content-type": content_type}
            )
            latencies.append(time.perf_counter() - t0)
            if response.status_code == 202:
                vectors += response.json()["accepted"]
            else:
                errors += 1
            i += 1
    q.put({"latencies": latencies, "vectors": vectors, "errors": errors})


def _assign_client(base: str, dim: int, seed: int, deadline: float, q) -> None:
    """Client process: GET /assign for one vector at a time until ``deadline``."""
    rng = np.random.default_rng(seed)
    queries = [",".join(f"{v:.4f}" for v in rng.normal(0, 10, dim)) for _ in range(256)]
    latencies: list[float] = []
    errors = 0
    with httpx.Client(base_url=base, timeout=60) as http:
        i = 0
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            response = http.get("/assign", params={"vector": queries[i % len(queries)]})
            latencies.append(time.perf_counter() - t0)
            errors += response.status_code != 200
            i += 1
    q.put({"latencies": latencies, "vectors": 0, "errors": errors, "assign": True})


def _summary(name: str, seconds: float, reports: list[dict]) -> PhaseResult:
    latencies = np.array([x for r in reports for x in r["latencies"]]) * 1000.0
    vectors = sum(r["vectors"] for r in reports)
    return PhaseResult(
        name=name,
        seconds=seconds,
        requests=int(latencies.size),
        vectors=vectors,
        errors=sum(r["errors"] for r in reports),
        vectors_per_second=vectors / seconds,
        request_ms_median=float(np.median(latencies)) if latencies.size else None,
        request_ms_p99=float(np.percentile(latencies, 99)) if latencies.size else None,
    )


def _run_phase(
    ctx, base: str, kind: str, args: argparse.Namespace, with_assign: bool
) -> list[PhaseResult]:
    q = ctx.Queue()
    start = time.monotonic() + 1.0  # let the processes start before the clock runs
    deadline = start + args.seconds
    procs = [
        ctx.Process(
            target=_ingest_client, args=(base, kind, args.dim, args.batch, 100 + i, deadline, q)
        )
        for i in range(args.clients)
    ]
    if with_assign:
        procs.append(ctx.Process(target=_assign_client, args=(base, args.dim, 7, deadline, q)))
    for p in procs:
        p.start()
    reports = [q.get(timeout=args.seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    seconds = time.monotonic() - start
    # Processes started late lose a little of their window; the clock runs from `start`.
    seconds = min(seconds, float(args.seconds))
    ingest = [r for r in reports if not r.get("assign")]
    results = [
        _summary(f"ingest {kind}" + (" (with assign)" if with_assign else ""), seconds, ingest)
    ]
    if with_assign:
        results.append(
            _summary("assign (single vector)", seconds, [r for r in reports if r.get("assign")])
        )
    return results


def _wait_ready(proc: subprocess.Popen, base: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with code {proc.returncode}")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the service did not become ready")


def _markdown(result: dict) -> str:
    lines = [
        "# nmbatch service load test",
        "",
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}, "
        f"Python {result['machine']['python']}. Server and clients on the same machine "
        "(loopback), sharing its cores.",
        "",
        f"Server: `python -m service`, embedded Redis (appendfsync everysec), k = {result['k']}, "
        f"worker threads = {result['worker_threads']}. Batches of {result['batch']} vectors, "
        f"d = {result['dim']}, {result['clients']} ingesting client process(es), "
        f"{result['seconds']} s per phase.",
        "",
        "| phase | requests | vectors | errors | vectors/s | request ms median | request ms p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        med = f"{p['request_ms_median']:.2f}" if p["request_ms_median"] is not None else "-"
        p99 = f"{p['request_ms_p99']:.2f}" if p["request_ms_p99"] is not None else "-"
        rate = f"{p['vectors_per_second']:,.0f}" if p["vectors"] else "-"
        lines.append(
            f"| {p['name']} | {p['requests']} | {p['vectors']} | {p['errors']} | {rate} | "
            f"{med} | {p99} |"
        )
    lines += [
        "",
        f"After the run: N = {result['final']['N']}, b = {result['final']['b']}, "
        f"iterations = {result['final']['iteration']}, centroid version = "
        f"{result['final']['version']}; server exit code on SIGTERM: {result['exit_code']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each phase")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1000, help="vectors per request")
    parser.add_argument("--clients", type=int, default=2, help="ingesting client processes")
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--keep-data", action="store_true", help="keep the Redis data folder")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="nmbatch-loadtest-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
    env.update(
        NMBATCH_PORT=str(port),
        NMBATCH_DATA_DIR=str(data_dir),
        NMBATCH_K=str(args.k),
        NMBATCH_LOG_LEVEL="warning",
        NMBATCH_MAX_VECTORS=str(max(args.batch, 100_000)),
    )
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    server = subprocess.Popen([sys.executable, "-m", "service"], env=env, cwd=repo)
    ctx = mp.get_context("spawn")
    try:
        _wait_ready(server, base)
        # Warm-up (JIT-compiled kernels, first iterations) outside the measured phases.
        for kind in ("json", "npy"):
            ctype = "application/json" if kind == "json" else "application/x-npy"
            for body in _bodies(kind, args.dim, args.batch, 0)[:2]:
                httpx.post(
                    f"{base}/samples", content=body, headers={"content-type": ctype}, timeout=60
                )
        phases: list[PhaseResult] = []
        for kind, with_assign in (("json", False), ("npy", False), ("npy", True)):
            phases += _run_phase(ctx, base, kind, args, with_assign)
            for p in phases[-2 if with_assign else -1 :]:
                rate = p.vectors_per_second if p.vectors else p.requests / p.seconds
                unit = "vectors/s" if p.vectors else "requests/s"
                print(
                    f"{p.name}: {rate:,.0f} {unit}, median {p.request_ms_median:.2f} ms, "
                    f"p99 {p.request_ms_p99:.2f} ms",
                    flush=True,
                )
        stats = httpx.get(f"{base}/stats", timeout=30).json()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            exit_code = server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            exit_code = server.wait()
        if not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)

    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "dim": args.dim,
        "batch": args.batch,
        "clients": args.clients,
        "k": args.k,
        "seconds": args.seconds,
        "worker_threads": max(1, (os.cpu_count() or 2) - 1),
        "phases": [asdict(p) for p in phases],
        "final": {key: stats.get(key) for key in ("N", "b", "iteration", "version")},
        "exit_code": exit_code,
    }
    (args.out / "loadtest.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "loadtest.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0 if exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
