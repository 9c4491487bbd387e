"""The service under test: ``python -m nmbatch`` with its embedded Redis, maybe in a cgroup.

:class:`Service` starts the server as a subprocess with ``NMBATCH_*`` settings (embedded
Redis in a data folder, on ports it picks, access log off, one worker thread, the
caller's settings on top), optionally wrapped so that it enters a memory cgroup before it
starts anything (:meth:`benchmarks.soak.cgroup.MemoryCgroup.wrap`); its output goes to a log
file. Once ``/readyz`` answers 200 it connects to the embedded Redis (the port is a
setting the service is given, ``NMBATCH_EMBEDDED_REDIS_PORT``) and can count what the
sample log holds (:meth:`Service.log_rows`, :meth:`Service.meta`) for the check that
nothing acknowledged was lost.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.soak.cgroup import MemoryCgroup
from nmbatch.service.embedded_redis import embedded_url, free_port

__all__ = ["HOST", "REPO", "Service"]

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]

# Lines of the service's log kept in the results: start-up figures, warnings, errors,
# the engine's restarts and replays.
_KEPT = re.compile(
    r"capacity|maxmemory|replayed|retention|window|engine|WARNING|ERROR|CRITICAL|Traceback|"
    r"kernels loaded|OOM|killed",
    re.IGNORECASE,
)


_REPLAYED = re.compile(r"replayed (\d+) samples from the log in ([0-9.]+) s")


class Service:
    """``python -m nmbatch`` on free ports, its data in ``data_dir``.

    Parameters
    ----------
    settings : dict of str to str
        ``NMBATCH_*`` variables on top of the defaults below (the caller's win).
    data_dir : Path
        Data folder of the embedded Redis (kept between starts: a restart replays it).
    log_path : Path
        File the server's stdout and stderr go to (appended).
    cgroup : MemoryCgroup or None
        Memory cgroup the server (and so every process it starts) runs in.
    model : str
        ``NMBATCH_MODEL`` (Redis keys ``nmbatch:{model}:...``).
    """

    def __init__(
        self,
        settings: dict[str, str],
        data_dir: Path,
        log_path: Path,
        cgroup: MemoryCgroup | None = None,
        model: str = "default",
    ) -> None:
        self.port = free_port()
        self.redis_port = free_port()
        self.data_dir = data_dir
        self.log_path = log_path
        self.model = model
        self.settings = {
            "NMBATCH_PORT": str(self.port),
            "NMBATCH_DATA_DIR": str(data_dir),
            "NMBATCH_EMBEDDED_REDIS_PORT": str(self.redis_port),
            "NMBATCH_MODEL": model,
            "NMBATCH_SEED": "0",
            "NMBATCH_WORKER_THREADS": "1",
            "NMBATCH_LOG_LEVEL": "info",
            "NMBATCH_ACCESS_LOG": "false",
        } | settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
        env.update(self.settings)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "nmbatch"]
        if cgroup is not None:
            command = cgroup.wrap(command)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.redis_pid: int | None = None
        self.redis: Any = None
        self.started = time.monotonic()
        self.ready_seconds: float | None = None

    @property
    def base(self) -> str:
        """The server's URL, ``http://127.0.0.1:<port>``."""
        return f"http://{HOST}:{self.port}"

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Wait until ``/readyz`` answers 200, then connect to the embedded Redis.

        Raises RuntimeError when the server exits or is not ready within ``timeout`` s.
        """
        import httpx
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with code {self.proc.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the service was not ready within {timeout:g} s")
        self.ready_seconds = time.monotonic() - self.started
        url = embedded_url(self.data_dir, self.redis_port, HOST)  # its secret, in data_dir
        self.redis = redis.Redis.from_url(url, socket_timeout=60)
        self.redis_pid = int(self.redis.info("server")["process_id"])

    def get_json(self, path: str, timeout: float = 30.0) -> Any:
        """The JSON body of ``GET path``."""
        import httpx

        return httpx.get(f"{self.base}{path}", timeout=timeout).json()

    def meta(self) -> dict[str, str]:
        """The model's meta hash (``nmbatch:{model}:meta``), fields and values as text."""
        raw = self.redis.hgetall(f"nmbatch:{self.model}:meta")
        return {k.decode(): v.decode(errors="replace") for k, v in raw.items()}

    def log_rows(self, count: int = 16) -> dict[str, int]:
        """Rows and entries the sample log (``nmbatch:{model}:log``) holds now: the sum of
        the entries' ``n`` fields, read ``count`` entries (up to ``count`` MiB) at a time."""
        key = f"nmbatch:{self.model}:log"
        rows = entries = 0
        start = "-"
        while True:
            batch = self.redis.xrange(key, min=start, max="+", count=count)
            if not batch:
                break
            for _, fields in batch:
                rows += int(fields[b"n"])
            entries += len(batch)
            last = batch[-1][0].decode()
            start = "(" + last
            if len(batch) < count:
                break
        return {"rows": rows, "entries": entries, "xlen": int(self.redis.xlen(key))}

    def redis_info(self) -> dict[str, Any]:
        """A few lines of Redis's ``INFO``: memory, ``maxmemory``, persistence, forks."""
        info = self.redis.info()
        keys = (
            "used_memory",
            "used_memory_peak",
            "used_memory_rss",
            "maxmemory",
            "maxmemory_policy",
            "mem_fragmentation_ratio",
            "aof_enabled",
            "aof_current_size",
            "aof_base_size",
            "aof_rewrites",
            "aof_last_bgrewrite_status",
            "aof_last_write_status",
            "total_forks",
            "rejected_calls",
            "errorstats_OOM",
            "redis_version",
        )
        out = {key: info.get(key) for key in keys if key in info}
        with contextlib.suppress(Exception):
            errors = self.redis.info("errorstats")
            out["errorstats"] = {k: v.get("count") for k, v in errors.items()}
        return out

    def stop(self, timeout: float = 300.0) -> int:
        """SIGTERM (SIGKILL after ``timeout`` s); the exit code. The data folder stays."""
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.close()
            self.redis = None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        return code

    def replayed(self) -> tuple[int, float] | None:
        """Samples the worker replayed from the log at its last start and the seconds it
        took, from its log line ``replayed N samples from the log in S s``; None before."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        found = _REPLAYED.findall(text)
        return (int(found[-1][0]), float(found[-1][1])) if found else None

    def log_tail(self, n: int = 40) -> dict[str, list[str]]:
        """The last ``n`` lines of the server's log and of the embedded Redis's own log
        (``redis.log`` in the data folder), the data folder's path replaced by ``<data>``."""
        out = {}
        for name, path in (("service", self.log_path), ("redis", self.data_dir / "redis.log")):
            try:
                lines = path.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                lines = []
            out[name] = [line.replace(str(self.data_dir), "<data>") for line in lines]
        return out

    def log_excerpt(self, limit: int = 200) -> list[str]:
        """Lines of the server's log worth keeping (start-up figures, warnings, errors,
        engine restarts), with the data folder's path replaced by ``<data>``."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        kept = [line.replace(str(self.data_dir), "<data>") for line in lines if _KEPT.search(line)]
        return kept[:limit] + ([f"... {len(kept) - limit} more"] if len(kept) > limit else [])
