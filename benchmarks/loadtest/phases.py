"""The phases of the load benchmark and the runner of one phase.

``npy``, ``octet``, ``json`` (phases ``ingest-*``)
    Ingestion at full speed: ``--ingest-procs`` processes x ``--ingest-conns``
    connections POST batches of ``--batch`` vectors of dimension ``--dim`` back to back
    (``application/x-npy``, raw little-endian ``float32`` as
    ``application/octet-stream``, ``{"vectors": ...}``) for ``--phase-seconds``.
``assign``
    Single-vector ``GET /assign`` paced (open loop) at ``--assign-rate`` requests/s over
    ``--assign-conns`` connections while npy batches are ingested, paced at
    ``--assign-ingest-rate`` vectors/s. Latency counts from the scheduled send time, so
    a stalled server cannot hide behind a client that waits (no coordinated omission).
``assign-max``
    The same with ingestion at full speed (reported, not judged against a target).
``assign-alone``
    ``/assign`` only, at ``--assign-alone-rate``: the cost of one request.
``soak``
    ``--soak-seconds`` (300: the 5-minute run) of paced ingestion at ``--soak-rate``
    vectors/s (npy, octet-stream and JSON connections in turn) and paced ``/assign`` at
    ``--assign-rate``. Errors must be 0; the RSS of the server and of ``redis-server`` at
    start and end is checked against the growth the data alone explain.

Each phase runs on a fresh server (no phase inherits the memory or the store size of
another), after a warm-up (JIT-compiled kernels, first iterations) and, on a shared
machine, after waiting for other programs to leave the cores (``--wait-quiet``).

Every ingesting phase also runs a probe: every ``--probe-interval`` s it POSTs one npy
batch and, from its ``202``, polls ``GET /centroids`` (``If-None-Match``) until the
published version has ``n_samples`` covering the acknowledged total (the centroids were
computed with the new data in the worker's store), and until its ``batch_size`` does
(the nested batch has grown over it). After the clients stop, the phase waits for the
worker to hold the whole log (reported as the catch-up time) before the last sample.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
from typing import Any

import numpy as np

from benchmarks.loadtest.client import (
    CONTENT_TYPES,
    Connection,
    assign_client,
    encode_body,
    ingest_client,
    ingest_requests,
    probe_client,
    synthetic,
)
from benchmarks.loadtest.probes import wait_quiet
from benchmarks.loadtest.server import Sampler, Server
from benchmarks.loadtest.spec import PhaseSpec
from benchmarks.loadtest.summary import summarise

__all__ = ["PhaseSpec", "phase_specs", "run_phase"]


def phase_specs(args: argparse.Namespace) -> dict[str, PhaseSpec]:
    """Every phase by its ``--phases`` name, with lengths and rates from ``args``."""
    return {
        "npy": PhaseSpec("ingest-npy", args.phase_seconds, ["npy"]),
        "octet": PhaseSpec("ingest-octet", args.phase_seconds, ["octet"]),
        "json": PhaseSpec("ingest-json", args.phase_seconds, ["json"]),
        "assign": PhaseSpec(
            "assign",
            args.assign_seconds,
            ["npy"],
            ingest_rate=args.assign_ingest_rate,
            assign_rate=args.assign_rate,
        ),
        "assign-max": PhaseSpec(
            "assign-max", args.assign_seconds, ["npy"], assign_rate=args.assign_rate
        ),
        "assign-alone": PhaseSpec(
            "assign-alone", args.assign_seconds, [], assign_rate=args.assign_alone_rate
        ),
        "soak": PhaseSpec(
            "soak",
            args.soak_seconds,
            ["npy", "octet", "json"],
            ingest_rate=args.soak_rate,
            assign_rate=args.assign_rate,
            sample_every=5.0,
        ),
    }


def _warm_up(server: Server, args: argparse.Namespace) -> None:
    """JIT-compiled kernels, first iterations and every code path, outside the clock."""
    import httpx

    with httpx.Client(base_url=server.base, timeout=60) as http:
        for i, kind in enumerate(("npy", "octet", "json") * 3):
            body = encode_body(kind, synthetic(args.batch, args.dim, 900 + i))
            http.post("/samples", content=body, headers={"content-type": CONTENT_TYPES[kind]})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = http.get("/centroids")
            if r.status_code == 200 and r.json()["n_samples"] >= 9 * args.batch:
                break
            time.sleep(0.1)
        q = ",".join(["0"] * args.dim)
        for _ in range(200):
            http.get("/assign", params={"vector": q})


def _wait_caught_up(server: Server, deadline: float, timeout: float) -> tuple[float | None, ...]:
    """Seconds after ``deadline`` until the worker's store holds the whole log, and until
    it converged on it (None: not within ``timeout``).

    The last resource sample is taken once converged: no iteration holds a store buffer
    that a capacity doubling has just replaced, so the RSS is the data's.
    """
    give_up = time.monotonic() + timeout
    caught_up = None
    while time.monotonic() < give_up:
        stats = server.get_json("/stats")
        if caught_up is None and stats["N"] >= stats["n_logged"]:
            caught_up = max(0.0, time.monotonic() - deadline)
        if caught_up is not None and stats["converged"] and stats["N"] >= stats["n_logged"]:
            return caught_up, max(0.0, time.monotonic() - deadline)
        time.sleep(0.1)
    return caught_up, None


def _preload(server: Server, args: argparse.Namespace, vectors: int) -> None:
    """POST ``vectors`` vectors (raw float32, 4 connections), then wait for convergence."""
    if vectors <= 0:
        return
    requests = ingest_requests("octet", args.dim, args.batch, 4242)
    count = -(-vectors // args.batch)

    async def run() -> None:
        sent = 0

        async def one_connection() -> None:
            nonlocal sent
            conn = Connection(server.port)
            while sent < count:
                sent += 1
                status, body = await conn.request(requests[sent % len(requests)])
                if status != 202:
                    raise RuntimeError(f"preload refused: HTTP {status}: {body[:200]!r}")
            conn.close()

        await asyncio.gather(*(one_connection() for _ in range(4)))

    asyncio.run(run())
    _wait_caught_up(server, time.monotonic(), args.catch_up_timeout)


def run_phase(spec: PhaseSpec, args: argparse.Namespace) -> dict[str, Any]:
    """Start a server, warm it up, run ``spec``, stop it; what was measured."""
    quiet = wait_quiet(args.wait_quiet)
    server = Server(args)
    ctx = mp.get_context("spawn")
    try:
        server.wait_ready()
        _warm_up(server, args)
        _preload(server, args, args.preload)
        time.sleep(1.0)
        q = ctx.Queue()
        start = time.monotonic() + 3.0  # client processes start and encode before this
        deadline = start + spec.seconds
        common = {"port": server.port, "dim": args.dim, "batch": args.batch}
        procs = []
        if spec.ingest_kinds:
            n_procs = args.ingest_procs
            conns = args.ingest_conns if spec.ingest_rate is None else args.soak_conns
            per_conn = (
                None
                if spec.ingest_rate is None
                else spec.ingest_rate / args.batch / (n_procs * conns)
            )
            for p in range(n_procs):
                # Connection j of process p sends kinds[(p * conns + j) % len(kinds)].
                kinds = [
                    spec.ingest_kinds[(p * conns + j) % len(spec.ingest_kinds)]
                    for j in range(conns)
                ]
                cfg = common | {
                    "kinds": kinds,
                    "conns": conns,
                    "rate": per_conn,
                    "seed": 100 + p,
                    "start": start + p / max(1, n_procs) / max(per_conn or 1e9, 1e-9),
                    "deadline": deadline,
                }
                procs.append(ctx.Process(target=ingest_client, args=(cfg, q)))
            cfg = common | {
                "seed": 7,
                "start": start,
                "deadline": deadline,
                "interval": args.probe_interval,
                "poll_seconds": args.probe_poll_ms / 1000.0,
                "max_wait": 60.0,
            }
            procs.append(ctx.Process(target=probe_client, args=(cfg, q)))
        if spec.assign_rate:
            cfg = common | {
                "seed": 3,
                "conns": args.assign_conns,
                "rate": spec.assign_rate,
                "start": start,
                "deadline": deadline,
            }
            procs.append(ctx.Process(target=assign_client, args=(cfg, q)))
        for p in procs:
            p.start()
        time.sleep(max(0.0, start - time.monotonic()))
        sampler = Sampler(server, spec.sample_every)
        sampler.start()
        reports = [q.get(timeout=spec.seconds + 300) for _ in procs]
        for p in procs:
            p.join()
        catch_up, settled = _wait_caught_up(server, deadline, args.catch_up_timeout)
        samples = sampler.stop()
        stats = server.get_json("/stats")
        centroids = server.get_json("/centroids")
    finally:
        exit_code = server.stop()
    if args.raw:
        arrays = {}
        for i, r in enumerate(reports):
            for key in ("ends", "latencies"):
                arrays[f"{r['role']}{i}_{key}"] = np.asarray(r[key]) - (
                    start if key == "ends" else 0
                )
        # The phase's start on this machine's monotonic clock: raw times line up with
        # other recordings (e.g. /proc/stat) taken meanwhile.
        arrays["start_monotonic"] = np.asarray(start)
        np.savez_compressed(args.out / f"raw-{spec.name}.npz", **arrays)
    out = summarise(spec, args, start, deadline, reports, samples, stats, centroids, exit_code)
    # Redis forks for each rewrite of its append-only file (the child dumps the dataset).
    forks = [sm.get("redis_forks") for sm in samples if sm.get("redis_forks") is not None]
    out["redis_forks"] = (forks[-1] - forks[0]) if forks else None
    out["redis_latest_fork_ms"] = samples[-1].get("redis_latest_fork_ms")
    out["catch_up_seconds"] = catch_up
    out["converged_seconds"] = settled
    out["before_start"] = quiet
    cpu = out["cpu_cores_used"]
    if "machine" in cpu:
        cpu["other programs"] = cpu["machine"] - sum(
            cpu.get(key, 0.0) for key in ("server", "redis", "clients")
        )
    return out
