"""``nmbatch push`` and ``nmbatch watch``: the client on the command line.

- ``nmbatch push FILE`` sends the rows of a ``.npy`` (read as a memory map: only one
  chunk at a time is in memory), ``.csv``/``.tsv``/``.txt`` (numbers; a non-numeric
  first line is a header), ``.parquet`` or ``.arrow``/``.feather`` file (pyarrow;
  ``--column`` picks the column of vectors or the numeric columns) to ``POST /samples``
  with :meth:`Client.push <nmbatch_client._sync.Client.push>`, streamed a batch of rows
  at a time (:mod:`nmbatch_client.sources`): chunked, retried, every chunk stored once,
  with a progress bar on a terminal. A push that fails half-way says how to finish it
  without duplicates (the same command with ``--idempotency-key``). ``--wait`` then
  waits for convergence.
- ``nmbatch watch`` prints lines from ``GET /stats``: the centroid version and how many
  versions appeared since the last line, ``N``, the ingestion rate, ``b``, the
  iteration, the energy estimate, the phase and the share of distances the bounds
  skipped, then the events that caused the line. It follows the model's events
  (``GET /events``, :meth:`Client.events <nmbatch_client._sync.Client.events>`): a line
  as soon as events arrive (those that came together on one line), and one after
  ``--interval`` seconds without any. Against a service without ``/events`` (404), or
  with ``--poll``, it polls: one line per ``--interval``. ``--count N`` stops after N
  lines, ``--once`` after one.

Both take ``--url`` (``NMBATCH_URL``, default ``http://127.0.0.1:8000``) and
``--api-key`` (``NMBATCH_API_KEY``). Exit status: 0 done, 1 the service refused or did
not answer, 2 a bad file or option. ``nmbatch/cli.py`` (the server's distribution) adds
the parsers with :func:`add_client_commands` and runs :func:`run_client_command`; the
client's own distribution runs them as ``nmbatch-client push`` and ``nmbatch-client
watch`` (:func:`main`). This module imports neither httpx nor numpy until a command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "COMMANDS",
    "DEFAULT_URL",
    "add_client_commands",
    "main",
    "progress_bar",
    "run_client_command",
]

COMMANDS = ("push", "watch")
DEFAULT_URL = "http://127.0.0.1:8000"


class FileError(Exception):
    """A file that cannot be pushed: one line, exit status 2."""


def add_client_commands(
    sub: argparse._SubParsersAction, positive_int: Callable[[str], int]
) -> None:
    """Add ``push`` and ``watch`` to the ``nmbatch`` subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"the service (default: $NMBATCH_URL, else {DEFAULT_URL})")
    common.add_argument("--api-key", help="the service's API key (default: $NMBATCH_API_KEY)")
    common.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per request (default: %(default)s)"
    )
    common.add_argument(
        "--model", help="a named model (its /models/NAME/... routes; default: the service's)"
    )

    push = sub.add_parser(
        "push",
        parents=[common],
        help="send the rows of a .npy/.csv/.parquet/.arrow file to a running service",
        description=(
            "Send the rows of a data file to POST /samples, in chunks within the service's "
            "limits; each chunk carries an Idempotency-Key and is retried on connection "
            "errors and 503, so it is stored once. Input: .npy (2-D; more dimensions are "
            "flattened to rows), .csv/.tsv/.txt (numbers; a header line is skipped, and "
            "names the columns), .parquet or .arrow/.feather/.ipc (Arrow IPC; both need "
            "pyarrow: one column of lists of numbers, or numeric columns)."
        ),
    )
    push.add_argument(
        "file", type=Path, help="data file: .npy, .csv, .tsv, .txt, .parquet, .arrow, .feather"
    )
    push.add_argument(
        "--column",
        dest="columns",
        action="append",
        metavar="NAME",
        help="a column to push (repeatable): the one column of vectors (lists of numbers), "
        "or numeric columns taken as the dimensions in this order (default: every column)",
    )
    push.add_argument(
        "--batch-rows",
        type=positive_int,
        default=65_536,  # sources.BATCH_ROWS (not imported here: it loads numpy)
        help="rows read from a text or Parquet file at a time (default: %(default)s)",
    )
    push.add_argument(
        "--encoding",
        choices=("npy", "raw"),
        default="npy",
        help="body format: .npy, or raw float32 once the model's dimension is known "
        "(default: %(default)s)",
    )
    push.add_argument(
        "--max-vectors",
        type=positive_int,
        help="rows per request (default: the service's default limit, lowered when it says)",
    )
    push.add_argument(
        "--idempotency-key",
        help="key prefix of the chunks: repeat a failed push with the same key to finish it "
        "without storing anything twice (default: random)",
    )
    push.add_argument(
        "--wait",
        action="store_true",
        help="then wait until the centroids converged on at least the samples pushed",
    )
    push.add_argument(
        "--wait-timeout",
        type=float,
        default=300.0,
        help="seconds --wait waits (default: %(default)s)",
    )
    push.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    watch = sub.add_parser(
        "watch",
        parents=[common],
        help="show the centroid versions and statistics of a running service",
        description=(
            "Print a line of GET /stats as the model's events arrive (GET /events: new "
            "versions, doublings, relocations, retention steps, drift alarms), and after "
            "--interval seconds without one: time, centroid version (and how many versions "
            "appeared since the last line), samples N, ingestion rate, nested batch size b, "
            "iteration, energy estimate, phase, share of distances skipped by the bounds, "
            "the events. Polls every --interval seconds where the service has no events."
        ),
    )
    watch.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds without an event before a line (polling: between lines; "
        "default: %(default)s)",
    )
    watch.add_argument(
        "--poll", action="store_true", help="poll GET /stats instead of following events"
    )
    lines = watch.add_mutually_exclusive_group()
    lines.add_argument("--count", type=positive_int, help="stop after this many lines")
    lines.add_argument("--once", action="store_true", help="print one line and stop")


def run_client_command(
    args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run ``push`` or ``watch``; returns the exit status."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    from nmbatch_client import Client, NmbatchError  # httpx and numpy from here

    url = args.url or os.environ.get("NMBATCH_URL") or DEFAULT_URL
    api_key = args.api_key or os.environ.get("NMBATCH_API_KEY") or None
    try:
        with Client(url, api_key=api_key, timeout=args.timeout, model=args.model) as client:
            if args.command == "push":
                return _push(client, args, stdout, stderr)
            return _watch(client, args, stdout)
    except FileError as exc:
        print(f"nmbatch {args.command}: error: {exc}", file=stderr)
        return 2
    except NmbatchError as exc:
        print(f"nmbatch {args.command}: {exc}", file=stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def progress_bar(done: int, total: int | None, elapsed: float, width: int = 30) -> str:
    """One line of ``nmbatch push``'s progress: a bar when the total is known."""
    rate = f"{done / elapsed:,.0f} rows/s" if elapsed > 0 else ""
    if total is None or total <= 0:
        return f"pushed {done:,} rows  {rate}"
    share = min(1.0, done / total)
    filled = int(share * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {share:4.0%}  {done:,}/{total:,} rows  {rate}"


def _push(client: Any, args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from nmbatch_client import ProblemError
    from nmbatch_client.operations import new_key
    from nmbatch_client.sources import SourceError, open_source

    columns = args.columns if args.columns else None
    try:
        source = open_source(args.file, columns, args.batch_rows)
    except SourceError as exc:
        raise FileError(str(exc).removeprefix(f"{args.file}: ")) from None
    if args.max_vectors is not None:
        client.limits.max_vectors = args.max_vectors
    key = new_key(args.idempotency_key)
    show = not args.quiet and stderr.isatty()
    started = time.monotonic()
    shape: list[int] = [0, 0]  # rows and dimension of the batches read

    def counted(arrays: Any) -> Any:
        for A in arrays:
            shape[0] += A.shape[0]
            shape[1] = A.shape[1] if A.ndim == 2 else shape[1]
            yield A

    def progress(done: int, _streamed: int | None) -> None:
        if show:  # the file's total (the client sees a stream of batches)
            line = progress_bar(done, source.total, time.monotonic() - started)
            print(f"\r{line}", end="", file=stderr, flush=True)

    try:
        result = client.push(
            counted(source.arrays), encoding=args.encoding, idempotency_key=key,
            progress=progress,
        )  # fmt: skip
    except SourceError as exc:
        if show:
            print(file=stderr)
        print(f"nmbatch push: error: {exc}", file=stderr)
        print(
            f"nmbatch push: the rows before it are stored; once the file is fixed, finish "
            f"without storing anything twice: nmbatch push {args.file} --idempotency-key {key}",
            file=stderr,
        )
        return 2
    except ProblemError as exc:
        if show:
            print(file=stderr)
        print(f"nmbatch push: {exc}", file=stderr)
        print(
            f"nmbatch push: to finish without storing anything twice: "
            f"nmbatch push {args.file} --idempotency-key {key}",
            file=stderr,
        )
        return 1
    if show:
        print(file=stderr)
    print(
        f"pushed {result.accepted:,} vectors ({shape[0]:,} x {shape[1]}) in {result.requests} "
        f"request(s), {result.replayed} replayed, {result.retries} retried; the model holds "
        f"{result.n_samples or 0:,} samples",
        file=stdout,
    )
    if args.wait and result.n_samples is not None:
        model = client.wait_for(
            converged=True, min_samples=result.n_samples, timeout=args.wait_timeout
        )
        print(
            f"converged: version {model.version}, N={model.n_samples:,}, b={model.batch_size:,}, "
            f"iteration {model.iteration}",
            file=stdout,
        )
    return 0


WATCH_HEADER = (
    f"{'time':<8}  {'version':>8}  {'new':>4}  {'N':>11}  {'rate/s':>9}  {'b':>9}  "
    f"{'iter':>6}  {'energy':>10}  {'phase':<11}  {'skipped':>7}"
)


def watch_line(stats: dict[str, Any], previous: dict[str, Any] | None, elapsed: float) -> str:
    """One line of ``nmbatch watch`` from a ``/stats`` document and the one before it."""
    version = stats.get("version")
    new = "-"
    if previous is not None and version is not None and previous.get("version") is not None:
        new = f"+{version - previous['version']}"
    rate = "-"
    if previous is not None and elapsed > 0:
        rate = f"{(stats['n_ingested'] - previous['n_ingested']) / elapsed:,.0f}"
    energy = stats.get("energy")
    skipped = stats.get("skipped_share")
    return (
        f"{time.strftime('%H:%M:%S')}  {'-' if version is None else version:>8}  {new:>4}  "
        f"{stats['N']:>11,}  {rate:>9}  {stats['b']:>9,}  {stats['iteration']:>6}  "
        f"{'-' if energy is None else format(energy, '.4g'):>10}  {stats['phase']:<11}  "
        f"{'-' if skipped is None else format(skipped, '.1%'):>7}"
    )


def event_summary(events: list[Any]) -> str:
    """What ``events`` (:class:`~nmbatch_client.events.Event`, oldest first) were, in
    a few words: each type once, with its count when more than one."""
    counts: dict[str, int] = {}
    for event in events:
        counts[event.type] = counts.get(event.type, 0) + 1
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in counts.items())


def _watch(client: Any, args: argparse.Namespace, stdout: TextIO) -> int:
    from nmbatch_client import NmbatchError, NotFoundError, RetryPolicy

    client.retry = RetryPolicy.never()  # a line per interval: an outage shows, not waits
    count = 1 if args.once else args.count
    lines = _Lines(stdout)
    print(WATCH_HEADER, file=stdout, flush=True)
    follow = not args.poll and count != 1
    feed = _EventFeed(client) if follow else None
    while count is None or lines.printed < count:
        events: list[Any] = []
        if lines.printed and feed is not None:
            try:
                events = feed.wait(args.interval)
            except NotFoundError:  # a service without /events: poll it
                feed = None
        if lines.printed and feed is None:
            time.sleep(args.interval)
        try:
            stats = client.stats()
        except NmbatchError as exc:
            lines.unavailable(exc)
        else:
            lines.show(stats, event_summary(events))
    return lines.status


class _Lines:
    """The lines of ``nmbatch watch``, each against the one before it."""

    def __init__(self, stdout: TextIO) -> None:
        self.stdout = stdout
        self.previous: dict[str, Any] | None = None
        self.previous_at = 0.0
        self.printed = self.status = 0

    def show(self, stats: dict[str, Any], events: str) -> None:
        now = time.monotonic()
        line = watch_line(stats, self.previous, now - self.previous_at)
        self._print(f"{line}  {events}" if events else line, 0)
        self.previous, self.previous_at = stats, now

    def unavailable(self, exc: Exception) -> None:
        self._print(f"{time.strftime('%H:%M:%S')}  unavailable: {exc}", 1)

    def _print(self, line: str, status: int) -> None:
        print(line, file=self.stdout, flush=True)
        self.printed += 1
        self.status = status


class _EventFeed:
    """The model's events read on a thread (:meth:`Client.events`, reconnecting), handed
    to ``watch`` in batches: those that arrived since the last :meth:`wait`."""

    def __init__(self, client: Any) -> None:
        import queue
        import threading

        self.queue: queue.Queue[Any] = queue.Queue()
        self._empty = queue.Empty
        threading.Thread(target=self._read, args=(client,), daemon=True).start()

    def _read(self, client: Any) -> None:
        try:
            for event in client.events():
                self.queue.put(event)
        except Exception as exc:  # handed to the reader, raised there
            self.queue.put(exc)

    def wait(self, seconds: float) -> list[Any]:
        """The events that came, waiting up to ``seconds`` for the first; raises what
        the reading thread raised (a refusal: ``NotFoundError`` without ``/events``)."""
        try:
            items = [self.queue.get(timeout=seconds)]
        except self._empty:
            return []
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        for item in items:
            if isinstance(item, Exception):
                raise item
        return items


def main(argv: list[str] | None = None) -> int:
    """``nmbatch-client push ...`` and ``nmbatch-client watch ...`` (the client's own
    distribution; the server's ``nmbatch`` has the same two commands)."""

    def positive_int(text: str) -> int:
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
        return value

    parser = argparse.ArgumentParser(
        prog="nmbatch-client", description="Client of a running nmbatch service."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_client_commands(sub, positive_int)
    return run_client_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
