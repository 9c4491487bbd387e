"""The soak's traffic: paced ``POST /samples`` of ``.npy`` batches and paced ``/assign``.

Both run in client processes of their own (``spawn``), over the load benchmark's raw
keep-alive HTTP/1.1 connections (:class:`benchmarks.loadtest.client.Connection`) with every
request encoded before the clock starts. :func:`paced` is the open loop both use: the
``i``-th request is due at ``start + i / rate``; it goes out on the first idle
connection once due, and its latency counts from when it was due, so a server that
stalls cannot hide behind a client that waits (no coordinated omission). With no rate,
requests go back to back on every connection (closed loop).

:func:`ingest_process` sends ``total // batch`` batches (or fewer: it stops
``after_full_seconds`` after its first ``507``), :func:`assign_process` sends single-vector
``GET /assign`` until told to stop. Each keeps running totals in a shared array (read by
the sampler every second, :data:`INGEST_COUNTERS`, :data:`ASSIGN_COUNTERS`) and puts its
per-request record on a queue at the end (:meth:`Record.arrays`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from benchmarks.loadtest.client import (
    Connection,
    assign_requests,
    encode_body,
    http_request,
    synthetic,
)

__all__ = [
    "ASSIGN_COUNTERS",
    "INGEST_COUNTERS",
    "Record",
    "assign_process",
    "counters_dict",
    "due_time",
    "ingest_process",
    "ingest_requests",
    "paced",
]

INGEST_COUNTERS = ("sent", "done", "acked_vectors", "s202", "s507", "s_other", "s_transport")
"""Names of the ingest client's shared counters, in order."""
ASSIGN_COUNTERS = ("sent", "done", "ok", "errors")
"""Names of the ``/assign`` client's shared counters, in order."""

_TRANSPORT = 0  # status recorded for a request that got no HTTP answer
_EXAMPLES = 5  # error bodies kept per status


def due_time(start: float, rate: float | None, i: int) -> float | None:
    """When the ``i``-th request (from 0) of an open loop at ``rate`` requests/s from
    ``start`` is due; None for a closed loop (``rate`` None or 0: as soon as possible)."""
    if not rate:
        return None
    return start + i / rate


def counters_dict(names: tuple[str, ...], shared: Any) -> dict[str, int]:
    """The shared counters (a ``multiprocessing.Array``) by name."""
    return dict(zip(names, list(shared), strict=True))


@dataclass
class Record:
    """Per request: when it was due, when its answer ended (monotonic s), its status
    (0: no answer), and for ``POST /samples`` the accepted count and the model's
    ``n_samples`` the answer gave (-1 when none)."""

    due: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    n_samples: list[int] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, due: float, end: float, status: int, body: bytes) -> tuple[int, int]:
        """Record one answer; its ``(accepted, n_samples)`` read from the body's JSON."""
        accepted = n_samples = -1
        if status in (202, 507):
            with contextlib.suppress(Exception):
                doc = orjson.loads(body)
                accepted = int(doc.get("accepted", 0)) if status == 202 else 0
                n_samples = int(doc.get("n_samples", -1))
        if status not in (200, 202):
            kept = self.examples.setdefault(str(status), [])
            if len(kept) < _EXAMPLES:
                kept.append(body[:300].decode("latin-1"))
        self.due.append(due)
        self.end.append(end)
        self.status.append(status)
        self.accepted.append(accepted)
        self.n_samples.append(n_samples)
        return accepted, n_samples

    def arrays(self) -> dict[str, Any]:
        """``due``, ``end`` (float64 s), ``status`` (int16), ``accepted`` (int32),
        ``n_samples`` (int64), one entry per request in completion order; examples; the
        CPU seconds this process used (``cpu_seconds``)."""
        times = os.times()
        return {
            "cpu_seconds": times.user + times.system,
            "due": np.asarray(self.due, dtype=np.float64),
            "end": np.asarray(self.end, dtype=np.float64),
            "status": np.asarray(self.status, dtype=np.int16),
            "accepted": np.asarray(self.accepted, dtype=np.int32),
            "n_samples": np.asarray(self.n_samples, dtype=np.int64),
            "examples": self.examples,
        }


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def paced(
    request_of: Callable[[int], bytes],
    n: int | None,
    rate: float | None,
    conns: list[Connection],
    start: float,
    on_answer: Callable[[int, float, float, int, bytes], None],
    should_stop: Callable[[], bool] = lambda: False,
    timeout: float = 60.0,
) -> int:
    """Send ``request_of(i)`` for ``i = 0, 1, ...`` (``n`` of them, or until
    ``should_stop()``) over ``conns``, open loop at ``rate`` requests/s from ``start``
    (:func:`due_time`), or back to back when ``rate`` is None or 0.

    ``on_answer(i, due, end, status, body)`` is called for each request (``status`` 0
    when the connection failed or the answer took over ``timeout`` s); ``due`` is when
    it was due (closed loop: when it was sent). Returns the number of requests sent.
    """
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for conn in conns:
        idle.put_nowait(conn)
    pending: set[asyncio.Task[None]] = set()

    async def one(i: int, conn: Connection, due: float) -> None:
        try:
            status, body = await asyncio.wait_for(conn.request(request_of(i)), timeout)
        except (
            TimeoutError,
            OSError,
            EOFError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ) as exc:
            conn.close()
            status, body = _TRANSPORT, f"{type(exc).__name__}: {exc}".encode()
        on_answer(i, due, time.monotonic(), status, body)
        idle.put_nowait(conn)

    await _sleep_until(start)
    i = 0
    while (n is None or i < n) and not should_stop():
        due = due_time(start, rate, i)
        if due is not None:
            await _sleep_until(due)
        conn = await idle.get()
        if should_stop():
            break
        task = asyncio.create_task(one(i, conn, time.monotonic() if due is None else due))
        pending.add(task)
        task.add_done_callback(pending.discard)
        i += 1
    if pending:
        await asyncio.gather(*pending)
    return i


def _run(coro_factory: Callable[[], Any]) -> Any:
    """Run ``coro_factory()`` on uvloop when installed, else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro_factory())
    return uvloop.run(coro_factory())


def ingest_requests(dim: int, batch: int, seed: int, count: int) -> list[bytes]:
    """``count`` distinct ``POST /samples`` requests of ``batch`` ``.npy`` vectors each
    (``float32``, dimension ``dim``: :func:`benchmarks.loadtest.client.synthetic`)."""
    return [
        http_request(
            "POST",
            "/samples",
            encode_body("npy", synthetic(batch, dim, seed * 1000 + i)),
            {"Content-Type": "application/x-npy"},
        )
        for i in range(count)
    ]


def ingest_process(cfg: dict[str, Any], counters: Any, q: Any) -> None:
    """Client process: ``cfg['total'] // cfg['batch']`` batches at ``cfg['rate']``
    vectors/s (None: back to back) over ``cfg['conns']`` connections; stops sending
    ``cfg['after_full_seconds']`` after the first ``507`` (None: never). Puts
    ``{"role": "ingest", **Record.arrays()}`` on ``q``."""
    batch = cfg["batch"]
    requests = ingest_requests(cfg["dim"], batch, cfg["seed"], cfg["bodies"])
    rec = Record()
    first_full: list[float] = []
    index = {name: j for j, name in enumerate(INGEST_COUNTERS)}
    after_full = cfg.get("after_full_seconds")

    def on_answer(i: int, due: float, end: float, status: int, body: bytes) -> None:
        accepted, _ = rec.add(due, end, status, body)
        counters[index["done"]] += 1
        if status == 202:
            counters[index["s202"]] += 1
            counters[index["acked_vectors"]] += max(0, accepted)
        elif status == 507:
            counters[index["s507"]] += 1
            if not first_full:
                first_full.append(end)
        elif status == _TRANSPORT:
            counters[index["s_transport"]] += 1
        else:
            counters[index["s_other"]] += 1

    def should_stop() -> bool:
        full = (
            after_full is not None
            and first_full
            and (time.monotonic() - first_full[0] >= after_full)
        )
        return bool(full) or time.monotonic() >= cfg["deadline"]

    def request_of(i: int) -> bytes:
        counters[index["sent"]] += 1
        return requests[i % len(requests)]

    async def run() -> None:
        conns = [Connection(cfg["port"]) for _ in range(cfg["conns"])]
        rate = cfg["rate"] / batch if cfg["rate"] else None
        await paced(
            request_of,
            cfg["total"] // batch,
            rate,
            conns,
            cfg["start"],
            on_answer,
            should_stop,
            timeout=cfg["timeout"],
        )
        for c in conns:
            c.close()

    _run(run)
    q.put({"role": "ingest", **rec.arrays()})


def assign_process(cfg: dict[str, Any], counters: Any, stop: Any, q: Any) -> None:
    """Client process: single-vector ``GET /assign?vector=...`` at ``cfg['rate']``
    requests/s over ``cfg['conns']`` connections until ``stop`` (an event) is set or
    ``cfg['deadline']``. Puts ``{"role": "assign", **Record.arrays()}`` on ``q``."""
    requests = assign_requests(cfg["dim"], cfg["seed"])
    rec = Record()
    index = {name: j for j, name in enumerate(ASSIGN_COUNTERS)}

    def on_answer(i: int, due: float, end: float, status: int, body: bytes) -> None:
        rec.add(due, end, status, body)
        counters[index["done"]] += 1
        counters[index["ok" if status == 200 else "errors"]] += 1

    def request_of(i: int) -> bytes:
        counters[index["sent"]] += 1
        return requests[i % len(requests)]

    def should_stop() -> bool:
        return stop.is_set() or time.monotonic() >= cfg["deadline"]

    async def run() -> None:
        conns = [Connection(cfg["port"]) for _ in range(cfg["conns"])]
        await paced(
            request_of,
            None,
            cfg["rate"],
            conns,
            cfg["start"],
            on_answer,
            should_stop,
            timeout=cfg["timeout"],
        )
        for c in conns:
            c.close()

    _run(run)
    q.put({"role": "assign", **rec.arrays()})
