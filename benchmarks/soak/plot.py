"""``soak.png``: memory, samples, ``/assign`` latency and CPU of a run over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot"]

_GIB = float(1 << 30)


def plot(result: dict[str, Any], path: Path) -> None:
    """Memory (GiB), samples (millions) and ``/assign`` latency (ms) over time, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t = np.array([s["t"] for s in samples], dtype=np.float64)

    def series(get: Any) -> np.ndarray:
        return np.array([np.nan if (v := get(s)) is None else v for s in samples], dtype=float)

    fig, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    ax = axes[0]
    for key, label in (
        ("server_rss", "server + engine RSS"),
        ("engine_rss", "engine RSS"),
        ("redis_rss", "redis-server RSS"),
        ("redis_used_memory", "Redis used_memory"),
        ("cgroup_usage", "cgroup usage (with page cache)"),
        ("cgroup_rss", "cgroup anonymous memory"),
    ):
        values = series(lambda s, k=key: s.get(k)) / _GIB
        if np.isfinite(values).any():
            ax.plot(t, values, label=label)
    cg = result.get("cgroup")
    if cg:
        ax.axhline(cg["limit_bytes"] / _GIB, color="k", ls="--", lw=1, label="cgroup limit")
    mem = result.get("memory_after_window") or {}
    for key, color in (("server_rss", "C0"), ("redis_used_memory", "C3")):
        bound = (mem.get(key) or {}).get("bound")
        if bound:
            ax.axhline(bound / _GIB, color=color, ls=":", lw=1, label=f"bound of {key}")
    ax.set_ylabel("GiB")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"Soak, retention {result['retention']}")
    ax = axes[1]
    warm = result["ingest"]["warmup_vectors"]
    acked = series(lambda s: (s.get("traffic") or {}).get("acked_vectors")) + warm
    ax.plot(t, acked / 1e6, label="acknowledged")
    for key, label in (("n_logged", "in the log (n_logged)"), ("N", "engine N"), ("b", "b")):
        ax.plot(t, series(lambda s, k=key: (s.get("stats") or {}).get(k)) / 1e6, label=label)
    full = series(lambda s: (s.get("traffic") or {}).get("s507"))
    if np.nanmax(np.nan_to_num(full, nan=0.0), initial=0.0) > 0:
        first = t[np.argmax(np.nan_to_num(full) > 0)]
        ax.axvline(first, color="k", ls="--", lw=1, label="first 507")
    not_ready = t[series(lambda s: s.get("readyz")) != 200]
    if not_ready.size:
        ax.plot(not_ready, np.zeros_like(not_ready), "rx", label="/readyz not 200")
    ax.set_ylabel("samples, millions")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[2]
    slices = result["assign"]["slices"]
    if slices:
        st = np.array([s["t"] for s in slices]) + result["args"]["slice_seconds"] / 2
        for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
            ax.plot(st, [np.nan if s[key] is None else s[key] for s in slices], label=label)
    ax.axhline(10.0, color="k", ls="--", lw=1, label="10 ms")
    ax.set_yscale("log")
    ax.set_ylabel("/assign latency, ms")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[3]
    if len(t) > 1:
        rate = {}
        for key in ("server", "engine", "redis", "service", "clients", "machine"):
            used = series(lambda s, k=key: (s.get("cpu") or {}).get(k))
            rate[key] = np.diff(used) / np.diff(t)
        for key in ("server", "engine", "redis"):
            ax.plot(t[1:], rate[key], label=f"{key} process")
        others = rate["machine"] - rate["service"] - rate["clients"]
        if np.isfinite(others).any():
            ax.plot(t[1:], others, color="k", lw=1, label="other programs and the kernel")
        rewriting = series(lambda s: s.get("redis_rewriting"))
        if np.nansum(rewriting) > 0:
            ax.fill_between(
                t,
                0,
                2 * np.nan_to_num(rewriting),
                color="0.85",
                step="mid",
                label="Redis rewriting its append-only file",
            )
    ax.set_ylabel("CPU, cores")
    ax.set_xlabel("seconds since the traffic started")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
