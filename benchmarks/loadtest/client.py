"""The load generator: request bytes and the client processes that send them.

The clients are small asyncio programs speaking HTTP/1.1 over raw keep-alive sockets
(:class:`Connection`), with every request encoded before the clock starts, so they take
little of the cores they share with the server. Each client process runs one of
:func:`ingest_client` (``POST /samples`` back to back or paced), :func:`assign_client`
(paced single-vector ``GET /assign``) or :func:`probe_client` (ingestion-to-centroids
delays) and puts what it saw (:meth:`Recorder.report`) on a queue. A writer at full
speed answered with ``Retry-After`` (a write shed, ``503``) waits that long before its
next request on that connection, as the project's client does.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

__all__ = [
    "CONTENT_TYPES",
    "HOST",
    "Connection",
    "Recorder",
    "assign_client",
    "assign_requests",
    "encode_body",
    "http_request",
    "ingest_client",
    "ingest_requests",
    "probe_client",
    "synthetic",
]

HOST = "127.0.0.1"
CONTENT_TYPES = {
    "npy": "application/x-npy",
    "octet": "application/octet-stream",
    "json": "application/json",
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
        self.retry_after: float | None = None  # of the last answer, if it had one

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
        k = lower.find(b"\r\nretry-after:")
        self.retry_after = None
        if k >= 0:
            value = lower[k + 14 : lower.index(b"\r\n", k + 2)].strip()
            self.retry_after = float(value) if value.isdigit() else None
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
        """The body of a ``Transfer-Encoding: chunked`` response, chunks joined."""
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
        """Close the socket; the next request opens a new one."""
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
    shed: int = 0  # writes answered 503 `overloaded`: shed by design, not errors
    shed_behind: int = 0  # of them, shed because the worker was behind by its hand-off

    def shed_one(self, body: bytes) -> None:
        """A write answered 503 ``overloaded`` with ``body`` (its problem document)."""
        self.shed += 1
        self.shed_behind += b'"behind_bytes"' in body

    def ok(self, end: float, latency: float, vectors: int) -> None:
        """A 2xx answer at ``end`` (monotonic s), ``latency`` s, carrying ``vectors``."""
        self.ends.append(end)
        self.latencies.append(latency)
        self.vectors.append(vectors)

    def fail(self, end: float, what: str) -> None:
        """A failed request at ``end``: ``what`` went wrong (kept to 300 characters)."""
        self.errors.append(f"{end:.3f} {what}"[:300])

    def report(self) -> dict[str, Any]:
        """Arrays ``ends``, ``latencies`` (float64, s) and ``vectors`` (int64), one entry a
        successful request; the errors; the CPU seconds this process used."""
        times = os.times()
        return {
            "ends": np.asarray(self.ends),
            "latencies": np.asarray(self.latencies),
            "vectors": np.asarray(self.vectors, dtype=np.int64),
            "errors": self.errors,
            "shed": self.shed,
            "shed_behind": self.shed_behind,
            "cpu_seconds": times.user + times.system,
        }


async def _sleep_until(t: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``t`` (no wait when past)."""
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
            if status == 503 and b"problem:overloaded" in body:
                rec.shed_one(body)  # the server protecting its reads (NMBATCH_WRITE_SHED_LAG_MS)
            else:
                rec.fail(end, f"HTTP {status}: {body[:200]!r}")
            if conn.retry_after is not None and rate is None:
                # As the project's client does: a shed write waits before it is sent again.
                await asyncio.sleep(max(0.0, min(conn.retry_after, deadline - end)))


def _run_async(coro_factory: Callable[[], Any]) -> None:
    """Run the coroutine ``coro_factory()`` on uvloop when installed, else asyncio."""
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
            if status == 503 and b"problem:overloaded" in body:
                rec.shed_one(body)  # by design: sent again after Retry-After, as the client does
                next_at = acked + (writer.retry_after or 1.0)
                continue
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
