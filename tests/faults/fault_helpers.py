"""Helpers of the fault tests: tagged batches, a ledger of answers, ingestion threads,
service processes, and the check that the Redis log holds what was acknowledged.

Every batch is tagged: coordinate 0 of each row is the batch id, coordinate 1 the row's
index in the batch. Reading the log back tells exactly which batches are stored, and
whether any is stored partly or twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from nmbatch.service.embedded_redis import EmbeddedRedis, free_port
from nmbatch.service.storage import ModelKeys, decode_chunk
from tests.testkit import npy_bytes, stop_process, wait_until

REPO = Path(__file__).resolve().parents[2]

__all__ = [
    "REPO",
    "BackgroundLoop",
    "Ingestor",
    "Ledger",
    "ServiceProcess",
    "check_log_against_ledger",
    "http_post",
    "tagged_batch",
]


class BackgroundLoop:
    """A daemon thread running ``loop()`` between ``__enter__`` and ``__exit__``.

    ``loop()`` runs until ``stopping`` is set; ``__exit__`` sets it, joins the thread
    (10 s at most) and calls ``close()``.
    """

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the loop used (nothing by default)."""

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.close()


CENTRES = np.array([[0.0] * 6, [50.0] + [0.0] * 5, [0.0, 50.0] + [0.0] * 4], dtype=np.float32)


def tagged_batch(batch_id: int, rows: int, rng: np.random.Generator, dim: int = 8) -> np.ndarray:
    """``(rows, dim)`` float32: column 0 the batch id, column 1 the row index, then blobs."""
    X = np.empty((rows, dim), dtype=np.float32)
    X[:, 0] = batch_id
    X[:, 1] = np.arange(rows)
    centres = CENTRES[rng.integers(0, len(CENTRES), rows), : dim - 2]
    X[:, 2:] = centres + rng.normal(0.0, 1.0, size=(rows, dim - 2))
    return X


@dataclass
class Ledger:
    """What each batch's ``POST /samples`` got: a 2xx, a refusal, or no answer."""

    rows: dict[int, int] = field(default_factory=dict)  # batch id -> rows sent
    acked: set[int] = field(default_factory=set)
    refused: dict[int, int] = field(default_factory=dict)  # batch id -> status
    unknown: set[int] = field(default_factory=set)  # no answer (transport error)
    problems: list[dict[str, Any]] = field(default_factory=list)  # 503 answers seen
    lock: threading.Lock = field(default_factory=threading.Lock)
    _next: int = 1

    def new_id(self, rows: int) -> int:
        with self.lock:
            batch_id = self._next
            self._next += 1
            self.rows[batch_id] = rows
            return batch_id

    def record(self, batch_id: int, status: int | None, headers: Any = None, body: Any = None):
        with self.lock:
            if status is None:
                self.unknown.add(batch_id)
            elif 200 <= status < 300:
                self.acked.add(batch_id)
            else:
                self.refused[batch_id] = status
                if status == 503:
                    self.problems.append(
                        {"headers": dict(headers or {}), "body": body, "at": time.monotonic()}
                    )

    def acked_rows(self) -> int:
        with self.lock:
            return sum(self.rows[b] for b in self.acked)


PostFn = Callable[[bytes], tuple[int, Any, Any]]


class Ingestor:
    """Threads posting tagged ``.npy`` batches until stopped, recording every answer.

    ``post(body) -> (status, headers, json body or None)``; an exception means no answer.
    """

    def __init__(
        self,
        post: PostFn,
        ledger: Ledger,
        *,
        threads: int = 2,
        sizes: tuple[int, ...] = (50, 200),
        dim: int = 8,
        seed: int = 0,
        pause: float = 0.0,
    ) -> None:
        self.post, self.ledger, self.sizes, self.dim, self.pause = post, ledger, sizes, dim, pause
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(seed + i,), daemon=True)
            for i in range(threads)
        ]

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not self.stopping.is_set():
            rows = int(self.sizes[rng.integers(0, len(self.sizes))])
            batch_id = self.ledger.new_id(rows)
            body = npy_bytes(tagged_batch(batch_id, rows, rng, self.dim))
            try:
                status, headers, doc = self.post(body)
            except Exception:  # no answer: the process died, the connection broke
                self.ledger.record(batch_id, None)
                time.sleep(0.02)
                continue
            self.ledger.record(batch_id, status, headers, doc)
            if status >= 300:
                time.sleep(0.02)
            elif self.pause:
                time.sleep(self.pause)

    def __enter__(self) -> Ingestor:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(60)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def logged_batches(client: redis.Redis, model: str) -> tuple[dict[int, np.ndarray], int]:
    """Rows of the model's log grouped by batch id (column 0), and the total row count."""
    entries = client.xrange(ModelKeys(model).log)
    if not entries:
        return {}, 0
    rows = np.concatenate([decode_chunk(fields) for _, fields in entries])
    ids = rows[:, 0].astype(np.int64)
    order = np.argsort(ids, kind="stable")
    batches = {}
    for batch_id, part in zip(*_split_by(ids[order], rows[order]), strict=True):
        batches[int(batch_id)] = part
    return batches, int(rows.shape[0])


def _split_by(ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    unique, starts = np.unique(ids, return_index=True)
    return unique, np.split(rows, starts[1:])


def check_log_against_ledger(client: redis.Redis, model: str, ledger: Ledger) -> int:
    """Assert: every acknowledged batch is stored once and whole; any other stored batch
    (no answer, or a 503 whose write may have gone through) is whole too; refused batches
    other than 503 are absent; the meta counter equals the rows. Returns the rows.
    """
    batches, total = logged_batches(client, model)
    with ledger.lock:
        acked, unknown = set(ledger.acked), set(ledger.unknown)
        refused, rows = dict(ledger.refused), dict(ledger.rows)
    missing = sorted(acked - set(batches))
    assert not missing, f"acknowledged batches lost: {missing[:10]} ({len(missing)})"
    foreign = sorted(set(batches) - set(rows))
    assert not foreign, f"rows of batches never sent: {foreign[:10]}"
    for batch_id, part in batches.items():
        expected = rows[batch_id]
        assert part.shape[0] == expected, (
            f"batch {batch_id} is stored with {part.shape[0]} of its {expected} rows"
        )
        np.testing.assert_array_equal(np.sort(part[:, 1]), np.arange(expected))
        assert batch_id in acked or batch_id in unknown or refused.get(batch_id) == 503, (
            f"batch {batch_id} was refused with {refused.get(batch_id)} but is stored"
        )
    counted = int(client.hget(ModelKeys(model).meta, "n_samples") or 0)
    assert counted == total, f"meta n_samples {counted} != {total} rows in the log"
    return total


# -- service processes ---------------------------------------------------------------------
class ServiceProcess:
    """``python -m nmbatch`` on a free port with ``NMBATCH_*`` settings; logs to a file."""

    def __init__(self, tmp: Path, name: str, **settings: Any) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"{name}.log"
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServiceProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
        env["PYTHONPATH"] = str(REPO)
        env["NMBATCH_PORT"] = str(self.port)
        env["NMBATCH_LOG_LEVEL"] = "warning"
        env.update({f"NMBATCH_{k.upper()}": str(v) for k, v in self.settings.items()})
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nmbatch"],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.base + path, timeout=kwargs.pop("timeout", 10), **kwargs)

    def ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for ``/readyz`` 200; returns its document."""

        def probe() -> dict[str, Any] | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"service exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                response = self.get("/readyz", timeout=3)
            except httpx.TransportError:
                return None
            return response.json() if response.status_code == 200 else None

        return wait_until(probe, timeout, f"{self.base}/readyz")

    def role(self) -> str | None:
        try:
            return self.get("/readyz", timeout=3).json().get("role")
        except (httpx.TransportError, ValueError):
            return None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """``kill -9`` and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def close(self) -> None:
        """Stop whatever state it is in (SIGCONT first, in case it was frozen)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        stop_process(self.proc, 20)


def http_post(base: str) -> PostFn:
    """A thread-local httpx poster of ``.npy`` bodies to ``{base}/samples``."""
    local = threading.local()

    def post(body: bytes) -> tuple[int, Any, Any]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=base, timeout=20)
        response = client.post(
            "/samples", content=body, headers={"content-type": "application/x-npy"}
        )
        doc = response.json() if response.content else None
        return response.status_code, response.headers, doc

    return post


def stop_redis(server: EmbeddedRedis, how: str) -> None:
    """Take ``server`` away: ``"shutdown"`` (it flushes the append-only file, then exits)
    or ``"kill -9"``; returns once the process is gone."""
    assert server.process is not None
    if how == "shutdown":
        admin = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
        admin.shutdown()
        admin.close()
    else:
        server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    server.stop()
