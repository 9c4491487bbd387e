"""``python -m benchmarks.soak``: the command line of the soak and capacity benchmark.

Parses the options, runs once (:func:`benchmarks.soak.run.run`), writes ``soak.json``,
``soak.md`` and ``soak.png`` to ``--out`` and prints the checks. The exit code is 0 when
every check is met, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from benchmarks import soak
from benchmarks.loadtest.probes import machine, wait_quiet
from benchmarks.soak.report import write_results
from benchmarks.soak.run import run

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m benchmarks.soak`` (``--help`` lists them with defaults)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description=(soak.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--out", type=Path, required=True, help="folder for soak.json, soak.md, soak.png")
    add("--retention", default=None, help="NMBATCH_RETENTION (unset: the service's default)")
    add("--max-samples", type=int, default=None, help="NMBATCH_MAX_SAMPLES (capacity or window)")
    add(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another NMBATCH_* setting of the service (repeatable; the prefix may be left out)",
    )
    add("--dim", type=int, default=128)
    add("--k", type=int, default=16)
    add("--batch", type=int, default=10_000, help="vectors per POST /samples (.npy)")
    add("--total", type=int, default=50_000_000, help="vectors to post at most")
    add("--rate", type=float, default=100_000.0, help="vectors/s, paced; 0: back to back")
    add("--ingest-conns", type=int, default=4, help="connections of the ingest client")
    add("--bodies", type=int, default=16, help="distinct batches the ingest client cycles")
    add(
        "--after-full-seconds",
        type=float,
        default=None,
        help="stop posting this long after the first 507 (unset: post --total)",
    )
    add("--max-seconds", type=float, default=3600.0, help="longest traffic")
    add("--assign-rate", type=float, default=1000.0, help="GET /assign requests/s (paced)")
    add("--assign-conns", type=int, default=8)
    add(
        "--memory-limit",
        default="none",
        help="memory cgroup (v1) limit of the service: none, auto (from the capacity) or a "
        "size (7g, 6.5GiB, bytes)",
    )
    add("--limit-margin", type=float, default=1.1, help="auto limit: factor on the samples' bytes")
    add("--fixed-overhead", default="1g", help="auto limit: bytes added for what does not grow")
    add("--sample-every", type=float, default=1.0, help="seconds between samples")
    add("--slice-seconds", type=float, default=10.0, help="slices of the /assign latency table")
    add("--warmup-batches", type=int, default=2, help="batches posted before the traffic")
    add("--ready-timeout", type=float, default=600.0, help="seconds to wait for /readyz")
    add(
        "--catch-up-timeout",
        type=float,
        default=600.0,
        help="seconds to wait after the traffic for the engine to hold the log",
    )
    add("--tail-seconds", type=float, default=5.0, help="sampling after the catch-up")
    add("--restart-check", action="store_true", help="restart on the same data afterwards")
    add("--keep-data", action="store_true", help="keep the temporary data folder")
    add(
        "--wait-quiet",
        type=float,
        default=600.0,
        help="first wait up to this long for other programs to leave the cores",
    )
    add("--note", action="append", default=[], help="a line for the report's notes")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the soak with ``argv`` (default: the command line); 0 when every check is met."""
    args = build_parser().parse_args(argv)
    words = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.soak " + shlex.join(words)
    quiet = wait_quiet(args.wait_quiet)
    result = run(args, command, machine())
    result["before_start"] = quiet
    write_results(result, args.out)
    failed = [row for row in result["checks"] if row["met"] is False]
    for row in result["checks"]:
        met = {True: "yes", False: "NO", None: "-"}[row["met"]]
        print(f"  {met:>3}  {row['check']}: {row['measured']} (wanted {row['wanted']})")
    print(f"results in {args.out}")
    return 1 if failed else 0
