"""``python -m benchmarks.loadtest``: the command line of the load benchmark.

Parses the options, runs the chosen phases one after the other (:func:`run_phase`), prints
a line or two per phase, and rewrites ``loadtest.json`` and ``loadtest.md`` in ``--out``
after every phase, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks import loadtest
from benchmarks.loadtest.phases import phase_specs, run_phase
from benchmarks.loadtest.probes import machine
from benchmarks.loadtest.report import markdown, write_results
from benchmarks.loadtest.summary import TARGETS, targets

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m benchmarks.loadtest`` (``--help`` lists them with defaults)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.loadtest",
        description=loadtest.__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--out", type=Path, required=True, help="folder for the results")
    add(
        "--phases",
        default="npy,octet,json,assign,assign-max,assign-alone,soak",
        help="comma-separated subset of npy, octet, json, assign, assign-max, assign-alone, soak",
    )
    add("--phase-seconds", type=float, default=20.0, help="length of each full-speed phase")
    add("--assign-seconds", type=float, default=20.0, help="length of each /assign phase")
    add("--soak-seconds", type=float, default=300.0)
    add("--soak-rate", type=float, default=25_000.0, help="soak ingestion, vectors/s (paced)")
    add("--assign-rate", type=float, default=1000.0, help="/assign requests/s (paced)")
    add(
        "--assign-ingest-rate",
        type=float,
        default=200_000.0,
        help="npy ingestion of the assign phase, vectors/s (paced; assign-max: full speed)",
    )
    add("--assign-alone-rate", type=float, default=2000.0, help="/assign of assign-alone")
    add("--dim", type=int, default=128)
    add("--batch", type=int, default=1000, help="vectors per request")
    add("--k", type=int, default=16)
    add("--ingest-procs", type=int, default=2, help="ingesting client processes")
    add("--ingest-conns", type=int, default=3, help="connections per process at full speed")
    add("--soak-conns", type=int, default=3, help="connections per process when paced")
    add("--assign-conns", type=int, default=8, help="connections of the /assign client")
    add("--probe-interval", type=float, default=2.0, help="seconds between delay probes")
    add("--probe-poll-ms", type=float, default=10.0, help="GET /centroids period of a probe")
    add(
        "--catch-up-timeout",
        type=float,
        default=180.0,
        help="seconds to wait after a phase for the worker to hold the whole log",
    )
    add(
        "--wait-quiet",
        type=float,
        default=900.0,
        help="before each phase, wait up to this long for other programs to leave the cores",
    )
    add(
        "--preload",
        type=int,
        default=0,
        help="vectors stored before each phase starts (a big store from the first second)",
    )
    add("--raw", action="store_true", help="save each request's end and latency (raw-*.npz)")
    add(
        "--engine",
        choices=("process", "thread"),
        default="process",
        help="where the server runs the worker's engine (NMBATCH_WORKER_PROCESS)",
    )
    add("--worker-threads", type=int, default=1,
        help="threads of the engine's kernels (NMBATCH_WORKER_THREADS)")  # fmt: skip
    add("--engine-sched-idle", action="store_true",
        help="the engine process in SCHED_IDLE, not at its niceness alone "
             "(NMBATCH_ENGINE_SCHED_IDLE)")  # fmt: skip
    add(
        "--retention",
        choices=("all", "window", "age", "reservoir"),
        default="all",
        help="the server's retention policy (NMBATCH_RETENTION)",
    )
    add("--max-samples", type=int, default=None,
        help="window or reservoir size, capacity of all and age (NMBATCH_MAX_SAMPLES)")  # fmt: skip
    add("--max-age-seconds", type=float, default=None,
        help="age of the age retention (NMBATCH_MAX_AGE_SECONDS)")  # fmt: skip
    add("--set", action="append", default=[], metavar="NMBATCH_NAME=VALUE",
        help="another server setting (repeatable): NMBATCH_WRITE_SHED_LAG_MS=0")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the load benchmark with ``argv`` (default: the command line); the exit code.

    1 when a server did not exit with 0 on SIGTERM, else 0.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.worker_process = args.engine == "process"

    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    specs = phase_specs(args)
    unknown = set(wanted) - set(specs)
    if unknown:
        parser.error(f"unknown phase(s) {sorted(unknown)}")
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": "python -m benchmarks.loadtest "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "targets_wanted": TARGETS,
        "phases": [],
    }
    for name in wanted:
        spec = specs[name]
        print(f"phase {spec.name}: {spec.seconds:g} s ...", flush=True)
        phase = run_phase(spec, args)
        result["phases"].append(phase)
        ing, asg = phase.get("ingest"), phase.get("assign")
        if ing:
            print(f"  ingest {ing['vectors_per_second']:,.0f} vectors/s, errors {ing['errors']}, "
                  f"shed {ing.get('shed', 0)}",
                  flush=True)  # fmt: skip
        if asg and asg["requests_per_second"] is None:
            print(f"  assign: no answer within the phase, errors {asg['errors']}", flush=True)
        elif asg:
            lat = asg["latency_ms"]
            print(f"  assign {asg['requests_per_second']:,.0f} req/s, median "
                  f"{lat['median']:.2f} ms, p99 {lat['p99']:.2f} ms, errors {asg['errors']}",
                  flush=True)  # fmt: skip
        print(f"  CPU cores used: {phase['cpu_cores_used']}", flush=True)
        # Written after every phase, so an interrupted run keeps what it measured.
        result["targets"] = targets(result)
        write_results(result, args.out)
    print(markdown(result))
    failed_exit = any(p["exit_code"] != 0 for p in result["phases"])
    return 1 if failed_exit else 0
