"""A cgroup-v1 memory cgroup for the service under test, and the kernel's OOM reports.

:class:`MemoryCgroup` creates a child of the memory controller's hierarchy
(``/sys/fs/cgroup/memory`` by default; needs root), writes its ``memory.limit_in_bytes``,
and wraps the service's command (:meth:`MemoryCgroup.wrap`) in a shell that writes its own
pid to the cgroup's ``cgroup.procs`` and then ``exec``\\ s the command: the service, and
every process it starts afterwards (the engine, ``redis-server``, Redis's rewrite forks),
run inside the limit from their first instruction. :meth:`MemoryCgroup.read` returns the
counters (usage, peak usage, ``failcnt``, the OOM killer's ``oom_kill`` count of
``memory.oom_control``, a few ``memory.stat`` lines); :meth:`MemoryCgroup.remove` removes
the folder once its processes have exited.

:func:`oom_reports` finds the kernel log's OOM lines (``dmesg``) that appeared since a
given line count (:func:`kernel_log`). :func:`parse_size` reads ``7g``, ``6.5GiB``,
``512m`` or a byte count.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = [
    "MEMORY_ROOT",
    "MemoryCgroup",
    "cgroup_name",
    "kernel_log",
    "oom_reports",
    "parse_keyed",
    "parse_size",
]

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
"""Mount point of the cgroup-v1 memory controller."""

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)

# memory.stat lines worth keeping (bytes): anonymous memory, page cache, shared memory,
# file pages mapped, dirty and under writeback, and the hierarchy's totals.
_STAT_KEYS = (
    "rss",
    "cache",
    "shmem",
    "mapped_file",
    "dirty",
    "writeback",
    "total_rss",
    "total_cache",
    "hierarchical_memory_limit",
)

_OOM_LINE = re.compile(
    r"out of memory|oom-kill|oom_reaper|killed process|invoked oom-killer", re.IGNORECASE
)


def parse_size(text: str) -> int:
    """Bytes of ``text``: a number with an optional binary unit (``k``, ``m``, ``g``,
    ``t``, with or without ``b``/``ib``), e.g. ``7g``, ``6.5GiB``, ``512M``, ``1000``.

    Raises ValueError for anything else.
    """
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (e.g. 7g, 6.5GiB, 512m, 1000000)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_keyed(text: str) -> dict[str, int]:
    """``name value`` lines (``memory.stat``, ``memory.oom_control``) as a dict of ints;
    lines that are not two fields with an integer second are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("-").isdigit():
            out[fields[0]] = int(fields[1])
    return out


class MemoryCgroup:
    """One cgroup-v1 memory cgroup (a folder of the memory controller's hierarchy).

    Parameters
    ----------
    path : Path
        The cgroup's folder (it exists: see :meth:`create`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str, limit_bytes: int, root: Path = MEMORY_ROOT) -> MemoryCgroup:
        """Create ``root/name`` with ``memory.limit_in_bytes = limit_bytes``.

        Raises FileExistsError when the folder exists, PermissionError when not root,
        FileNotFoundError when ``root`` is not a cgroup-v1 memory hierarchy.
        """
        if not (root / "memory.limit_in_bytes").is_file():
            raise FileNotFoundError(f"{root} is not a cgroup-v1 memory controller")
        path = root / name
        path.mkdir()
        group = cls(path)
        try:
            group.write("memory.limit_in_bytes", limit_bytes)
        except OSError:
            group.remove(timeout=0)
            raise
        return group

    @property
    def procs_file(self) -> Path:
        """``cgroup.procs``: writing a pid there moves that process into the cgroup."""
        return self.path / "cgroup.procs"

    def write(self, name: str, value: int | str) -> None:
        """Write ``value`` to the cgroup's file ``name``."""
        (self.path / name).write_text(f"{value}\n")

    def read_int(self, name: str) -> int | None:
        """The integer in the cgroup's file ``name``, None when unreadable."""
        try:
            return int((self.path / name).read_text().strip())
        except (OSError, ValueError):
            return None

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run by a shell that first moves itself into this cgroup, then execs.

        The process keeps the shell's pid, so ``Popen.pid`` is the command's pid.
        """
        script = 'echo $$ > "$0" && exec "$@"'
        return ["/bin/sh", "-c", script, str(self.procs_file), *command]

    def pids(self) -> list[int]:
        """Processes in the cgroup now."""
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except (OSError, ValueError):
            return []

    def usage(self) -> int | None:
        """``memory.usage_in_bytes``: anonymous memory plus page cache charged now."""
        return self.read_int("memory.usage_in_bytes")

    def anonymous(self) -> int | None:
        """``total_rss`` of ``memory.stat``: anonymous memory of the cgroup and its
        children (the part of the usage that cannot be reclaimed without swap; the rest
        of ``memory.usage_in_bytes`` is page cache, which the kernel reclaims at the limit)."""
        try:
            return parse_keyed((self.path / "memory.stat").read_text()).get("total_rss")
        except OSError:
            return None

    def reset_peak(self) -> None:
        """Reset ``memory.max_usage_in_bytes`` and ``memory.failcnt`` to start a new peak."""
        with contextlib.suppress(OSError):
            self.write("memory.max_usage_in_bytes", 0)
        with contextlib.suppress(OSError):
            self.write("memory.failcnt", 0)

    def read(self) -> dict[str, Any]:
        """Limit, usage, peak usage, ``failcnt`` (times the limit was hit), the OOM
        killer's counters (``oom_kill``, ``under_oom``) and a few ``memory.stat`` lines."""
        oom: dict[str, int] = {}
        stat: dict[str, int] = {}
        with contextlib.suppress(OSError):
            oom = parse_keyed((self.path / "memory.oom_control").read_text())
        with contextlib.suppress(OSError):
            stat = parse_keyed((self.path / "memory.stat").read_text())
        return {
            "limit_bytes": self.read_int("memory.limit_in_bytes"),
            "usage_bytes": self.usage(),
            "max_usage_bytes": self.read_int("memory.max_usage_in_bytes"),
            "failcnt": self.read_int("memory.failcnt"),
            "oom_kill": oom.get("oom_kill"),
            "under_oom": oom.get("under_oom"),
            "oom_kill_disable": oom.get("oom_kill_disable"),
            "stat": {key: stat[key] for key in _STAT_KEYS if key in stat},
        }

    def remove(self, timeout: float = 30.0) -> bool:
        """Remove the cgroup once it holds no process (waits up to ``timeout`` s for the
        processes to exit; kills none). True when removed."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.2)


def kernel_log() -> list[str]:
    """The kernel's log (``dmesg``), one line each; empty when it cannot be read."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.splitlines() if out.returncode == 0 else []


def oom_reports(before: list[str], after: list[str]) -> list[str]:
    """Lines of ``after`` that are new since ``before`` (two :func:`kernel_log` readings)
    and tell of the OOM killer (invoked, out of memory, killed process, reaper)."""
    start = len(before)
    if before and (len(after) < start or after[start - 1] != before[-1]):
        # The ring buffer wrapped: find the last line seen before, else read everything.
        start = 0
        with contextlib.suppress(ValueError):
            start = len(after) - after[::-1].index(before[-1])
    return [line for line in after[start:] if _OOM_LINE.search(line)]


def cgroup_name(prefix: str = "nmbatch-soak") -> str:
    """A fresh cgroup name: ``prefix-<pid>-<time>``."""
    return f"{prefix}-{os.getpid()}-{int(time.time())}"
