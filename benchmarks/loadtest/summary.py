"""Statistics of a phase: rates, latency distributions, CPU, memory check, targets.

:func:`summarise` turns what the client processes reported and the resource samples into
the phase's JSON record; :func:`memory_check` compares the RSS growth with what the data
explain; :func:`targets` judges a whole run against :data:`TARGETS`.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from benchmarks.loadtest.spec import PhaseSpec

__all__ = ["TARGETS", "memory_check", "summarise", "targets"]

TARGETS = {
    "npy_vectors_per_second": 200_000,
    "json_vectors_per_second": 20_000,
    "assign_p99_ms": 10.0,
    "assign_requests_per_second": 1_000,
    "errors": 0,
}


def _pct(values: np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (1-d), None when empty."""
    return float(np.percentile(values, q)) if values.size else None


def _distribution(values: np.ndarray) -> dict[str, float | None]:
    """Median, p90, p99, p99.9 and max of ``values`` (None when empty)."""
    return {
        "median": _pct(values, 50),
        "p90": _pct(values, 90),
        "p99": _pct(values, 99),
        "p999": _pct(values, 99.9),
        "max": float(values.max()) if values.size else None,
    }


def _latency_ms(seconds: np.ndarray) -> dict[str, float | None]:
    """:func:`_distribution` of latencies given in seconds, in milliseconds."""
    return _distribution(seconds * 1000.0)


def _timeline(ends: np.ndarray, weights: np.ndarray, start: float, seconds: float) -> list[float]:
    """Per-second sums of ``weights`` by completion time over ``[start, start + seconds)``."""
    bins = np.arange(0.0, np.ceil(seconds) + 1e-9, 1.0)
    counts, _ = np.histogram(ends - start, bins=bins, weights=weights)
    return [float(c) for c in counts]


def _requests_summary(
    reports: list[dict[str, Any]], start: float, deadline: float
) -> dict[str, Any]:
    """Rates, latency, errors and per-second timeline of the requests of ``reports``
    that completed within ``[start, deadline]`` (monotonic seconds)."""
    ends = np.concatenate([r["ends"] for r in reports]) if reports else np.zeros(0)
    lat = np.concatenate([r["latencies"] for r in reports]) if reports else np.zeros(0)
    vec = np.concatenate([r["vectors"] for r in reports]) if reports else np.zeros(0, np.int64)
    inside = (ends >= start) & (ends <= deadline)
    seconds = deadline - start
    errors = [e for r in reports for e in r["errors"]]
    return {
        "requests": int(inside.sum()),
        "requests_per_second": float(inside.sum() / seconds),
        "vectors": int(vec[inside].sum()),
        "vectors_per_second": float(vec[inside].sum() / seconds),
        "latency_ms": _latency_ms(lat[inside]),
        "errors": len(errors),
        "shed": int(sum(r.get("shed", 0) for r in reports)),
        "shed_behind": int(sum(r.get("shed_behind", 0) for r in reports)),
        "error_examples": errors[:5],
        "client_cpu_seconds": float(sum(r["cpu_seconds"] for r in reports)),
        "per_second": _timeline(
            ends[inside],
            vec[inside] if vec[inside].sum() else np.ones(int(inside.sum())),
            start,
            seconds,
        ),
    }


def summarise(
    spec: PhaseSpec,
    args: argparse.Namespace,
    start: float,
    deadline: float,
    reports: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    stats: dict[str, Any],
    centroids: dict[str, Any],
    exit_code: int,
) -> dict[str, Any]:
    """The phase's JSON record."""
    ingest = [r for r in reports if r["role"] in ("ingest", "probe")]
    assign = [r for r in reports if r["role"] == "assign"]
    probes = [r for r in reports if r["role"] == "probe"]
    seconds = deadline - start
    out: dict[str, Any] = {
        "name": spec.name,
        "seconds": seconds,
        "ingest_kinds": spec.ingest_kinds,
        "ingest_rate_target": spec.ingest_rate,
        "assign_rate_target": spec.assign_rate,
        "exit_code": exit_code,
    }
    if ingest:
        out["ingest"] = _requests_summary(ingest, start, deadline)
        by_kind = {}
        for kind in spec.ingest_kinds:
            own = [r for r in ingest if r["role"] == "ingest" and set(r["kinds"]) == {kind}]
            if own and len(set(spec.ingest_kinds)) > 1:
                by_kind[kind] = _requests_summary(own, start, deadline)["vectors_per_second"]
        out["ingest"]["vectors_per_second_by_kind"] = by_kind
    if assign:
        out["assign"] = _requests_summary(assign, start, deadline)
    if probes:
        store = np.asarray([x for p in probes for x in p["in_store"]])
        prefix_raw = [x for p in probes for x in p["in_prefix"]]
        prefix = np.asarray([x for x in prefix_raw if x is not None])
        out["delay_seconds"] = {
            "probes": int(store.size),
            "in_store": _distribution(store),
            "in_prefix": _distribution(prefix),
            "in_prefix_not_reached": sum(x is None for x in prefix_raw),
        }
    first, last = samples[0], samples[-1]
    inside = [s for s in samples if start - 0.5 <= s["t"] <= deadline + 0.5] or samples
    cpu = {}
    for proc in ("server", "worker", "redis", "machine"):
        a, b = inside[0].get(f"{proc}_cpu"), inside[-1].get(f"{proc}_cpu")
        if a is not None and b is not None and inside[-1]["t"] > inside[0]["t"]:
            cpu[proc] = (b - a) / (inside[-1]["t"] - inside[0]["t"])
    client_cpu = sum(r["cpu_seconds"] for r in reports)
    cpu["clients"] = client_cpu / seconds  # includes their start-up and encoding
    out["cpu_cores_used"] = cpu
    out["memory"] = memory_check(first, last, args, stats)
    out["samples"] = [
        {k: v for k, v in s.items() if k != "t"} | {"t": s["t"] - start} for s in samples
    ]
    out["final"] = {
        key: stats.get(key)
        for key in (
            "N", "b", "n_logged", "iteration", "converged", "phase", "skipped_share",
            "last_iteration_seconds",
        )
    } | {"version": centroids.get("version")}  # fmt: skip
    return out


def memory_check(
    first: dict[str, Any], last: dict[str, Any], args: argparse.Namespace, stats: dict[str, Any]
) -> dict[str, Any]:
    """RSS growth of the server and of redis-server against what the data explain.

    Expected bytes per vector (``d`` = dim, ``k`` clusters):

    - Redis: the log entry payload, ``4 d`` (plus a few bytes of entry fields);
    - server: the store row ``4 d`` + its insertion index 8, and for the samples in the
      prefix the worker's per-sample state: lower bounds ``4 k``, upper bound 8,
      squared distance 8, label 4 (+4 for the label array's spare capacity).
    """
    d, k = args.dim, args.k
    n0, n1 = first.get("n_logged") or 0, last.get("n_logged") or 0
    vectors = n1 - n0
    prefix = stats.get("b") or 0
    redis_expected = vectors * 4 * d
    # The prefix at the start was at most n0 (the warm-up), so its growth is >= prefix - n0.
    prefix_growth = max(0, prefix - n0)
    server_expected = vectors * (4 * d + 8) + prefix_growth * (4 * k + 8 + 8 + 4 + 4)
    out: dict[str, Any] = {"vectors_logged": vectors, "prefix_growth": prefix_growth}
    slack_fraction, slack_bytes = 0.15, 128 * 2**20
    explained = True
    for proc, expected in (("server", server_expected), ("redis", redis_expected)):
        a, b = first.get(f"{proc}_rss"), last.get(f"{proc}_rss")
        if a is None or b is None:
            continue
        growth = b - a
        ok = growth <= expected * (1 + slack_fraction) + slack_bytes
        explained &= ok
        out[proc] = {
            "rss_start": a,
            "rss_end": b,
            "growth": growth,
            "expected_from_data": expected,
            "ratio": growth / expected if expected else None,
            "explained": ok,
        }
    out["redis_used_memory_growth"] = (last.get("redis_used_memory") or 0) - (
        first.get("redis_used_memory") or 0
    )
    out["rule"] = (
        f"growth <= expected * {1 + slack_fraction:.2f} + {slack_bytes // 2**20} MiB, "
        "expected = vectors * 4d (Redis log) and vectors * (4d + 8) + prefix growth * "
        "(4k + 24) (store + worker state)"
    )
    out["explained"] = explained
    return out


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue: measured value and whether it is met."""
    phases = {p["name"]: p for p in result["phases"]}
    rows = []

    def add(what: str, measured: float | None, wanted: str, met: bool | None) -> None:
        rows.append({"target": what, "measured": measured, "wanted": wanted, "met": met})

    if "ingest-npy" in phases:
        v = phases["ingest-npy"]["ingest"]["vectors_per_second"]
        add("npy ingestion, vectors/s", v, ">= 200,000", v >= TARGETS["npy_vectors_per_second"])
    if "ingest-octet" in phases:
        v = phases["ingest-octet"]["ingest"]["vectors_per_second"]
        add("octet-stream ingestion, vectors/s", v, "(>= npy)", None)
    if "ingest-json" in phases:
        v = phases["ingest-json"]["ingest"]["vectors_per_second"]
        add("JSON ingestion, vectors/s", v, ">= 20,000", v >= TARGETS["json_vectors_per_second"])
    for name in ("assign", "soak", "assign-max"):
        if name in phases and "assign" in phases[name]:
            a, ing = phases[name]["assign"], phases[name].get("ingest", {})
            p99, rps = a["latency_ms"]["p99"], a["requests_per_second"]
            rate = ing.get("vectors_per_second", 0.0)
            judged = name != "assign-max"  # full-speed ingestion: reported, not judged
            fast = p99 is not None and p99 <= TARGETS["assign_p99_ms"]
            many = rps >= TARGETS["assign_requests_per_second"] * 0.995
            what = f"{name}: /assign p99 ms while ingesting {rate:,.0f} vectors/s"
            add(what, p99, "<= 10" if judged else "(reported)", fast if judged else None)
            rows_rps = ">= 1,000" if judged else "(reported)"
            add(f"{name}: /assign requests/s", rps, rows_rps, many if judged else None)
    if "soak" in phases:
        s = phases["soak"]
        errors = s.get("ingest", {}).get("errors", 0) + s.get("assign", {}).get("errors", 0)
        add(f"soak errors over {s['seconds']:.0f} s", errors, "0 over 300 s",
            errors == 0 and s["seconds"] >= 300)  # fmt: skip
        add("soak memory growth explained by the data", None, "yes", s["memory"]["explained"])
    total = sum(
        p.get("ingest", {}).get("errors", 0) + p.get("assign", {}).get("errors", 0)
        for p in result["phases"]
    )
    add("errors in all phases", total, "0", total == 0)
    return rows
