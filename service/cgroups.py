"""Limits of this process's Linux control groups (v2 and v1): memory, and CPU quota.

A limit set on a cgroup binds every group below it, so the files of the process's own
cgroup and of each ancestor are read (:func:`cgroup_files`), and the smallest limit
wins. In a container, ``/proc/self/cgroup`` may give the host's path of the group while
the container sees its own group at the top of ``/sys/fs/cgroup``: the walk ends there.

Used by the memory-derived capacity (:func:`nmbatch.service.storage.capacity.memory_limit`)
and by the default of ``NMBATCH_WORKER_THREADS``
(:func:`nmbatch.service.config.default_worker_threads`). Standard library only.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["cgroup_files", "cpu_quota", "memory_limits"]

_NO_LIMIT = 1 << 60  # cgroup v1 writes a number near 2^63 for "no memory limit"


def cgroup_files(
    root: Path, v1_controller: str, v1_name: str, v2_name: str
) -> list[tuple[Path, str]]:
    """The files ``v2_name`` (cgroup v2) or ``v1_name`` (v1, under the hierarchy of
    ``v1_controller``) of this process's cgroups and their ancestors, deepest first,
    each with its cgroup's path (``/app/worker``). Files that do not exist are listed
    too; ``root`` stands for ``/`` (tests)."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    base = root / "sys/fs/cgroup"
    found: list[tuple[Path, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: "0::/path"
            folders, name = [base], v2_name
        elif v1_controller in controllers.split(","):  # v1: "N:cpu,cpuacct:/path"
            # Mounted at its own name, or at the joined names ("cpu,cpuacct").
            folders = list(dict.fromkeys([base / v1_controller, base / controllers]))
            name = v1_name
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for folder in folders:
            for depth in range(len(parts), -1, -1):  # this cgroup, then each ancestor
                found.append((folder.joinpath(*parts[:depth]) / name,
                              "/" + "/".join(parts[:depth])))  # fmt: skip
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def memory_limits(root: Path = Path("/")) -> list[tuple[int, str]]:
    """Memory limits in bytes of this process's cgroups and their ancestors (v2
    ``memory.max``, v1 ``memory.limit_in_bytes``), each with where it was read."""
    found: list[tuple[int, str]] = []
    for path, group in cgroup_files(root, "memory", "memory.limit_in_bytes", "memory.max"):
        text = _read(path)
        if text is not None and text.isdigit() and int(text) < _NO_LIMIT:
            found.append((int(text), f"cgroup {group} {path.name}"))
    return found


def cpu_quota(root: Path = Path("/")) -> tuple[float, str] | None:
    """The smallest CPU quota of this process's cgroups and their ancestors, in CPUs
    (quota over period: ``1.5`` is one and a half cores' time), with where it was read;
    None without any (v2 ``cpu.max`` of ``max``, v1 ``cpu.cfs_quota_us`` of ``-1``).

    v2: ``cpu.max`` holds ``"<quota> <period>"`` in microseconds; v1: ``cpu.cfs_quota_us``
    and ``cpu.cfs_period_us`` of the same folder.
    """
    found: list[tuple[float, str]] = []
    for path, group in cgroup_files(root, "cpu", "cpu.cfs_quota_us", "cpu.max"):
        text = _read(path)
        if text is None:
            continue
        if path.name == "cpu.max":
            quota, _, period = text.partition(" ")
        else:
            quota, period = text, _read(path.with_name("cpu.cfs_period_us")) or ""
        try:
            cpus = int(quota) / int(period)
        except (ValueError, ZeroDivisionError):  # "max", a missing or zero period
            continue
        if cpus > 0:  # v1's -1: no quota
            found.append((cpus, f"cgroup {group} {path.name}"))
    return min(found) if found else None
