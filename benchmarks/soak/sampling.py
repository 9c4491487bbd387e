"""What the service holds, once a second: memory of its processes, Redis, ``/stats``.

:func:`process_tree` lists a process and its descendants from ``/proc`` (children of
every thread, since the server's worker thread starts the engine); :func:`tree_rss` sums
their resident memory, leaving out whole subtrees by name (``redis-server`` and the forks
it makes to rewrite its append-only file are counted apart). :class:`Sampler` is a thread
that records, every ``every`` seconds: the RSS of the server with its engine process,
of the embedded ``redis-server``, Redis's ``used_memory``, the memory cgroup's usage,
``/readyz``'s status, the scalar fields of ``/stats``, the engine restarts of
``/metrics``, the traffic counters of the client processes, and how long the server's
event-loop thread waited for a CPU (:func:`scheduler_waits`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.loadtest.probes import cpu_seconds, machine_busy_seconds, rss_bytes
from benchmarks.soak.cgroup import MemoryCgroup

__all__ = [
    "ENGINE_NAME",
    "REDIS_NAME",
    "Proc",
    "Sampler",
    "cpu_by_process",
    "machine_times",
    "metric_values",
    "other_programs",
    "process_tree",
    "scheduler_waits",
    "tree_cpu_seconds",
    "tree_rss",
]

REDIS_NAME = "redis-server"
ENGINE_NAME = "nmbatch-engine"
_METRICS_EVERY = 5  # samples between two reads of /metrics


@dataclass(frozen=True)
class Proc:
    """One process of a tree: its pid, parent pid, OS name (``comm``) and RSS in bytes."""

    pid: int
    ppid: int
    name: str
    rss: int | None


def _children(pid: int) -> list[int]:
    """Children of every thread of ``pid`` (a thread other than the main one may have
    started some), from ``/proc/<pid>/task/<tid>/children``."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _name(pid: int) -> str | None:
    """The OS name of ``pid`` (``/proc/<pid>/comm``), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def process_tree(pid: int, exclude: tuple[str, ...] = ()) -> list[Proc]:
    """``pid`` and its descendants, parents before children; a process named in
    ``exclude`` is left out with all its descendants. Processes that exit meanwhile are
    skipped."""
    name = _name(pid)
    if name is None or name in exclude:
        return []
    out = [Proc(pid, 0, name, rss_bytes(pid))]
    queue = [pid]
    while queue:
        parent = queue.pop(0)
        for child in _children(parent):
            child_name = _name(child)
            if child_name is None or child_name in exclude:
                continue
            out.append(Proc(child, parent, child_name, rss_bytes(child)))
            queue.append(child)
    return out


def tree_rss(pid: int, exclude: tuple[str, ...] = (REDIS_NAME,)) -> dict[str, Any]:
    """RSS of ``pid`` with its descendants but those named in ``exclude`` (and theirs):
    ``total``, the engine processes' (``engine``, named :data:`ENGINE_NAME`), ``engines``
    (how many run), their pids (``engine_pids``) and ``processes``; ``total`` None when
    ``pid`` is gone."""
    tree = process_tree(pid, exclude)
    if not tree:
        return {"total": None, "engine": None, "engines": 0, "processes": 0, "engine_pids": []}
    engines = [p for p in tree if p.name == ENGINE_NAME]
    return {
        "total": sum(p.rss or 0 for p in tree),
        "engine": sum(p.rss or 0 for p in engines) if engines else None,
        "engines": len(engines),
        "processes": len(tree),
        "engine_pids": [p.pid for p in engines],
    }


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's command (paths cut to their last part, 80 characters) and CPU
    seconds so far: its own plus its reaped children's, from ``/proc/<pid>/stat``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            seconds = sum(int(x) for x in fields[11:15]) / tick
            words = (entry / "cmdline").read_bytes().split(b"\0")
            command = " ".join(w.decode(errors="replace").rsplit("/", 1)[-1] for w in words if w)
            out[int(entry.name)] = (command[:80] or _name(int(entry.name)) or "?", seconds)
    return out


_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_times() -> dict[str, float]:
    """Seconds all cores spent so far in each state of ``/proc/stat`` (user, nice,
    system, idle, iowait, irq, softirq, steal); empty where it cannot be read."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    return {name: int(v) / tick for name, v in zip(_STAT_FIELDS, fields, strict=False)}


def other_programs(
    before: dict[int, tuple[str, float]],
    after: dict[int, tuple[str, float]],
    ours: set[int],
    seconds: float,
    top: int = 8,
) -> list[dict[str, Any]]:
    """The processes not in ``ours`` that used the most CPU between two
    :func:`cpu_by_process` readings ``seconds`` apart: command and cores (processes that
    started meanwhile count from 0; those that ended, in their parent once reaped, with
    all their time: a parent that reaped a long-running child meanwhile can show more
    cores than the interval had)."""
    used = []
    for pid, (command, end) in after.items():
        if pid in ours or pid == 1:  # pid 1: the init of the machine, not a program
            continue
        start = before.get(pid, (command, 0.0))[1]
        if end - start > 0:
            used.append({"pid": pid, "command": command, "cores": (end - start) / seconds})
    used.sort(key=lambda row: -row["cores"])
    return used[:top]


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of ``pid`` and all its descendants (children of any of their threads),
    each with its reaped children; None when ``pid`` is gone."""
    tree = process_tree(pid)
    if not tree:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in tree:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick
    return total


def _scalars(document: dict[str, Any]) -> dict[str, Any]:
    """The numbers, booleans and short strings of a JSON object (``/stats``)."""
    out: dict[str, Any] = {}
    for key, value in document.items():
        short_text = isinstance(value, str) and len(value) <= 40
        if isinstance(value, bool | int | float) or value is None or short_text:
            out[key] = value
    return out


def metric_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of each named metric's samples in a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name in names:
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(value)
    return out


def scheduler_waits(pid: int) -> dict[str, float | None]:
    """Seconds so far that ``pid``'s main thread (the server's event loop) ran and waited
    on a run queue (``/proc/<pid>/schedstat``), and the machine's CPU and IO pressure
    stall totals (``/proc/pressure``, "some" and "full", seconds); None where unreadable."""
    out: dict[str, float | None] = {"loop_run": None, "loop_wait": None}
    with contextlib.suppress(OSError, ValueError, IndexError):
        run, wait = Path(f"/proc/{pid}/schedstat").read_text().split()[:2]
        out["loop_run"], out["loop_wait"] = int(run) / 1e9, int(wait) / 1e9
    for resource in ("cpu", "io"):
        for line in _read_lines(f"/proc/pressure/{resource}"):
            kind, *fields = line.split()
            total = dict(f.split("=") for f in fields).get("total")
            out[f"psi_{resource}_{kind}"] = int(total) / 1e6 if total is not None else None
    return out


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


class Sampler(threading.Thread):
    """Records the service's state every ``every`` seconds until :meth:`stop`.

    Parameters
    ----------
    base : str
        The server's URL.
    server_pid, redis_pid : int
        The server's process (its tree minus Redis is "server + engine") and Redis's.
    redis_client : redis.Redis
        A client of the embedded Redis (``INFO memory``).
    t0 : float
        ``time.monotonic()`` of the run's start: each sample's ``t`` counts from it.
    cgroup : MemoryCgroup or None
    counters : callable returning a dict, or None
        The client processes' counters (acknowledged vectors, statuses) at sample time.
    client_pids : tuple of int
        The client processes (their CPU time is sampled too).
    """

    def __init__(
        self,
        base: str,
        server_pid: int,
        redis_pid: int | None,
        redis_client: Any,
        t0: float,
        every: float = 1.0,
        cgroup: MemoryCgroup | None = None,
        counters: Callable[[], dict[str, Any]] | None = None,
        client_pids: tuple[int, ...] = (),
    ) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.base, self.server_pid, self.redis_pid = base, server_pid, redis_pid
        self.redis_client, self.t0, self.every = redis_client, t0, every
        self.cgroup, self.counters, self.client_pids = cgroup, counters, client_pids
        self.samples: list[dict[str, Any]] = []
        self._stop_event = threading.Event()
        self._http: Any = None
        self._n = 0
        self._client_seconds: dict[int, float] = {}

    def sample(self) -> dict[str, Any]:
        """One record of the service's state (see the module's docstring)."""
        import httpx

        if self._http is None:
            self._http = httpx.Client(base_url=self.base, timeout=5.0)
        t = time.monotonic() - self.t0
        tree = tree_rss(self.server_pid)
        out: dict[str, Any] = {
            "t": round(t, 3),
            "server_rss": tree["total"],
            "engine_rss": tree["engine"],
            "engines": tree["engines"],
            "redis_rss": rss_bytes(self.redis_pid),
        }
        if self.cgroup is not None:
            out["cgroup_usage"] = self.cgroup.usage()
            out["cgroup_rss"] = self.cgroup.anonymous()
        with contextlib.suppress(Exception):
            out["redis_used_memory"] = int(self.redis_client.info("memory")["used_memory"])
            persistence = self.redis_client.info("persistence")
            out["redis_rewriting"] = int(persistence.get("aof_rewrite_in_progress", 0))
            out["redis_forks"] = int(self.redis_client.info("stats").get("total_forks", 0))
        # CPU seconds so far of the server process (its threads), its engine processes and
        # redis-server with the rewrite forks it reaped.
        out["cpu"] = {
            "server": cpu_seconds(self.server_pid),
            "engine": sum(cpu_seconds(p) or 0.0 for p in tree["engine_pids"]),
            "redis": cpu_seconds(self.redis_pid, children=True),
            # The server's whole tree, the client processes and every core of the machine:
            # the machine less the other two is what other programs (and the kernel) took.
            "service": tree_cpu_seconds(self.server_pid),
            "clients": self._clients_cpu(),
            "machine": machine_busy_seconds(),
        }
        out["sched"] = scheduler_waits(self.server_pid)
        try:
            out["readyz"] = self._http.get("/readyz").status_code
        except Exception:  # timeout, refused: the service did not answer
            out["readyz"] = 0
        try:
            started = time.monotonic()
            response = self._http.get("/stats")
            out["stats_ms"] = round((time.monotonic() - started) * 1000.0, 2)
            if response.status_code == 200:
                out["stats"] = _scalars(response.json())
        except Exception:
            out["stats"] = None
        if self._n % _METRICS_EVERY == 0:
            with contextlib.suppress(Exception):
                text = self._http.get("/metrics").text
                names = ("nmbatch_engine_restarts_total", "nmbatch_redis_errors_total")
                out["metrics"] = metric_values(text, names)
        self._n += 1
        if self.counters is not None:
            out["traffic"] = self.counters()
        return out

    def _clients_cpu(self) -> float:
        """CPU seconds of the client processes so far; one that has exited counts with
        the last figure read while it ran."""
        for pid in self.client_pids:
            seconds = cpu_seconds(pid)
            if seconds is not None:
                self._client_seconds[pid] = seconds
        return sum(self._client_seconds.values())

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stop_event.is_set():
            self.samples.append(self.sample())
            next_at = max(next_at + self.every, time.monotonic())
            self._stop_event.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> list[dict[str, Any]]:
        """Stop sampling, take a last sample; every sample, oldest first."""
        self._stop_event.set()
        self.join()
        with contextlib.suppress(Exception):
            self.samples.append(self.sample())
        if self._http is not None:
            self._http.close()
        return self.samples
