"""What processes and the machine cost, read from ``/proc`` (Linux).

RSS and CPU time of a process (with its children), of the server's worker thread and of
its engine process(es), the CPU time all cores spent busy, a wait for a quiet machine
before a phase, and the machine's description (CPU, cores, memory, versions) for the
report. A probe answers None where ``/proc`` does not have what it reads.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "cpu_seconds",
    "engine_pids",
    "machine",
    "machine_busy_seconds",
    "rss_bytes",
    "wait_quiet",
    "worker_thread_cpu_seconds",
]


def rss_bytes(pid: int | None) -> int | None:
    """Resident set size of ``pid`` in bytes (``VmRSS``)."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int | None, children: bool = False) -> float | None:
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
                seconds += cpu_seconds(int(child), children=True) or 0.0
    return seconds


def worker_thread_cpu_seconds(pid: int) -> float | None:
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


def engine_pids(pid: int) -> list[int]:
    """The server's engine process(es) (OS name ``nmbatch-engine``), children of ``pid``."""
    found = []
    with contextlib.suppress(OSError, ValueError):
        for task in Path(f"/proc/{pid}/task").iterdir():  # the worker thread started it
            for child in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{child}/comm").read_text().strip() == "nmbatch-engine":
                        found.append(int(child))
    return found


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores spent busy (not idle, not waiting for I/O) since boot."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + ticks[4]
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_quiet(max_wait: float, threshold: float = 0.25, window: float = 3.0) -> dict[str, Any]:
    """Wait (up to ``max_wait`` s) until other programs use under ``threshold`` cores.

    The machine may be shared (tests, other benchmarks): a phase measured while something
    else takes a core says little. Returns the seconds waited and the load last seen.
    """
    started = time.monotonic()
    told = -1e9
    while True:
        a = machine_busy_seconds()
        time.sleep(window)
        b = machine_busy_seconds()
        load = None if a is None or b is None else (b - a) / window
        waited = time.monotonic() - started
        if load is None or load < threshold or waited >= max_wait:
            return {"waited_seconds": waited, "background_cores": load}
        if waited - told >= 60:
            told = waited
            print(f"  waiting for a quiet machine: other programs use {load:.2f} cores",
                  flush=True)  # fmt: skip


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
        from nmbatch.service.embedded_redis import find_redis_server, redis_server_version

        version = redis_server_version(find_redis_server())
        versions["redis-server"] = ".".join(map(str, version)) if version else None
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
