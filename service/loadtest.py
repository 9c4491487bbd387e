"""Load benchmark of the HTTP service: ingestion rate, ``/assign`` latency, soak, memory.

Runs the real server (``python -m nmbatch``: one uvicorn process, its embedded
``redis-server``, the worker iterating all along on ``NMBATCH_WORKER_THREADS=1``, access
log off) and drives it over loopback from separate client processes. The clients are
small asyncio programs speaking HTTP/1.1 over raw keep-alive sockets, with every request
encoded before the clock starts, so they take little of the shared cores. Each phase runs
on a fresh server (no phase inherits the memory or the store size of another), after a
warm-up (JIT-compiled kernels, first iterations) and, on a shared machine, after waiting
for other programs to leave the cores (``--wait-quiet``):

``npy``, ``octet``, ``json`` (phases ``ingest-*``)
    Ingestion at full speed: ``--ingest-procs`` processes x ``--ingest-conns``
    connections POST batches of ``--batch`` vectors of dimension ``--dim`` back to back
    (``application/x-npy``, raw little-endian ``float32`` as
    ``application/octet-stream``, ``{"vectors": ...}``) for ``--phase-seconds``.
``assign``
    Single-vector ``GET /assign`` paced (open loop) at ``--assign-rate`` requests/s over
    ``--assign-conns`` connections while npy batches are ingested, paced at
    ``--assign-ingest-rate`` vectors/s. Latency counts from the scheduled send time, so
    a stalled server cannot hide behind a client that waits (no coordinated omission).
``assign-max``
    The same with ingestion at full speed (reported, not judged against a target).
``assign-alone``
    ``/assign`` only, at ``--assign-alone-rate``: the cost of one request.
``soak``
    ``--soak-seconds`` (300: the 5-minute run) of paced ingestion at ``--soak-rate``
    vectors/s (npy, octet-stream and JSON connections in turn) and paced ``/assign`` at
    ``--assign-rate``. Errors must be 0; the RSS of the server and of ``redis-server`` at
    start and end is checked against the growth the data alone explain.

Every ingesting phase also runs a probe: every ``--probe-interval`` s it POSTs one npy
batch and, from its ``202``, polls ``GET /centroids`` (``If-None-Match``) until the
published version has ``n_samples`` covering the acknowledged total (the centroids were
computed with the new data in the worker's store), and until its ``batch_size`` does
(the nested batch has grown over it). After the clients stop, the phase waits for the
worker to hold the whole log (reported as the catch-up time) before the last sample.

Results go to ``--out``: ``loadtest.json`` (everything, with per-second timelines and
resource samples) and ``loadtest.md`` (machine, versions, command, tables, targets).

    python -m nmbatch.service.loadtest --out bench-results/loadtest            # every phase
    python -m nmbatch.service.loadtest --out bench-results/lt --phases npy,assign --phase-seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import multiprocessing as mp
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from nmbatch.service.embedded_redis import free_port

__all__ = ["main"]

HOST = "127.0.0.1"
CONTENT_TYPES = {
    "npy": "application/x-npy",
    "octet": "application/octet-stream",
    "json": "application/json",
}
TARGETS = {
    "npy_vectors_per_second": 200_000,
    "json_vectors_per_second": 20_000,
    "assign_p99_ms": 10.0,
    "assign_requests_per_second": 1_000,
    "errors": 0,
}
KEEP_ALIVE_REUSE = 3.0  # seconds idle after which a connection is opened anew
_N_BODIES = 8  # distinct batches cycled by each connection
_N_QUERIES = 256  # distinct /assign query vectors per connection
_CENTRES = 16  # the synthetic data are a mixture of this many Gaussians


# -- data and request bytes -------------------------------------------------------------
def synthetic(n: int, dim: int, seed: int) -> np.ndarray:
    """``(n, dim)`` float32: ``_CENTRES`` Gaussian blobs (scale 10, unit noise)."""
    centres = np.random.default_rng(12345).normal(0.0, 10.0, size=(_CENTRES, dim))
    rng = np.random.default_rng(seed)
    X = centres[rng.integers(0, _CENTRES, n)] + rng.normal(size=(n, dim))
    return X.astype(np.float32)


def encode_body(kind: str, X: np.ndarray) -> bytes:
    """``X`` as a ``POST /samples`` body of ``kind`` (``npy``, ``octet`` or ``json``)."""
    if kind == "json":
        return orjson.dumps({"vectors": X}, option=orjson.OPT_SERIALIZE_NUMPY)
    if kind == "octet":
        return np.ascontiguousarray(X, dtype="<f4").tobytes()
    buf = io.BytesIO()
    np.save(buf, X, allow_pickle=False)
    return buf.getvalue()


def http_request(method: str, target: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    """The bytes of one HTTP/1.1 keep-alive request."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {HOST}"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def ingest_requests(kind: str, dim: int, batch: int, seed: int) -> list[bytes]:
    """``_N_BODIES`` encoded ``POST /samples`` requests of ``batch`` vectors each."""
    return [
        http_request(
            "POST",
            "/samples",
            encode_body(kind, synthetic(batch, dim, seed * 1000 + i)),
            {"Content-Type": CONTENT_TYPES[kind]},
        )
        for i in range(_N_BODIES)
    ]


def assign_requests(dim: int, seed: int) -> list[bytes]:
    """``_N_QUERIES`` encoded ``GET /assign?vector=...`` requests (single vectors)."""
    Q = synthetic(_N_QUERIES, dim, seed)
    return [http_request("GET", "/assign?vector=" + ",".join(f"{v:.5g}" for v in q)) for q in Q]


# -- a minimal HTTP/1.1 client on asyncio streams ---------------------------------------
class Connection:
    """One keep-alive connection; reconnects after the server closed it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0.0

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send ``raw`` (a whole request) and return ``(status, body)``."""
        if self.reader is not None and (
            self.reader.at_eof() or time.monotonic() - self.used > KEEP_ALIVE_REUSE
        ):
            self.close()  # the server may have closed it (uvicorn: after 5 s idle)
        self.used = time.monotonic()
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port, limit=1 << 20)
        assert self.reader is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        i = lower.find(b"\r\ncontent-length:")
        if status in (204, 304) or status < 200:
            body = b""  # no body, whatever the headers say
        elif i >= 0:
            j = lower.index(b"\r\n", i + 2)
            body = await self.reader.readexactly(int(lower[i + 17 : j]))
        elif b"transfer-encoding: chunked" in lower:
            body = await self._chunked()
        else:
            body = await self.reader.read()
            self.close()
            return status, body
        if b"\r\nconnection: close" in lower:
            self.close()
        return status, body

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Recorder:
    """What one client process saw: per request ``(end time, latency, status)``."""

    ends: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    vectors: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def ok(self, end: float, latency: float, vectors: int) -> None:
        self.ends.append(end)
        self.latencies.append(latency)
        self.vectors.append(vectors)

    def fail(self, end: float, what: str) -> None:
        self.errors.append(f"{end:.3f} {what}"[:300])

    def report(self) -> dict[str, Any]:
        times = os.times()
        return {
            "ends": np.asarray(self.ends),
            "latencies": np.asarray(self.latencies),
            "vectors": np.asarray(self.vectors, dtype=np.int64),
            "errors": self.errors,
            "cpu_seconds": times.user + times.system,
        }


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def _drive(
    conn: Connection,
    requests: list[bytes],
    vectors_each: int,
    start: float,
    deadline: float,
    rate: float | None,
    offset: float,
    rec: Recorder,
) -> None:
    """Send ``requests`` in turn from ``start`` until ``deadline`` (monotonic).

    ``rate`` None: back to back (closed loop), latency from the send. Else paced at
    ``rate`` requests/s, the ``i``-th scheduled at ``start + (i + offset) / rate``, and
    latency counted from that schedule.
    """
    await _sleep_until(start)
    i = 0
    while True:
        if rate is None:
            scheduled = time.monotonic()
        else:
            scheduled = start + (i + offset) / rate
            await _sleep_until(scheduled)
        if scheduled >= deadline:
            return
        raw = requests[i % len(requests)]
        i += 1
        try:
            status, body = await conn.request(raw)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            conn.close()
            rec.fail(time.monotonic(), f"{type(exc).__name__}: {exc}")
            continue
        end = time.monotonic()
        if 200 <= status < 300:
            rec.ok(end, end - scheduled, vectors_each)
        else:
            rec.fail(end, f"HTTP {status}: {body[:200]!r}")


def _run_async(coro_factory: Callable[[], Any]) -> None:
    try:
        import uvloop

        uvloop.run(coro_factory())
    except ImportError:
        asyncio.run(coro_factory())


def ingest_client(cfg: dict[str, Any], q: Any) -> None:
    """Client process: ``cfg['conns']`` connections POSTing ``cfg['kinds']`` bodies."""
    kinds = cfg["kinds"]
    bodies = {
        kind: ingest_requests(kind, cfg["dim"], cfg["batch"], cfg["seed"] + 17 * i)
        for i, kind in enumerate(sorted(set(kinds)))
    }
    rec = Recorder()

    async def run() -> None:
        conns = [Connection(cfg["port"]) for _ in range(cfg["conns"])]
        rate = cfg["rate"]  # requests/s per connection, or None
        await asyncio.gather(
            *(
                _drive(
                    c,
                    bodies[kinds[j % len(kinds)]],
                    cfg["batch"],
                    cfg["start"],
                    cfg["deadline"],
                    rate,
                    j / max(1, len(conns)),
                    rec,
                )
                for j, c in enumerate(conns)
            )
        )
        for c in conns:
            c.close()

    _run_async(run)
    q.put({"role": "ingest", "kinds": kinds, **rec.report()})


def assign_client(cfg: dict[str, Any], q: Any) -> None:
    """Client process: single-vector ``GET /assign`` paced at ``cfg['rate']`` requests/s."""
    requests = assign_requests(cfg["dim"], cfg["seed"])
    rec = Recorder()

    async def run() -> None:
        conns = [Connection(cfg["port"]) for _ in range(cfg["conns"])]
        per_conn = cfg["rate"] / len(conns)
        await asyncio.gather(
            *(
                _drive(c, requests, 0, cfg["start"], cfg["deadline"], per_conn, j / len(conns), rec)
                for j, c in enumerate(conns)
            )
        )
        for c in conns:
            c.close()

    _run_async(run)
    q.put({"role": "assign", **rec.report()})


def probe_client(cfg: dict[str, Any], q: Any) -> None:
    """Client process: ingestion-to-centroids delays, one npy batch every interval."""
    post = ingest_requests("npy", cfg["dim"], cfg["batch"], cfg["seed"])
    poll_every = cfg["poll_seconds"]
    in_store: list[float] = []
    in_prefix: list[float | None] = []
    rec = Recorder()

    async def run() -> None:
        writer, poller = Connection(cfg["port"]), Connection(cfg["port"])
        etag = ""
        j = 0
        next_at = cfg["start"] + cfg["interval"] / 2
        while True:
            await _sleep_until(next_at)
            if time.monotonic() >= cfg["deadline"]:
                break
            t0 = time.monotonic()
            try:
                status, body = await writer.request(post[j % len(post)])
            except (OSError, asyncio.IncompleteReadError) as exc:
                writer.close()
                rec.fail(time.monotonic(), f"probe POST {type(exc).__name__}: {exc}")
                next_at += cfg["interval"]
                continue
            acked = time.monotonic()
            j += 1
            if status != 202:
                rec.fail(acked, f"probe POST HTTP {status}: {body[:200]!r}")
                next_at += cfg["interval"]
                continue
            rec.ok(acked, acked - t0, cfg["batch"])
            total = orjson.loads(body)["n_samples"]
            store_delay = prefix_delay = None
            give_up = max(acked + cfg["max_wait"], cfg["deadline"])
            while time.monotonic() < give_up:
                raw = http_request("GET", "/centroids", headers={"If-None-Match": etag})
                try:
                    status, body = await poller.request(raw)
                except (OSError, asyncio.IncompleteReadError) as exc:
                    poller.close()
                    rec.fail(time.monotonic(), f"probe GET {type(exc).__name__}: {exc}")
                    break
                seen = time.monotonic()
                if status == 200:
                    doc = orjson.loads(body)
                    etag = f'"{doc["version"]}"'
                    if store_delay is None and doc["n_samples"] >= total:
                        store_delay = seen - acked
                    if doc["batch_size"] >= total:
                        prefix_delay = seen - acked
                        store_delay = store_delay if store_delay is not None else prefix_delay
                        break
                elif status != 304:
                    rec.fail(seen, f"probe GET HTTP {status}: {body[:200]!r}")
                    break
                if seen >= cfg["deadline"] and store_delay is not None:
                    break  # the phase is over; the prefix may take long to grow
                await asyncio.sleep(poll_every)
            if store_delay is not None:
                in_store.append(store_delay)
                in_prefix.append(prefix_delay)
            next_at = max(next_at + cfg["interval"], time.monotonic())
        writer.close()
        poller.close()

    _run_async(run)
    q.put({"role": "probe", "in_store": in_store, "in_prefix": in_prefix, **rec.report()})


# -- the server and what it costs ------------------------------------------------------
def _rss_bytes(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cpu_seconds(pid: int | None, children: bool = False) -> float | None:
    """CPU seconds of ``pid`` (user + system), with ``children``: plus its reaped children."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = int(fields[11]) + int(fields[12])
    seconds = ticks / os.sysconf("SC_CLK_TCK")
    if children:  # reaped ones (in the parent's counters) and running ones
        seconds += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
        with contextlib.suppress(OSError, ValueError):
            for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
                seconds += _cpu_seconds(int(child), children=True) or 0.0
    return seconds


def _worker_thread_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of the server's worker thread (OS name ``nmbatch-worker``), if found."""
    total, found = 0.0, False
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                if (task / "comm").read_text().strip() == "nmbatch-worker":
                    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                    found = True
    return total if found else None


def _engine_pids(pid: int) -> list[int]:
    """The server's engine process(es) (OS name ``nmbatch-engine``), children of ``pid``."""
    found = []
    with contextlib.suppress(OSError, ValueError):
        for task in Path(f"/proc/{pid}/task").iterdir():  # the worker thread started it
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{child}/comm").read_text().strip() == "nmbatch-engine":
                        found.append(int(child))
    return found


def _plus(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _machine_busy_seconds() -> float | None:
    """CPU seconds all cores spent busy (not idle, not waiting for I/O) since boot."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + ticks[4]
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class Server:
    """``python -m nmbatch`` with its embedded Redis in a temporary folder."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.port = free_port()
        self.redis_port = free_port()
        self.data_dir = Path(tempfile.mkdtemp(prefix="nmbatch-loadtest-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
        self.settings = {
            "NMBATCH_PORT": str(self.port),
            "NMBATCH_DATA_DIR": str(self.data_dir),
            "NMBATCH_EMBEDDED_REDIS_PORT": str(self.redis_port),
            "NMBATCH_K": str(args.k),
            "NMBATCH_DIM": str(args.dim),
            "NMBATCH_SEED": "0",
            "NMBATCH_WORKER_THREADS": "1",
            "NMBATCH_LOG_LEVEL": "warning",
            "NMBATCH_ACCESS_LOG": "false",
            "NMBATCH_WORKER_PROCESS": "true" if args.worker_process else "false",
        }
        env.update(self.settings)
        repo = Path(__file__).resolve().parents[1]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "nmbatch"], env=env, cwd=repo)
        self.redis_pid: int | None = None
        self._redis = None

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        import httpx
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with code {self.proc.returncode}")
            try:
                if httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("the service did not become ready")
        self._redis = redis.Redis(host=HOST, port=self.redis_port, socket_timeout=10)
        self.redis_pid = int(self._redis.info("server")["process_id"])

    def get_json(self, path: str) -> dict[str, Any]:
        import httpx

        return httpx.get(f"{self.base}{path}", timeout=30).json()

    def sample(self) -> dict[str, Any]:
        """RSS and CPU time of both processes, Redis's own memory count, samples logged."""
        engines = _engine_pids(self.proc.pid)
        engine_rss = sum(_rss_bytes(e) or 0 for e in engines) if engines else None
        engine_cpu = sum(_cpu_seconds(e) or 0.0 for e in engines) if engines else None
        out: dict[str, Any] = {
            "t": time.monotonic(),
            # The server with its engine process (which holds the store).
            "server_rss": _plus(_rss_bytes(self.proc.pid), engine_rss),
            "redis_rss": _rss_bytes(self.redis_pid),
            "server_cpu": _plus(_cpu_seconds(self.proc.pid), engine_cpu),
            # The worker thread and the engine process it drives.
            "worker_cpu": _plus(_worker_thread_cpu_seconds(self.proc.pid), engine_cpu),
            "engine_rss": engine_rss,
            # With the AOF rewrites Redis forks (reaped children count once they end).
            "redis_cpu": _cpu_seconds(self.redis_pid, children=True),
            "machine_cpu": _machine_busy_seconds(),
        }
        if self._redis is not None:
            with contextlib.suppress(Exception):
                out["redis_used_memory"] = int(self._redis.info("memory")["used_memory"])
                info = self._redis.info("stats")
                out["redis_forks"] = int(info.get("total_forks", 0))
                out["redis_latest_fork_ms"] = float(info.get("latest_fork_usec", 0)) / 1000.0
                raw = self._redis.hget("nmbatch:default:meta", "n_samples")
                out["n_logged"] = int(raw) if raw is not None else 0
        return out

    def stop(self) -> int:
        if self._redis is not None:
            with contextlib.suppress(Exception):
                self._redis.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        return code


class Sampler(threading.Thread):
    """Samples :meth:`Server.sample` every ``every`` seconds until stopped."""

    def __init__(self, server: Server, every: float) -> None:
        super().__init__(daemon=True)
        self.server, self.every = server, every
        self.samples: list[dict[str, Any]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append(self.server.sample())
            self._stop_event.wait(self.every)

    def stop(self) -> list[dict[str, Any]]:
        self._stop_event.set()
        self.join()
        self.samples.append(self.server.sample())
        return self.samples


# -- phases ------------------------------------------------------------------------------
@dataclass
class PhaseSpec:
    """One phase: who sends what, for how long."""

    name: str
    seconds: float
    ingest_kinds: list[str] = field(default_factory=list)
    ingest_rate: float | None = None  # vectors/s in total; None: as fast as possible
    assign_rate: float | None = None  # requests/s; None: no /assign client
    sample_every: float = 1.0


def _warm_up(server: Server, args: argparse.Namespace) -> None:
    """JIT-compiled kernels, first iterations and every code path, outside the clock."""
    import httpx

    with httpx.Client(base_url=server.base, timeout=60) as http:
        for i, kind in enumerate(("npy", "octet", "json") * 3):
            body = encode_body(kind, synthetic(args.batch, args.dim, 900 + i))
            http.post("/samples", content=body, headers={"content-type": CONTENT_TYPES[kind]})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = http.get("/centroids")
            if r.status_code == 200 and r.json()["n_samples"] >= 9 * args.batch:
                break
            time.sleep(0.1)
        q = ",".join(["0"] * args.dim)
        for _ in range(200):
            http.get("/assign", params={"vector": q})


def _wait_caught_up(server: Server, deadline: float, timeout: float) -> tuple[float | None, ...]:
    """Seconds after ``deadline`` until the worker's store holds the whole log, and until
    it converged on it (None: not within ``timeout``).

    The last resource sample is taken once converged: no iteration holds a store buffer
    that a capacity doubling has just replaced, so the RSS is the data's.
    """
    give_up = time.monotonic() + timeout
    caught_up = None
    while time.monotonic() < give_up:
        stats = server.get_json("/stats")
        if caught_up is None and stats["N"] >= stats["n_logged"]:
            caught_up = max(0.0, time.monotonic() - deadline)
        if caught_up is not None and stats["converged"] and stats["N"] >= stats["n_logged"]:
            return caught_up, max(0.0, time.monotonic() - deadline)
        time.sleep(0.1)
    return caught_up, None


def wait_quiet(max_wait: float, threshold: float = 0.25, window: float = 3.0) -> dict[str, Any]:
    """Wait (up to ``max_wait`` s) until other programs use under ``threshold`` cores.

    The machine may be shared (tests, other benchmarks): a phase measured while something
    else takes a core says little. Returns the seconds waited and the load last seen.
    """
    started = time.monotonic()
    told = -1e9
    while True:
        a = _machine_busy_seconds()
        time.sleep(window)
        b = _machine_busy_seconds()
        load = None if a is None or b is None else (b - a) / window
        waited = time.monotonic() - started
        if load is None or load < threshold or waited >= max_wait:
            return {"waited_seconds": waited, "background_cores": load}
        if waited - told >= 60:
            told = waited
            print(f"  waiting for a quiet machine: other programs use {load:.2f} cores",
                  flush=True)  # fmt: skip


def _preload(server: Server, args: argparse.Namespace, vectors: int) -> None:
    """POST ``vectors`` vectors (raw float32, 4 connections), then wait for convergence."""
    if vectors <= 0:
        return
    requests = ingest_requests("octet", args.dim, args.batch, 4242)
    count = -(-vectors // args.batch)

    async def run() -> None:
        sent = 0

        async def one_connection() -> None:
            nonlocal sent
            conn = Connection(server.port)
            while sent < count:
                sent += 1
                status, body = await conn.request(requests[sent % len(requests)])
                if status != 202:
                    raise RuntimeError(f"preload refused: HTTP {status}: {body[:200]!r}")
            conn.close()

        await asyncio.gather(*(one_connection() for _ in range(4)))

    asyncio.run(run())
    _wait_caught_up(server, time.monotonic(), args.catch_up_timeout)


def run_phase(spec: PhaseSpec, args: argparse.Namespace) -> dict[str, Any]:
    """Start a server, warm it up, run ``spec``, stop it; what was measured."""
    quiet = wait_quiet(args.wait_quiet)
    server = Server(args)
    ctx = mp.get_context("spawn")
    try:
        server.wait_ready()
        _warm_up(server, args)
        _preload(server, args, args.preload)
        time.sleep(1.0)
        q = ctx.Queue()
        start = time.monotonic() + 3.0  # client processes start and encode before this
        deadline = start + spec.seconds
        common = {"port": server.port, "dim": args.dim, "batch": args.batch}
        procs = []
        if spec.ingest_kinds:
            n_procs = args.ingest_procs
            conns = args.ingest_conns if spec.ingest_rate is None else args.soak_conns
            per_conn = (
                None
                if spec.ingest_rate is None
                else spec.ingest_rate / args.batch / (n_procs * conns)
            )
            for p in range(n_procs):
                # Connection j of process p sends kinds[(p * conns + j) % len(kinds)].
                kinds = [
                    spec.ingest_kinds[(p * conns + j) % len(spec.ingest_kinds)]
                    for j in range(conns)
                ]
                cfg = common | {
                    "kinds": kinds,
                    "conns": conns,
                    "rate": per_conn,
                    "seed": 100 + p,
                    "start": start + p / max(1, n_procs) / max(per_conn or 1e9, 1e-9),
                    "deadline": deadline,
                }
                procs.append(ctx.Process(target=ingest_client, args=(cfg, q)))
            cfg = common | {
                "seed": 7,
                "start": start,
                "deadline": deadline,
                "interval": args.probe_interval,
                "poll_seconds": args.probe_poll_ms / 1000.0,
                "max_wait": 60.0,
            }
            procs.append(ctx.Process(target=probe_client, args=(cfg, q)))
        if spec.assign_rate:
            cfg = common | {
                "seed": 3,
                "conns": args.assign_conns,
                "rate": spec.assign_rate,
                "start": start,
                "deadline": deadline,
            }
            procs.append(ctx.Process(target=assign_client, args=(cfg, q)))
        for p in procs:
            p.start()
        time.sleep(max(0.0, start - time.monotonic()))
        sampler = Sampler(server, spec.sample_every)
        sampler.start()
        reports = [q.get(timeout=spec.seconds + 300) for _ in procs]
        for p in procs:
            p.join()
        catch_up, settled = _wait_caught_up(server, deadline, args.catch_up_timeout)
        samples = sampler.stop()
        stats = server.get_json("/stats")
        centroids = server.get_json("/centroids")
    finally:
        exit_code = server.stop()
    if args.raw:
        arrays = {}
        for i, r in enumerate(reports):
            for key in ("ends", "latencies"):
                arrays[f"{r['role']}{i}_{key}"] = np.asarray(r[key]) - (
                    start if key == "ends" else 0
                )
        # The phase's start on this machine's monotonic clock: raw times line up with
        # other recordings (e.g. /proc/stat) taken meanwhile.
        arrays["start_monotonic"] = np.asarray(start)
        np.savez_compressed(args.out / f"raw-{spec.name}.npz", **arrays)
    out = summarise(spec, args, start, deadline, reports, samples, stats, centroids, exit_code)
    # Redis forks for each rewrite of its append-only file (the child dumps the dataset).
    forks = [sm.get("redis_forks") for sm in samples if sm.get("redis_forks") is not None]
    out["redis_forks"] = (forks[-1] - forks[0]) if forks else None
    out["redis_latest_fork_ms"] = samples[-1].get("redis_latest_fork_ms")
    out["catch_up_seconds"] = catch_up
    out["converged_seconds"] = settled
    out["before_start"] = quiet
    cpu = out["cpu_cores_used"]
    if "machine" in cpu:
        cpu["other programs"] = cpu["machine"] - sum(
            cpu.get(key, 0.0) for key in ("server", "redis", "clients")
        )
    return out


# -- summaries ---------------------------------------------------------------------------
def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def _distribution(values: np.ndarray) -> dict[str, float | None]:
    """Median, p90, p99, p99.9 and max of ``values`` (None when empty)."""
    return {
        "median": _pct(values, 50),
        "p90": _pct(values, 90),
        "p99": _pct(values, 99),
        "p999": _pct(values, 99.9),
        "max": float(values.max()) if values.size else None,
    }


def _latency_ms(seconds: np.ndarray) -> dict[str, float | None]:
    return _distribution(seconds * 1000.0)


def _timeline(ends: np.ndarray, weights: np.ndarray, start: float, seconds: float) -> list[float]:
    """Per-second sums of ``weights`` by completion time over ``[start, start + seconds)``."""
    bins = np.arange(0.0, np.ceil(seconds) + 1e-9, 1.0)
    counts, _ = np.histogram(ends - start, bins=bins, weights=weights)
    return [float(c) for c in counts]


def _requests_summary(
    reports: list[dict[str, Any]], start: float, deadline: float
) -> dict[str, Any]:
    ends = np.concatenate([r["ends"] for r in reports]) if reports else np.zeros(0)
    lat = np.concatenate([r["latencies"] for r in reports]) if reports else np.zeros(0)
    vec = np.concatenate([r["vectors"] for r in reports]) if reports else np.zeros(0, np.int64)
    inside = (ends >= start) & (ends <= deadline)
    seconds = deadline - start
    errors = [e for r in reports for e in r["errors"]]
    return {
        "requests": int(inside.sum()),
        "requests_per_second": float(inside.sum() / seconds),
        "vectors": int(vec[inside].sum()),
        "vectors_per_second": float(vec[inside].sum() / seconds),
        "latency_ms": _latency_ms(lat[inside]),
        "errors": len(errors),
        "error_examples": errors[:5],
        "client_cpu_seconds": float(sum(r["cpu_seconds"] for r in reports)),
        "per_second": _timeline(
            ends[inside],
            vec[inside] if vec[inside].sum() else np.ones(int(inside.sum())),
            start,
            seconds,
        ),
    }


def summarise(
    spec: PhaseSpec,
    args: argparse.Namespace,
    start: float,
    deadline: float,
    reports: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    stats: dict[str, Any],
    centroids: dict[str, Any],
    exit_code: int,
) -> dict[str, Any]:
    """The phase's JSON record."""
    ingest = [r for r in reports if r["role"] in ("ingest", "probe")]
    assign = [r for r in reports if r["role"] == "assign"]
    probes = [r for r in reports if r["role"] == "probe"]
    seconds = deadline - start
    out: dict[str, Any] = {
        "name": spec.name,
        "seconds": seconds,
        "ingest_kinds": spec.ingest_kinds,
        "ingest_rate_target": spec.ingest_rate,
        "assign_rate_target": spec.assign_rate,
        "exit_code": exit_code,
    }
    if ingest:
        out["ingest"] = _requests_summary(ingest, start, deadline)
        by_kind = {}
        for kind in spec.ingest_kinds:
            own = [r for r in ingest if r["role"] == "ingest" and set(r["kinds"]) == {kind}]
            if own and len(set(spec.ingest_kinds)) > 1:
                by_kind[kind] = _requests_summary(own, start, deadline)["vectors_per_second"]
        out["ingest"]["vectors_per_second_by_kind"] = by_kind
    if assign:
        out["assign"] = _requests_summary(assign, start, deadline)
    if probes:
        store = np.asarray([x for p in probes for x in p["in_store"]])
        prefix_raw = [x for p in probes for x in p["in_prefix"]]
        prefix = np.asarray([x for x in prefix_raw if x is not None])
        out["delay_seconds"] = {
            "probes": int(store.size),
            "in_store": _distribution(store),
            "in_prefix": _distribution(prefix),
            "in_prefix_not_reached": sum(x is None for x in prefix_raw),
        }
    first, last = samples[0], samples[-1]
    inside = [s for s in samples if start - 0.5 <= s["t"] <= deadline + 0.5] or samples
    cpu = {}
    for proc in ("server", "worker", "redis", "machine"):
        a, b = inside[0].get(f"{proc}_cpu"), inside[-1].get(f"{proc}_cpu")
        if a is not None and b is not None and inside[-1]["t"] > inside[0]["t"]:
            cpu[proc] = (b - a) / (inside[-1]["t"] - inside[0]["t"])
    client_cpu = sum(r["cpu_seconds"] for r in reports)
    cpu["clients"] = client_cpu / seconds  # includes their start-up and encoding
    out["cpu_cores_used"] = cpu
    out["memory"] = memory_check(first, last, args, stats)
    out["samples"] = [
        {k: v for k, v in s.items() if k != "t"} | {"t": s["t"] - start} for s in samples
    ]
    out["final"] = {
        key: stats.get(key)
        for key in (
            "N", "b", "n_logged", "iteration", "converged", "phase", "skipped_share",
            "last_iteration_seconds",
        )
    } | {"version": centroids.get("version")}  # fmt: skip
    return out


def memory_check(
    first: dict[str, Any], last: dict[str, Any], args: argparse.Namespace, stats: dict[str, Any]
) -> dict[str, Any]:
    """RSS growth of the server and of redis-server against what the data explain.

    Expected bytes per vector (``d`` = dim, ``k`` clusters):

    - Redis: the log entry payload, ``4 d`` (plus a few bytes of entry fields);
    - server: the store row ``4 d`` + its insertion index 8, and for the samples in the
      prefix the worker's per-sample state: lower bounds ``4 k``, upper bound 8,
      squared distance 8, label 4 (+4 for the label array's spare capacity).
    """
    d, k = args.dim, args.k
    n0, n1 = first.get("n_logged") or 0, last.get("n_logged") or 0
    vectors = n1 - n0
    prefix = stats.get("b") or 0
    redis_expected = vectors * 4 * d
    # The prefix at the start was at most n0 (the warm-up), so its growth is >= prefix - n0.
    prefix_growth = max(0, prefix - n0)
    server_expected = vectors * (4 * d + 8) + prefix_growth * (4 * k + 8 + 8 + 4 + 4)
    out: dict[str, Any] = {"vectors_logged": vectors, "prefix_growth": prefix_growth}
    slack_fraction, slack_bytes = 0.15, 128 * 2**20
    explained = True
    for proc, expected in (("server", server_expected), ("redis", redis_expected)):
        a, b = first.get(f"{proc}_rss"), last.get(f"{proc}_rss")
        if a is None or b is None:
            continue
        growth = b - a
        ok = growth <= expected * (1 + slack_fraction) + slack_bytes
        explained &= ok
        out[proc] = {
            "rss_start": a,
            "rss_end": b,
            "growth": growth,
            "expected_from_data": expected,
            "ratio": growth / expected if expected else None,
            "explained": ok,
        }
    out["redis_used_memory_growth"] = (last.get("redis_used_memory") or 0) - (
        first.get("redis_used_memory") or 0
    )
    out["rule"] = (
        f"growth <= expected * {1 + slack_fraction:.2f} + {slack_bytes // 2**20} MiB, "
        "expected = vectors * 4d (Redis log) and vectors * (4d + 8) + prefix growth * "
        "(4k + 24) (store + worker state)"
    )
    out["explained"] = explained
    return out


# -- report ------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    """CPU, cores, memory, versions of everything on the request path."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1]) * 1024
    versions = {"python": platform.python_version()}
    for package in (
        "numpy", "numba", "fastapi", "starlette", "uvicorn", "httptools", "uvloop", "redis",
        "hiredis", "orjson", "pydantic",
    ):  # fmt: skip
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    with contextlib.suppress(Exception):
        from nmbatch.service.embedded_redis import find_redis_server

        out = subprocess.run(
            [str(find_redis_server()), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
        versions["redis-server"] = out.split("v=")[1].split()[0]
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {
        "cpu": cpu,
        "cores": cores,
        "memory_bytes": mem,
        "platform": platform.platform(),
        "versions": versions,
    }


def _f(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue: measured value and whether it is met."""
    phases = {p["name"]: p for p in result["phases"]}
    rows = []

    def add(what: str, measured: float | None, wanted: str, met: bool | None) -> None:
        rows.append({"target": what, "measured": measured, "wanted": wanted, "met": met})

    if "ingest-npy" in phases:
        v = phases["ingest-npy"]["ingest"]["vectors_per_second"]
        add("npy ingestion, vectors/s", v, ">= 200,000", v >= TARGETS["npy_vectors_per_second"])
    if "ingest-octet" in phases:
        v = phases["ingest-octet"]["ingest"]["vectors_per_second"]
        add("octet-stream ingestion, vectors/s", v, "(>= npy)", None)
    if "ingest-json" in phases:
        v = phases["ingest-json"]["ingest"]["vectors_per_second"]
        add("JSON ingestion, vectors/s", v, ">= 20,000", v >= TARGETS["json_vectors_per_second"])
    for name in ("assign", "soak", "assign-max"):
        if name in phases and "assign" in phases[name]:
            a, ing = phases[name]["assign"], phases[name].get("ingest", {})
            p99, rps = a["latency_ms"]["p99"], a["requests_per_second"]
            rate = ing.get("vectors_per_second", 0.0)
            judged = name != "assign-max"  # full-speed ingestion: reported, not judged
            fast = p99 is not None and p99 <= TARGETS["assign_p99_ms"]
            many = rps >= TARGETS["assign_requests_per_second"] * 0.995
            what = f"{name}: /assign p99 ms while ingesting {rate:,.0f} vectors/s"
            add(what, p99, "<= 10" if judged else "(reported)", fast if judged else None)
            rows_rps = ">= 1,000" if judged else "(reported)"
            add(f"{name}: /assign requests/s", rps, rows_rps, many if judged else None)
    if "soak" in phases:
        s = phases["soak"]
        errors = s.get("ingest", {}).get("errors", 0) + s.get("assign", {}).get("errors", 0)
        add(f"soak errors over {s['seconds']:.0f} s", errors, "0 over 300 s",
            errors == 0 and s["seconds"] >= 300)  # fmt: skip
        add("soak memory growth explained by the data", None, "yes", s["memory"]["explained"])
    total = sum(
        p.get("ingest", {}).get("errors", 0) + p.get("assign", {}).get("errors", 0)
        for p in result["phases"]
    )
    add("errors in all phases", total, "0", total == 0)
    return rows


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    v = m["versions"]
    loop = "uvloop" if v.get("uvloop") else "asyncio"
    a = result["args"]
    lines = [
        "# nmbatch service load benchmark",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {_gib(m['memory_bytes'])} GiB, "
        f"{m['platform']}. Server, Redis and load generator share these cores (loopback).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Server: one `python -m nmbatch` process (uvicorn: h11, {loop} loop, access log "
        f"off), its embedded redis-server (append-only file, appendfsync everysec, "
        f"rewrites without compression at 400% growth), k = {a['k']}, d = {a['dim']}, "
        f"`NMBATCH_WORKER_THREADS=1`, the worker iterating all along (its engine in "
        f"{'a child process' if a.get('worker_process', True) else 'the worker thread'}). "
        f"A fresh server per phase. "
        f"Batches of {a['batch']:,} vectors. Clients: asyncio over raw keep-alive sockets, "
        f"{a['ingest_procs']} ingesting process(es) x {a['ingest_conns']} connections at full "
        f"speed, /assign paced (open loop, latency from the scheduled send) over "
        f"{a['assign_conns']} connections, and a probe posting one npy batch every "
        f"{a['probe_interval']:g} s and polling `GET /centroids` every {a['probe_poll_ms']:g} ms.",
        "",
        "## Targets",
        "",
        "| target | measured | wanted | met |",
        "|---|---|---|---|",
    ]
    for row in result["targets"]:
        value = row["measured"]
        if value is None:
            shown = "-"
        elif isinstance(value, int) or value >= 100:
            shown = f"{value:,.0f}"
        else:
            shown = f"{value:,.2f}"
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        lines.append(f"| {row['target']} | {shown} | {row['wanted']} | {met} |")
    lines += [
        "",
        "## Phases",
        "",
        "| phase | s | ingest vectors/s | ingest req ms p50 / p99 | /assign req/s | "
        "/assign ms p50 / p99 / max | errors | CPU cores: server (the worker) / "
        "redis / clients / other programs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        ing, asg = p.get("ingest"), p.get("assign")
        errors = (ing or {}).get("errors", 0) + (asg or {}).get("errors", 0)
        cpu = p["cpu_cores_used"]
        lines.append(
            f"| {p['name']} | {p['seconds']:.0f} | "
            + (
                f"{ing['vectors_per_second']:,.0f} | {_f(ing['latency_ms']['median'], '{:.1f}')} "
                f"/ {_f(ing['latency_ms']['p99'], '{:.1f}')} | "
                if ing
                else "- | - | "
            )
            + (
                f"{asg['requests_per_second']:,.0f} | {_f(asg['latency_ms']['median'], '{:.2f}')}"
                f" / {_f(asg['latency_ms']['p99'], '{:.2f}')} / "
                f"{_f(asg['latency_ms']['max'], '{:.1f}')} | "
                if asg
                else "- | - | "
            )
            + f"{errors} | {_f(cpu.get('server'), '{:.2f}')} ({_f(cpu.get('worker'), '{:.2f}')})"
            f" / {_f(cpu.get('redis'), '{:.2f}')} / {_f(cpu.get('clients'), '{:.2f}')}"
            f" / {_f(cpu.get('other programs'), '{:.2f}')} |"
        )
    lines += [
        "",
        "Rates count the requests completed inside the phase's window; ingestion latency is "
        "per request (full speed: back to back; paced: from the scheduled send). CPU in cores "
        "over the window: the server process with its engine process (in brackets the "
        "worker: its thread and the engine process, which runs at niceness 10), "
        "redis-server with its append-only-file rewrite children, the client "
        "processes (their start-up and encoding included), and what the rest of the machine "
        "used meanwhile.",
        "",
        "## Ingestion to centroids",
        "",
        "Delay from a POST's `202` until `GET /centroids` shows a version computed with the "
        "acknowledged total in the worker's store (`n_samples`), and until the nested batch "
        "covers it (`batch_size`).",
        "",
        "| phase | probes | in store: median / p90 / max s | in prefix: median / p90 / max s "
        "| prefix not reached |",
        "|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        dl = p.get("delay_seconds")
        if not dl:
            continue
        s, pr = dl["in_store"], dl["in_prefix"]
        lines.append(
            f"| {p['name']} | {dl['probes']} | {_f(s['median'], '{:.3f}')} / "
            f"{_f(s['p90'], '{:.3f}')} / {_f(s['max'], '{:.3f}')} | "
            f"{_f(pr['median'], '{:.3f}')} / {_f(pr['p90'], '{:.3f}')} / "
            f"{_f(pr['max'], '{:.3f}')} | {dl['in_prefix_not_reached']} |"
        )
    lines += [
        "",
        "## Memory",
        "",
        "RSS at the start and end of each phase (after the warm-up), against the growth the "
        "data alone explain. "
        + (result["phases"][0]["memory"]["rule"] if result["phases"] else ""),
        "",
        "| phase | vectors logged | process | RSS start GiB | RSS end GiB | growth GiB | "
        "expected GiB | ratio | explained |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        mem = p["memory"]
        for proc in ("server", "redis"):
            if proc not in mem:
                continue
            r = mem[proc]
            lines.append(
                f"| {p['name']} | {mem['vectors_logged']:,} | {proc} | {_gib(r['rss_start'])} | "
                f"{_gib(r['rss_end'])} | {_gib(r['growth'])} | {_gib(r['expected_from_data'])} "
                f"| {_f(r['ratio'], '{:.2f}')} | {'yes' if r['explained'] else '**no**'} |"
            )
    lines += ["", "## After each phase", ""]
    for p in result["phases"]:
        f = p["final"]
        lines.append(
            f"- {p['name']}: N = {f['N']:,} (log {f['n_logged']:,}), b = {f['b']:,}, iterations "
            f"{f['iteration']:,}, centroid version {f['version']}, bounds skipped "
            f"{_f(f['skipped_share'], '{:.1%}')} of distances; the worker's store held the "
            f"whole log {_f(p.get('catch_up_seconds'), '{:.1f}')} s after the clients stopped "
            f"and it converged on it after {_f(p.get('converged_seconds'), '{:.1f}')} s; "
            f"Redis forked {_f(p.get('redis_forks'), '{:.0f}')} time(s) to rewrite its "
            f"append-only file (last fork {_f(p.get('redis_latest_fork_ms'), '{:.0f}')} ms); "
            f"server exit code on SIGTERM {p['exit_code']}."
        )
        for kind in ("ingest", "assign"):
            for example in p.get(kind, {}).get("error_examples", []):
                lines.append(f"  - {kind} error: `{example}`")
    if result.get("notes"):
        lines += ["", "## Notes", "", *result["notes"]]
    return "\n".join(lines) + "\n"


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value).__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--out", type=Path, required=True, help="folder for the results")
    add(
        "--phases",
        default="npy,octet,json,assign,assign-max,assign-alone,soak",
        help="comma-separated subset of npy, octet, json, assign, assign-max, assign-alone, soak",
    )
    add("--phase-seconds", type=float, default=20.0, help="length of each full-speed phase")
    add("--assign-seconds", type=float, default=20.0, help="length of each /assign phase")
    add("--soak-seconds", type=float, default=300.0)
    add("--soak-rate", type=float, default=25_000.0, help="soak ingestion, vectors/s (paced)")
    add("--assign-rate", type=float, default=1000.0, help="/assign requests/s (paced)")
    add(
        "--assign-ingest-rate",
        type=float,
        default=200_000.0,
        help="npy ingestion of the assign phase, vectors/s (paced; assign-max: full speed)",
    )
    add("--assign-alone-rate", type=float, default=2000.0, help="/assign of assign-alone")
    add("--dim", type=int, default=128)
    add("--batch", type=int, default=1000, help="vectors per request")
    add("--k", type=int, default=16)
    add("--ingest-procs", type=int, default=2, help="ingesting client processes")
    add("--ingest-conns", type=int, default=3, help="connections per process at full speed")
    add("--soak-conns", type=int, default=3, help="connections per process when paced")
    add("--assign-conns", type=int, default=8, help="connections of the /assign client")
    add("--probe-interval", type=float, default=2.0, help="seconds between delay probes")
    add("--probe-poll-ms", type=float, default=10.0, help="GET /centroids period of a probe")
    add(
        "--catch-up-timeout",
        type=float,
        default=180.0,
        help="seconds to wait after a phase for the worker to hold the whole log",
    )
    add(
        "--wait-quiet",
        type=float,
        default=900.0,
        help="before each phase, wait up to this long for other programs to leave the cores",
    )
    add(
        "--preload",
        type=int,
        default=0,
        help="vectors stored before each phase starts (a big store from the first second)",
    )
    add("--raw", action="store_true", help="save each request's end and latency (raw-*.npz)")
    add(
        "--engine",
        choices=("process", "thread"),
        default="process",
        help="where the server runs the worker's engine (NMBATCH_WORKER_PROCESS)",
    )
    args = parser.parse_args(argv)
    args.worker_process = args.engine == "process"

    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    specs = {
        "npy": PhaseSpec("ingest-npy", args.phase_seconds, ["npy"]),
        "octet": PhaseSpec("ingest-octet", args.phase_seconds, ["octet"]),
        "json": PhaseSpec("ingest-json", args.phase_seconds, ["json"]),
        "assign": PhaseSpec(
            "assign",
            args.assign_seconds,
            ["npy"],
            ingest_rate=args.assign_ingest_rate,
            assign_rate=args.assign_rate,
        ),
        "assign-max": PhaseSpec(
            "assign-max", args.assign_seconds, ["npy"], assign_rate=args.assign_rate
        ),
        "assign-alone": PhaseSpec(
            "assign-alone", args.assign_seconds, [], assign_rate=args.assign_alone_rate
        ),
        "soak": PhaseSpec(
            "soak",
            args.soak_seconds,
            ["npy", "octet", "json"],
            ingest_rate=args.soak_rate,
            assign_rate=args.assign_rate,
            sample_every=5.0,
        ),
    }
    unknown = set(wanted) - set(specs)
    if unknown:
        parser.error(f"unknown phase(s) {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": "python -m nmbatch.service.loadtest "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "targets_wanted": TARGETS,
        "phases": [],
    }
    for name in wanted:
        spec = specs[name]
        print(f"phase {spec.name}: {spec.seconds:g} s ...", flush=True)
        phase = run_phase(spec, args)
        result["phases"].append(phase)
        ing, asg = phase.get("ingest"), phase.get("assign")
        if ing:
            print(f"  ingest {ing['vectors_per_second']:,.0f} vectors/s, errors {ing['errors']}",
                  flush=True)  # fmt: skip
        if asg:
            lat = asg["latency_ms"]
            print(f"  assign {asg['requests_per_second']:,.0f} req/s, median "
                  f"{lat['median']:.2f} ms, p99 {lat['p99']:.2f} ms, errors {asg['errors']}",
                  flush=True)  # fmt: skip
        print(f"  CPU cores used: {phase['cpu_cores_used']}", flush=True)
        # Written after every phase, so an interrupted run keeps what it measured.
        result["targets"] = targets(result)
        (args.out / "loadtest.json").write_text(
            json.dumps(result, indent=1, default=_json_default) + "\n"
        )
        (args.out / "loadtest.md").write_text(markdown(result))
    print(markdown(result))
    failed_exit = any(p["exit_code"] != 0 for p in result["phases"])
    return 1 if failed_exit else 0


if __name__ == "__main__":
    sys.exit(main())
