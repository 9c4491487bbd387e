"""The server under test and the sampler of what it costs while a phase runs.

:class:`Server` starts ``python -m nmbatch`` (one uvicorn process, its embedded
``redis-server``, the worker iterating all along on ``NMBATCH_WORKER_THREADS``
(``--worker-threads``, default 1), access log off) in a temporary data folder on free
ports; :class:`Sampler` records its RSS, CPU time and Redis counters
(:meth:`Server.sample`) every few seconds in a thread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.loadtest.client import HOST
from benchmarks.loadtest.probes import (
    cpu_seconds,
    engine_pids,
    machine_busy_seconds,
    rss_bytes,
    worker_thread_cpu_seconds,
)
from nmbatch.service.embedded_redis import embedded_url, free_port

__all__ = ["Sampler", "Server"]


def _plus(a: float | None, b: float | None) -> float | None:
    """``a + b`` with None as 0, None when both are None."""
    return None if a is None and b is None else (a or 0) + (b or 0)


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
            "NMBATCH_WORKER_THREADS": str(getattr(args, "worker_threads", 1)),
            "NMBATCH_LOG_LEVEL": "warning",
            "NMBATCH_ACCESS_LOG": "false",
            "NMBATCH_WORKER_PROCESS": "true" if args.worker_process else "false",
            "NMBATCH_ENGINE_SCHED_IDLE": "true" if getattr(args, "engine_sched_idle", False)
            else "false",
        }
        optional = {
            "NMBATCH_RETENTION": getattr(args, "retention", "all"),
            "NMBATCH_MAX_SAMPLES": getattr(args, "max_samples", None),
            "NMBATCH_MAX_AGE_SECONDS": getattr(args, "max_age_seconds", None),
        }
        self.settings.update({k: str(v) for k, v in optional.items() if v is not None})
        for assignment in getattr(args, "set", None) or []:
            name, _, value = assignment.partition("=")
            if not name.startswith("NMBATCH_"):
                raise ValueError(f"--set {assignment!r}: a setting is NMBATCH_NAME=VALUE")
            self.settings[name] = value
        env.update(self.settings)
        repo = Path(__file__).resolve().parents[2]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "nmbatch"], env=env, cwd=repo)
        self.redis_pid: int | None = None
        self._redis = None

    @property
    def base(self) -> str:
        """The server's URL, ``http://127.0.0.1:<port>``."""
        return f"http://{HOST}:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until ``/readyz`` answers 200, then connect to its Redis.

        Raises RuntimeError when the server exits or is not ready within ``timeout`` s.
        """
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
        url = embedded_url(self.data_dir, self.redis_port, HOST)  # its secret, in data_dir
        self._redis = redis.Redis.from_url(url, socket_timeout=10)
        self.redis_pid = int(self._redis.info("server")["process_id"])

    def get_json(self, path: str) -> dict[str, Any]:
        """The JSON body of ``GET path``."""
        import httpx

        return httpx.get(f"{self.base}{path}", timeout=30).json()

    def sample(self) -> dict[str, Any]:
        """RSS and CPU time of both processes, Redis's own memory count, samples logged."""
        engines = engine_pids(self.proc.pid)
        engine_rss = sum(rss_bytes(e) or 0 for e in engines) if engines else None
        engine_cpu = sum(cpu_seconds(e) or 0.0 for e in engines) if engines else None
        out: dict[str, Any] = {
            "t": time.monotonic(),
            # The server with its engine process (which holds the store).
            "server_rss": _plus(rss_bytes(self.proc.pid), engine_rss),
            "redis_rss": rss_bytes(self.redis_pid),
            "server_cpu": _plus(cpu_seconds(self.proc.pid), engine_cpu),
            # The worker thread and the engine process it drives.
            "worker_cpu": _plus(worker_thread_cpu_seconds(self.proc.pid), engine_cpu),
            "engine_rss": engine_rss,
            # With the AOF rewrites Redis forks (reaped children count once they end).
            "redis_cpu": cpu_seconds(self.redis_pid, children=True),
            "machine_cpu": machine_busy_seconds(),
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
        """SIGTERM (SIGKILL after 180 s), remove the data folder; the exit code."""
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
        """Stop sampling, take a last sample; every sample taken, oldest first."""
        self._stop_event.set()
        self.join()
        self.samples.append(self.server.sample())
        return self.samples
