"""One soak run, start to end: cgroup, service, warm-up, traffic, catch-up, checks.

:func:`run` creates the memory cgroup (if a limit is given), starts the service in it
(:class:`benchmarks.soak.service.Service`), posts a warm-up, samples the idle service (the
fixed overhead), starts the client processes (:mod:`benchmarks.soak.traffic`) and the
sampler (:class:`benchmarks.soak.sampling.Sampler`), waits for the ingest client to finish,
stops ``/assign``, waits for the engine to hold the log, reads the log back (nothing
acknowledged lost), stops the service, optionally restarts it on the same data in the
same cgroup (the replay must fit too), reads the cgroup's counters and the kernel's OOM
lines, removes the cgroup and the data, and returns the run's JSON record.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.loadtest.probes import machine_busy_seconds
from benchmarks.soak import analysis
from benchmarks.soak.cgroup import MemoryCgroup, cgroup_name, kernel_log, oom_reports
from benchmarks.soak.sampling import (
    Sampler,
    cpu_by_process,
    machine_times,
    other_programs,
    process_tree,
    tree_cpu_seconds,
    tree_rss,
)
from benchmarks.soak.service import REPO, Service
from benchmarks.soak.settings import capacity_model, code_version, memory_limit, service_settings
from benchmarks.soak.traffic import (
    ASSIGN_COUNTERS,
    INGEST_COUNTERS,
    assign_process,
    counters_dict,
    ingest_process,
    ingest_requests,
)

__all__ = ["run"]

_HIDDEN = ("NMBATCH_PORT", "NMBATCH_DATA_DIR", "NMBATCH_EMBEDDED_REDIS_PORT")


def _warm_up(service: Service, args: argparse.Namespace) -> int:
    """``--warmup-batches`` batches, a first model, a few ``/assign``; vectors acknowledged."""
    import httpx

    acked = 0
    bodies = ingest_requests(args.dim, args.batch, 900, max(1, args.warmup_batches))
    with httpx.Client(base_url=service.base, timeout=120) as http:
        for raw in bodies[: args.warmup_batches]:
            body = raw.split(b"\r\n\r\n", 1)[1]
            r = http.post("/samples", content=body, headers={"content-type": "application/x-npy"})
            if r.status_code != 202:
                raise RuntimeError(f"warm-up refused: {r.status_code} {r.text[:300]}")
            acked += int(r.json()["accepted"])
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if http.get("/centroids").status_code == 200:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("no model 300 s after the warm-up")
        q = ",".join(["0.5"] * args.dim)
        for _ in range(200):
            http.get("/assign", params={"vector": q})
    return acked


def _wait_caught_up(service: Service, cap: int | None, timeout: float) -> float | None:
    """Seconds until the engine holds the log (``N >= min(n_logged, cap)``) and converged;
    None when not within ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(Exception):
            st = service.get_json("/stats", timeout=10)
            target = st["n_logged"] if cap is None else min(st["n_logged"], cap)
            if st["N"] >= target and st["converged"]:
                return time.monotonic() - started
        time.sleep(0.5)
    return None


def _cores(a: float | None, b: float | None, seconds: float) -> float | None:
    """CPU seconds from ``a`` to ``b`` per second of ``seconds``."""
    return None if a is None or b is None or seconds <= 0 else (b - a) / seconds


def _traffic(service: Service, args: argparse.Namespace, cgroup: MemoryCgroup | None) -> dict:
    """Run the client processes and the sampler; their records (times from the start)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ingest_counts = ctx.Array("q", len(INGEST_COUNTERS))
    assign_counts = ctx.Array("q", len(ASSIGN_COUNTERS))
    stop = ctx.Event()
    start = time.monotonic() + 5.0  # the clients start and encode their requests before
    deadline = start + args.max_seconds
    common = {"port": service.port, "dim": args.dim}
    ingest_cfg = common | {
        "batch": args.batch,
        "seed": 100,
        "bodies": args.bodies,
        "total": args.total,
        "rate": args.rate or None,
        "conns": args.ingest_conns,
        "start": start,
        "deadline": deadline,
        "after_full_seconds": args.after_full_seconds,
        "timeout": 120.0,
    }
    assign_cfg = common | {
        "seed": 3,
        "rate": args.assign_rate,
        "conns": args.assign_conns,
        "start": start,
        "deadline": deadline + 60.0,
        "timeout": 30.0,
    }
    procs = [
        ctx.Process(target=ingest_process, args=(ingest_cfg, ingest_counts, q)),
        ctx.Process(target=assign_process, args=(assign_cfg, assign_counts, stop, q)),
    ]
    for p in procs:
        p.start()

    def counters() -> dict[str, Any]:
        assign = counters_dict(ASSIGN_COUNTERS, assign_counts)
        return counters_dict(INGEST_COUNTERS, ingest_counts) | {
            f"assign_{k}": v for k, v in assign.items()
        }

    sampler = Sampler(
        service.base,
        service.proc.pid,
        service.redis_pid,
        service.redis,
        start,
        args.sample_every,
        cgroup,
        counters,
        tuple(p.pid for p in procs if p.pid is not None),
    )
    baseline = sampler.sample()
    sampler.start()
    # CPU counters from here to the end of the traffic (the clients' start-up included).
    t0 = time.monotonic()
    busy0, server0 = machine_busy_seconds(), tree_cpu_seconds(service.proc.pid)
    table0, states0 = cpu_by_process(), machine_times()
    try:
        reports = _wait_ingest(q, procs[0], sampler)
        traffic_end = time.monotonic() - start
        elapsed = time.monotonic() - t0
        busy1, server1 = machine_busy_seconds(), tree_cpu_seconds(service.proc.pid)
        ours = {os.getpid(), *(p.pid for p in procs if p.pid is not None)}
        ours |= {p.pid for p in process_tree(service.proc.pid)}
        others = other_programs(table0, cpu_by_process(), ours, elapsed)
        states1 = machine_times()
        # Cores in each state of /proc/stat meanwhile (irq, softirq and steal are not
        # charged to any process).
        states = {k: (states1[k] - states0[k]) / elapsed for k in states1 if k in states0}
        stop.set()
        while "assign" not in reports:
            got = q.get(timeout=120)
            reports[got["role"]] = got
    except BaseException:
        sampler.stop()
        raise
    finally:  # the client processes end (told to, else terminated) whatever happened
        stop.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
    catch_up = _wait_caught_up(service, args.max_samples, args.catch_up_timeout)
    time.sleep(args.tail_seconds)
    samples = sampler.stop()
    for r in reports.values():
        r["due"], r["end"] = r["due"] - start, r["end"] - start
    return {
        "reports": reports,
        "samples": samples,
        "baseline": baseline,
        "traffic_seconds": traffic_end,
        "cpu_seconds_counted": elapsed,
        "catch_up_seconds": catch_up,
        # CPU in cores over the traffic: the whole machine, and the server's process tree
        # (server, engine, redis-server with its rewrite forks).
        "machine_cores_busy": _cores(busy0, busy1, elapsed),
        "other_programs": others,
        "machine_states_cores": states,
        "server_cores_busy": _cores(server0, server1, elapsed),
    }


def _wait_ingest(q: Any, ingest: Any, sampler: Sampler) -> dict[str, dict[str, Any]]:
    """Wait for the ingest client's record (printing progress every 10 s); the records
    received so far, by role. Raises RuntimeError if the client died without one."""
    reports: dict[str, dict[str, Any]] = {}
    last_print = 0.0
    while "ingest" not in reports:
        with contextlib.suppress(queue.Empty):
            got = q.get(timeout=1.0)
            reports[got["role"]] = got
            continue
        if time.monotonic() - last_print >= 10.0 and sampler.samples:
            last_print = time.monotonic()
            s = sampler.samples[-1]
            c = s.get("traffic") or {}
            print(
                f"  t {s['t']:6.0f} s  acked {c.get('acked_vectors', 0):>12,}  202 "
                f"{c.get('s202', 0):,} 507 {c.get('s507', 0):,} other "
                f"{c.get('s_other', 0) + c.get('s_transport', 0):,}  assign ok "
                f"{c.get('assign_ok', 0):,} err {c.get('assign_errors', 0):,}  server "
                f"{(s.get('server_rss') or 0) / 2**30:.2f} GiB redis "
                f"{(s.get('redis_used_memory') or 0) / 2**30:.2f} GiB  ready {s.get('readyz')}",
                flush=True,
            )
        if not ingest.is_alive():
            with contextlib.suppress(queue.Empty):
                got = q.get(timeout=5.0)
                reports[got["role"]] = got
                continue
            raise RuntimeError(f"the ingest client died (exit code {ingest.exitcode})")
    return reports


def _final(
    service: Service, acked: int, in_doubt: int, retention: str, cap: int | None
) -> dict[str, Any]:
    """``/stats``, ``/centroids`` (without the arrays), Redis's INFO and meta, the log's
    rows; the check that nothing acknowledged was lost: with retention ``all`` the log
    holds every acknowledged sample; with another (of size ``cap``), the meta hash
    counts them all and the log still holds at least the retained ones."""
    stats = service.get_json("/stats")
    centroids = service.get_json("/centroids")
    if isinstance(centroids, dict):
        centroids = {k: v for k, v in centroids.items() if not isinstance(v, list)}
    meta = service.meta()
    started = time.monotonic()
    log = service.log_rows()
    final = {
        "stats": stats,
        "centroids": centroids,
        "redis_info": service.redis_info(),
        "meta": meta,
        "log": log | {"read_seconds": time.monotonic() - started},
    }
    meta_n = int(meta["n_samples"]) if meta.get("n_samples", "").isdigit() else None
    loss = {
        "log_rows": log["rows"],
        "log_entries": log["entries"],
        "meta_n_samples": meta_n,
        "acked": acked,
        "in_doubt": in_doubt,
        "nothing_lost": None,
    }
    if retention == "all":  # the log holds every acknowledged sample
        loss["nothing_lost"] = bool(
            meta_n == log["rows"] and acked <= log["rows"] <= acked + in_doubt
        )
    elif meta_n is not None and cap is not None:
        # The log counts every acknowledged sample and still holds the retained ones.
        loss["retained_expected"] = min(meta_n, cap)
        loss["nothing_lost"] = bool(
            acked <= meta_n <= acked + in_doubt and log["rows"] >= min(meta_n, cap)
        )
    return {"final": final, "loss_check": loss}


def _restart(
    args: argparse.Namespace,
    settings: dict[str, str],
    data_dir: Path,
    log_path: Path,
    cgroup: MemoryCgroup | None,
    expected_logged: int,
) -> dict[str, Any]:
    """Start the service again on the same data (same cgroup) and wait for its engine to
    hold the log again: how long it took, the peak memory, whether it holds exactly the
    retained samples (``expected_logged`` in the log, capped by the capacity/window).
    A start that fails is recorded (error, the logs' last lines), not raised."""
    before = cgroup.read() if cgroup else {}
    if cgroup:
        cgroup.reset_peak()
    service = Service(settings, data_dir, log_path, cgroup)
    out: dict[str, Any] = {}
    peak_rss = 0
    try:
        try:
            service.wait_ready(args.ready_timeout)
        except RuntimeError as exc:  # a finding, not a crash of the benchmark
            out["error"] = str(exc)
            out["failed_after_seconds"] = time.monotonic() - service.started
            out["log_tail"] = service.log_tail()
        else:
            out["ready_seconds"] = service.ready_seconds
            # The engine has replayed the log once the worker says so in the log (until
            # then /stats may show the snapshot's figures); then it steps on the replayed
            # samples until it converges.
            deadline = time.monotonic() + args.catch_up_timeout
            replayed = None
            while time.monotonic() < deadline:
                peak_rss = max(peak_rss, tree_rss(service.proc.pid)["total"] or 0)
                replayed = replayed or service.replayed()
                with contextlib.suppress(Exception):
                    st = service.get_json("/stats", timeout=10)
                    out |= {"N": st["N"], "n_logged": st["n_logged"], "converged": st["converged"]}
                    if replayed is not None and st["converged"]:
                        out["replayed_seconds"] = time.monotonic() - service.started
                        out["replay_log"] = {"samples": replayed[0], "seconds": replayed[1]}
                        break
                time.sleep(0.5)
            out["redis_used_memory"] = service.redis_info().get("used_memory")
    finally:
        out["exit_code"] = service.stop()
        out["service_log"] = service.log_excerpt()
        out["redis_loading"] = [
            line for line in service.log_tail(400)["redis"] if "loaded from" in line
        ]
    after = cgroup.read() if cgroup else {}
    out["server_peak_rss"] = peak_rss
    out["cgroup_max_usage_bytes"] = after.get("max_usage_bytes")
    out["cgroup_failcnt"] = after.get("failcnt")
    if cgroup:
        out["oom_kill"] = (after.get("oom_kill") or 0) - (before.get("oom_kill") or 0)
    retained = expected_logged if not args.max_samples else min(expected_logged, args.max_samples)
    out["expected"] = retained
    out["exact"] = out.get("N") == retained and (
        args.retention not in (None, "all") or out.get("n_logged") == expected_logged
    )
    return out


def _measure(
    result: dict[str, Any],
    args: argparse.Namespace,
    settings: dict[str, str],
    cgroup: MemoryCgroup | None,
    tmp: Path,
) -> None:
    """The service's run, its traffic, the figures after it, the restart: into ``result``."""
    retention = result["retention"]
    data_dir, log_path = tmp / "data", tmp / "service.log"
    data_dir.mkdir()
    service = Service(settings, data_dir, log_path, cgroup)
    result["service_settings"] = {k: v for k, v in service.settings.items() if k not in _HIDDEN}
    try:
        service.wait_ready(args.ready_timeout)
        result["ready_seconds"] = service.ready_seconds
        warmup = _warm_up(service, args)
        print(
            f"service ready after {service.ready_seconds:.1f} s; warm-up {warmup:,} vectors; "
            "traffic ...",
            flush=True,
        )
        traffic = _traffic(service, args, cgroup)
        reports = traffic.pop("reports")
        result |= traffic
        client_cpu = sum(r.get("cpu_seconds", 0.0) for r in reports.values())
        result["client_cores_busy"] = client_cpu / max(result["cpu_seconds_counted"], 1e-9)
        result["ingest"] = analysis.ingest_summary(reports["ingest"], args.batch, warmup)
        result["assign"] = analysis.assign_summary(reports["assign"], args.slice_seconds)
        analysis.annotate_slices(result["assign"]["slices"], result["samples"], args.slice_seconds)
        spans = analysis.rewrite_intervals(result["samples"], args.sample_every)
        result["assign"]["outside_rewrites"] = analysis.latency_outside(reports["assign"], spans)
        ing = result["ingest"]
        result |= _final(
            service, ing["acked_total"], ing["in_doubt_vectors"], retention, args.max_samples
        )
    finally:
        result["exit_code"] = service.stop()
        result["service_log"] = service.log_excerpt()
        if cgroup is not None:
            result["cgroup"]["after_run"] = cgroup.read()
    result["readiness"] = analysis.readiness(result["samples"])
    result["cpu_cores"] = analysis.cpu_cores(result["samples"], result["traffic_seconds"])
    if retention == "window" and args.max_samples:
        cap = result["capacity_model"]
        result["memory_after_window"] = analysis.memory_after_window(
            result["samples"],
            result["baseline"],
            args.max_samples,
            args.max_samples * result["capacity_model"]["row_bytes"],
            result["ingest"]["warmup_vectors"],
            until=result["traffic_seconds"],
            model_bytes={
                "server_rss": args.max_samples * cap["engine_per_vector"],
                "redis_used_memory": args.max_samples * cap["redis_per_vector"],
                "redis_rss": args.max_samples * cap["redis_per_vector"],
            },
        )
    if args.restart_check:
        print("restart on the same data ...", flush=True)
        in_log = result["loss_check"]["log_rows"]
        expected = in_log if retention == "all" else result["ingest"]["acked_total"]
        restart_log = tmp / "service-restart.log"
        result["restart"] = _restart(args, settings, data_dir, restart_log, cgroup, expected)


def run(args: argparse.Namespace, command: str, machine: dict[str, Any]) -> dict[str, Any]:
    """One run with ``args`` (see :mod:`benchmarks.soak.cli`); its JSON record, checks included.

    An exception during the run is recorded (``error``: its traceback) with everything
    measured until then; the cgroup and the data folder are removed in any case.
    """
    settings = service_settings(args)
    result: dict[str, Any] = {
        "command": command,
        "machine": machine,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "retention": settings.get("NMBATCH_RETENTION", "all"),
        "max_samples": args.max_samples,
        "settings": {k: v for k, v in settings.items() if k not in _HIDDEN},
        "capacity_model": capacity_model(args.dim, args.k),
        "code": code_version(),
        "notes": list(args.note),
    }
    limit = memory_limit(args)
    dmesg_before = kernel_log()
    cgroup = None
    if limit is not None:
        cgroup = MemoryCgroup.create(cgroup_name(), limit[0])
        result["cgroup"] = {"limit_bytes": limit[0], "rule": limit[1], "start": cgroup.read()}
    tmp = Path(tempfile.mkdtemp(prefix="nmbatch-soak-"))
    try:
        _measure(result, args, settings, cgroup, tmp)
    except Exception:
        text = traceback.format_exc().replace(str(tmp), "<tmp>").replace(str(REPO), ".")
        result["error"] = text
        print(text, flush=True)
    finally:
        if cgroup is not None:
            result.setdefault("cgroup", {})["end"] = cgroup.read()
            result["cgroup"]["removed"] = cgroup.remove()
        if args.keep_data:
            print(f"data kept in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    restarts = [
        (s.get("metrics") or {}).get("nmbatch_engine_restarts_total")
        for s in result.get("samples", [])
    ]
    restarts = [r for r in restarts if r is not None]
    result["oom"] = {
        "cgroup_oom_kill": (result.get("cgroup") or {}).get("end", {}).get("oom_kill"),
        "kernel_log": oom_reports(dmesg_before, kernel_log()),
        "engine_restarts": int(max(restarts)) if restarts else None,
    }
    complete = all(key in result for key in ("ingest", "assign", "readiness"))
    result["checks"] = analysis.checks(result) if complete else []
    if "error" in result:
        first = result["error"].strip().splitlines()[-1]
        result["checks"].append(
            {"check": "the run completed", "measured": first, "wanted": "no error", "met": False}
        )
    return result
