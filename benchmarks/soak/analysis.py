"""Figures of a soak run: rates, latency per time slice, readiness, memory, checks.

Pure functions of what the client processes recorded (:class:`benchmarks.soak.traffic.Record`
arrays, times made relative to the start of the traffic) and of the sampler's records
(:class:`benchmarks.soak.sampling.Sampler`). :func:`checks` judges a run against the issue's
targets: with ``retention`` ``window`` the soak's (rate, errors, ``/assign`` p99, memory
flat after the first window), else, with a capacity, the capacity run's (``507`` after
the capacity, the service ready, nothing acknowledged lost, no OOM kill).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "WINDOW_FACTOR",
    "annotate_slices",
    "assign_summary",
    "checks",
    "cpu_cores",
    "distribution",
    "ingest_summary",
    "latency_outside",
    "latency_slices",
    "memory_after_window",
    "readiness",
    "rewrite_intervals",
]

WINDOW_FACTOR = 1.3
"""Memory after the first window may be at most this many times the window's bytes above
the fixed overhead."""
ASSIGN_P99_MS = 10.0
INGEST_RATE = 100_000.0


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def distribution(values: np.ndarray) -> dict[str, float | None]:
    """Median, p90, p99, p99.9 and max of ``values`` (None when empty)."""
    values = np.asarray(values, dtype=np.float64)
    return {
        "median": _pct(values, 50),
        "p90": _pct(values, 90),
        "p99": _pct(values, 99),
        "p999": _pct(values, 99.9),
        "max": float(values.max()) if values.size else None,
    }


def _status_counts(status: np.ndarray) -> dict[str, int]:
    """Requests per status code (``"0"``: no HTTP answer)."""
    codes, counts = np.unique(np.asarray(status), return_counts=True)
    return {str(int(c)): int(n) for c, n in zip(codes, counts, strict=True)}


def latency_slices(
    due: np.ndarray, end: np.ndarray, status: np.ndarray, seconds: float, ok: int = 200
) -> list[dict[str, Any]]:
    """Per slice of ``seconds`` (by completion time ``end``, relative s): requests,
    failures (status other than ``ok``), and the median, p99 and max latency (ms, from
    ``due``) of the successful ones."""
    due, end, status = np.asarray(due), np.asarray(end), np.asarray(status)
    if end.size == 0:
        return []
    latency = (end - due) * 1000.0
    edges = np.arange(0.0, max(float(end.max()), 0.0) + seconds, seconds)
    which = np.clip(np.searchsorted(edges, end, side="right") - 1, 0, None)
    out = []
    for j, t in enumerate(edges):
        mask = which == j
        if not mask.any():
            continue
        good = mask & (status == ok)
        lat = latency[good]
        out.append(
            {
                "t": float(t),
                "requests": int(mask.sum()),
                "failed": int((mask & (status != ok)).sum()),
                "p50_ms": _pct(lat, 50),
                "p99_ms": _pct(lat, 99),
                "max_ms": float(lat.max()) if lat.size else None,
            }
        )
    return out


def ingest_summary(arrays: dict[str, Any], batch: int, warmup_vectors: int) -> dict[str, Any]:
    """``POST /samples``: requests and vectors posted and acknowledged, statuses, the rate,
    the first ``507`` (when, how many the model held, ``202``\\ s after it), latency.

    ``arrays`` are the ingest client's (times relative to the traffic's start);
    ``warmup_vectors`` were acknowledged before it (counted in ``acked_total``).
    """
    due, end = np.asarray(arrays["due"]), np.asarray(arrays["end"])
    status, accepted = np.asarray(arrays["status"]), np.asarray(arrays["accepted"])
    n_samples = np.asarray(arrays["n_samples"])
    ok = status == 202
    acked = int(accepted[ok].sum())
    out: dict[str, Any] = {
        "requests": int(status.size),
        "vectors_posted": int(status.size) * batch,
        "vectors_acked": acked,
        "warmup_vectors": warmup_vectors,
        "acked_total": acked + warmup_vectors,
        "statuses": _status_counts(status),
        "in_doubt_vectors": int((status == 0).sum()) * batch,
        "latency_ms": distribution((end[ok] - due[ok]) * 1000.0),
        "examples": arrays.get("examples", {}),
    }
    if ok.any():
        # From the first request's due time to the last acknowledgement.
        span = float(end[ok].max() - due.min())
        out["acked_seconds"] = span
        out["vectors_per_second"] = acked / span if span > 0 else None
    else:
        out["acked_seconds"] = out["vectors_per_second"] = None
    if status.size:
        out["sending_seconds"] = float(end.max() - due.min())
    full = np.flatnonzero(status == 507)
    if full.size:
        first = int(full[np.argmin(end[full])])
        later = end > end[first]
        out["first_507"] = {
            "t": float(end[first]),
            "n_samples": int(n_samples[first]),
            "acked_before": int(accepted[ok & (end < end[first])].sum()) + warmup_vectors,
            "accepted_after": int((ok & later).sum()),
            "refused_after": int(((status == 507) & (end >= end[first])).sum()),
        }
    return out


def assign_summary(arrays: dict[str, Any], slice_seconds: float) -> dict[str, Any]:
    """``/assign``: requests, the completed rate, statuses, latency (ms, from when each
    was due) over the run and per slice of ``slice_seconds``."""
    due, end, status = (np.asarray(arrays[k]) for k in ("due", "end", "status"))
    ok = status == 200
    span = float(end.max() - due.min()) if end.size else 0.0
    return {
        "requests": int(status.size),
        "requests_per_second": status.size / span if span > 0 else None,
        "statuses": _status_counts(status),
        "errors": int((~ok).sum()),
        "latency_ms": distribution((end[ok] - due[ok]) * 1000.0),
        "slices": latency_slices(due, end, status, slice_seconds),
        "examples": arrays.get("examples", {}),
    }


def rewrite_intervals(samples: list[dict[str, Any]], every: float) -> list[tuple[float, float]]:
    """Spans (s) during which Redis rewrote its append-only file: runs of samples with
    ``redis_rewriting`` set, widened by ``every`` (the sampling period) on each side."""
    spans: list[tuple[float, float]] = []
    for s in samples:
        if not s.get("redis_rewriting"):
            continue
        if spans and s["t"] - spans[-1][1] <= 2 * every:
            spans[-1] = (spans[-1][0], s["t"] + every)
        else:
            spans.append((s["t"] - every, s["t"] + every))
    return spans


def latency_outside(
    arrays: dict[str, Any], spans: list[tuple[float, float]], after: float = 10.0
) -> dict[str, Any]:
    """Latency (ms) of the successful ``/assign`` requests due outside ``spans`` (each
    extended by ``after`` s, while the backlog drains), and the share of requests left out."""
    due, end, status = (np.asarray(arrays[k]) for k in ("due", "end", "status"))
    inside = np.zeros(due.shape, dtype=bool)
    for start, stop in spans:
        inside |= (due >= start) & (due <= stop + after)
    keep = ~inside & (status == 200)
    return {
        "spans": [[round(a, 1), round(b, 1)] for a, b in spans],
        "after_seconds": after,
        "left_out_share": float(inside.mean()) if due.size else None,
        "latency_ms": distribution((end[keep] - due[keep]) * 1000.0),
    }


def annotate_slices(
    slices: list[dict[str, Any]], samples: list[dict[str, Any]], seconds: float
) -> None:
    """Add to each latency slice (in place) what else ran meanwhile: ``other_cores``, the
    cores other programs and the kernel took (the machine's busy time less the service's
    and the clients', from the samples' CPU counters), and ``rewriting``, whether Redis
    rewrote its append-only file during the slice."""
    timed = [s for s in samples if (s.get("cpu") or {}).get("machine") is not None]
    for sl in slices:
        a, b = sl["t"], sl["t"] + seconds
        inside = [s for s in timed if a <= s["t"] <= b]
        sl["rewriting"] = any(s.get("redis_rewriting") for s in samples if a <= s["t"] <= b)
        sl["other_cores"] = None
        if len(inside) >= 2:
            first, last = inside[0], inside[-1]

            def used(s: dict[str, Any]) -> float:
                c = s["cpu"]
                return c["machine"] - (c.get("service") or 0.0) - (c.get("clients") or 0.0)

            sl["other_cores"] = (used(last) - used(first)) / (last["t"] - first["t"])


def readiness(samples: list[dict[str, Any]], until: float | None = None) -> dict[str, Any]:
    """``/readyz`` over the samples (up to ``until`` s): answers per status, and the
    longest stretch of seconds not ready."""
    statuses: dict[str, int] = {}
    longest = current = 0.0
    last_t: float | None = None
    for s in samples:
        if until is not None and s["t"] > until:
            break
        code = s.get("readyz")
        statuses[str(code)] = statuses.get(str(code), 0) + 1
        if code != 200 and last_t is not None:
            current += s["t"] - last_t
            longest = max(longest, current)
        elif code == 200:
            current = 0.0
        last_t = s["t"]
    return {"statuses": statuses, "longest_not_ready_seconds": longest}


def cpu_cores(samples: list[dict[str, Any]], until: float) -> dict[str, float | None]:
    """Mean CPU cores of the server process, its engine processes and redis-server from
    the traffic's start (``t`` 0) to ``until`` s, from the samples' cumulative seconds."""
    within = [s for s in samples if 0.0 <= s["t"] <= until and s.get("cpu")]
    out: dict[str, float | None] = {}
    for key in ("server", "engine", "redis"):
        points = [(s["t"], s["cpu"].get(key)) for s in within if s["cpu"].get(key) is not None]
        span = points[-1][0] - points[0][0] if len(points) > 1 else 0.0
        out[key] = (points[-1][1] - points[0][1]) / span if span > 0 else None
    return out


def _acked(sample: dict[str, Any], warmup: int) -> int:
    return int((sample.get("traffic") or {}).get("acked_vectors", 0)) + warmup


def memory_after_window(
    samples: list[dict[str, Any]],
    baseline: dict[str, Any],
    window: int,
    window_bytes: int,
    warmup_vectors: int,
    until: float | None = None,
    model_bytes: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Memory once a first window (``window`` samples acknowledged) has passed, against
    ``WINDOW_FACTOR * window_bytes`` above the fixed overhead (the ``baseline`` sample's
    value: the service idle after its warm-up).

    For the server with its engine (RSS) and Redis (``used_memory``, and RSS): the
    fixed overhead, the largest value after the first window (up to ``until`` s), its
    excess over the overhead as a multiple of ``window_bytes``, and the growth from the
    second window on (least-squares slope, bytes per million vectors acknowledged).
    ``model_bytes`` (by measure) gives another yardstick, the window's cost by the
    capacity model: the excess over it is ``model_ratio``.
    """
    after = [
        s
        for s in samples
        if _acked(s, warmup_vectors) >= window and (until is None or s["t"] <= until)
    ]
    out: dict[str, Any] = {"window": window, "window_bytes": window_bytes, "samples": len(after)}
    for key in ("server_rss", "redis_used_memory", "redis_rss"):
        fixed = baseline.get(key)
        values = np.array([s[key] for s in after if s.get(key) is not None], dtype=np.float64)
        entry: dict[str, Any] = {"fixed": fixed}
        if values.size and fixed is not None:
            peak = float(values.max())
            entry["max"] = peak
            entry["ratio"] = (peak - fixed) / window_bytes
            entry["bound"] = fixed + WINDOW_FACTOR * window_bytes
            entry["within"] = bool(peak <= entry["bound"])
            if model_bytes and model_bytes.get(key):
                entry["model_bytes"] = model_bytes[key]
                entry["model_ratio"] = (peak - fixed) / model_bytes[key]
            later = [s for s in after if _acked(s, warmup_vectors) >= 2 * window and s.get(key)]
            if len(later) >= 3:
                x = np.array([_acked(s, warmup_vectors) for s in later], dtype=np.float64) / 1e6
                y = np.array([s[key] for s in later], dtype=np.float64)
                entry["slope_bytes_per_million"] = float(np.polyfit(x, y, 1)[0])
        out[key] = entry
    return out


def _row(check: str, measured: Any, wanted: str, met: bool | None) -> dict[str, Any]:
    return {"check": check, "measured": measured, "wanted": wanted, "met": met}


def checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The run judged against the issue's targets: one row per check."""
    ing, asg = result["ingest"], result["assign"]
    retention = result["retention"]
    rows: list[dict[str, Any]] = []
    other = {k: v for k, v in ing["statuses"].items() if k not in ("202", "507")}
    lat = asg["latency_ms"]
    if retention == "window":
        posted = ing["vectors_posted"] + ing["warmup_vectors"]
        rows.append(
            _row(
                "vectors acknowledged",
                ing["acked_total"],
                f"{posted:,} (all posted)",
                ing["acked_total"] == posted,
            )
        )
        rate = ing.get("vectors_per_second")
        rows.append(
            _row(
                "ingestion, vectors/s",
                rate,
                f">= {INGEST_RATE:,.0f}",
                rate is not None and rate >= INGEST_RATE,
            )
        )
        errors = sum(v for k, v in ing["statuses"].items() if k != "202") + asg["errors"]
        rows.append(_row("errors (any non-2xx or no answer)", errors, "0", errors == 0))
        loss = result.get("loss_check") or {}
        rows.append(
            _row(
                "acknowledged samples counted in the log (meta n_samples)",
                loss.get("meta_n_samples"),
                f"= {ing['acked_total']:,} acknowledged, and the log holding the "
                f"{loss.get('retained_expected') or 0:,} retained",
                loss.get("nothing_lost"),
            )
        )
    else:
        first = ing.get("first_507")
        cap = result.get("max_samples")
        if cap is not None:
            held = first["n_samples"] if first else None
            batch = result["args"]["batch"]
            rows.append(
                _row(
                    "samples held at the first 507",
                    held,
                    f"> {cap - batch:,} (capacity {cap:,} less one batch)",
                    held is not None and cap - batch < held <= cap,
                )
            )
            after = first["accepted_after"] if first else None
            rows.append(_row("202 after the first 507", after, "0", after == 0))
        errors = sum(other.values()) + asg["errors"]
        rows.append(_row("errors other than 507", errors, "0", errors == 0))
        loss = result.get("loss_check") or {}
        rows.append(
            _row(
                "acknowledged samples in the log",
                loss.get("log_rows"),
                f"= {ing['acked_total']:,} acknowledged (+ {ing['in_doubt_vectors']:,} in doubt)",
                loss.get("nothing_lost"),
            )
        )
    rate = asg.get("requests_per_second")
    wanted_rate = result["args"]["assign_rate"]
    rows.append(
        _row(
            "/assign requests/s",
            rate,
            f"{wanted_rate:,.0f} (paced)",
            rate is not None and rate >= 0.99 * wanted_rate,
        )
    )
    rows.append(
        _row(
            "/assign p99 ms",
            lat["p99"],
            f"<= {ASSIGN_P99_MS:g}",
            lat["p99"] is not None and lat["p99"] <= ASSIGN_P99_MS,
        )
    )
    ready = result["readiness"]
    not_ready = sum(v for k, v in ready["statuses"].items() if k != "200")
    rows.append(_row("/readyz answers not 200 (1 a second)", not_ready, "0", not_ready == 0))
    oom = result.get("oom") or {}
    if oom:
        kills = (oom.get("cgroup_oom_kill") or 0) + len(oom.get("kernel_log") or [])
        restarts = oom.get("engine_restarts") or 0
        rows.append(
            _row(
                "OOM kills (cgroup counter, kernel log) and engine restarts",
                kills + restarts,
                "0",
                kills + restarts == 0,
            )
        )
    mem = result.get("memory_after_window")
    if mem:
        for key, label in (
            ("server_rss", "server + engine RSS"),
            ("redis_used_memory", "Redis used_memory"),
        ):
            entry = mem.get(key) or {}
            rows.append(
                _row(
                    f"{label} after the first window, x window bytes above the fixed overhead",
                    entry.get("ratio"),
                    f"<= {WINDOW_FACTOR:g}",
                    entry.get("within"),
                )
            )
    restart = result.get("restart")
    if restart:
        measured = restart.get("N") if not restart.get("error") else "failed to start"
        rows.append(
            _row(
                "after a restart on the same data: samples the engine holds",
                measured,
                f"= {restart['expected']:,}",
                bool(restart.get("exact")),
            )
        )
    rows.append(
        _row(
            "server exit code on SIGTERM",
            result.get("exit_code"),
            "0",
            result.get("exit_code") == 0,
        )
    )
    return rows
