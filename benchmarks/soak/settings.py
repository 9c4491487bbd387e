"""The run's settings: the service's ``NMBATCH_*`` variables, the capacity model's bytes
per vector, the memory cgroup's limit, and which code ran.

:func:`service_settings` turns the options into the service's settings;
:func:`capacity_model` reads the bytes per vector of ``service/storage/capacity.py``;
:func:`memory_limit` resolves ``--memory-limit`` (``auto``: a little above what the
capacity's samples cost); :func:`code_version` names the commit and the files changed
from it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import subprocess
from typing import Any

from benchmarks.soak.cgroup import parse_size
from benchmarks.soak.service import REPO
from nmbatch.service.storage.capacity import engine_bytes_per_vector, redis_bytes_per_vector

__all__ = ["capacity_model", "code_version", "memory_limit", "service_settings"]

_ROUND = 256 << 20  # the automatic cgroup limit is rounded up to this


def service_settings(args: argparse.Namespace) -> dict[str, str]:
    """``NMBATCH_*`` settings of the run: k, d, retention, capacity, then ``--setting``."""
    out = {"NMBATCH_K": str(args.k), "NMBATCH_DIM": str(args.dim)}
    if args.retention:
        out["NMBATCH_RETENTION"] = args.retention
    if args.max_samples:
        out["NMBATCH_MAX_SAMPLES"] = str(args.max_samples)
    for item in args.setting:
        name, _, value = item.partition("=")
        name = name if name.startswith("NMBATCH_") else "NMBATCH_" + name
        out[name.upper()] = value
    return out


def capacity_model(d: int, k: int) -> dict[str, int]:
    """Bytes per vector of the engine and of Redis (``service/storage/capacity.py``)."""
    return {
        "engine_per_vector": engine_bytes_per_vector(d, k),
        "redis_per_vector": redis_bytes_per_vector(d),
        "row_bytes": 4 * d,
    }


def memory_limit(args: argparse.Namespace) -> tuple[int, str] | None:
    """The cgroup's limit in bytes and how it was reached, None without a cgroup.

    ``--memory-limit auto``: ``--limit-margin`` x ``max_samples`` x (engine + Redis bytes
    per vector) + ``--fixed-overhead``, rounded up to 256 MiB.
    """
    text = (args.memory_limit or "none").strip().lower()
    if text == "none":
        return None
    if text != "auto":
        limit = parse_size(text)
        return limit, f"given (`--memory-limit {args.memory_limit}`)"
    if not args.max_samples:
        raise SystemExit("--memory-limit auto needs --max-samples")
    cap = capacity_model(args.dim, args.k)
    per_vector = cap["engine_per_vector"] + cap["redis_per_vector"]
    fixed = parse_size(args.fixed_overhead)
    need = args.max_samples * per_vector
    limit = math.ceil((args.limit_margin * need + fixed) / _ROUND) * _ROUND
    rule = (
        f"{args.limit_margin:g} x the capacity's needs, {args.max_samples:,} x "
        f"({cap['engine_per_vector']} engine + {cap['redis_per_vector']} Redis) bytes per vector "
        f"= {need / 2**30:.2f} GiB, plus {fixed / 2**30:.2f} GiB fixed (interpreters, kernels, "
        f"HTTP buffers, Redis's own), rounded up to 256 MiB"
    )
    return limit, rule


def code_version() -> dict[str, Any]:
    """The checkout the service runs from: ``HEAD``'s commit and the files that differ
    from it (``git status --porcelain``), or None where git is not available."""
    out: dict[str, Any] = {"commit": None, "changed": None}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "-C", str(REPO)]
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
        if head.returncode == 0:
            out["commit"] = head.stdout.strip()
            out["changed"] = [line[3:] for line in status.stdout.splitlines() if line[3:]]
    return out
