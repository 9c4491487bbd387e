"""The ``nmbatch`` command-line tool: run the service, cluster a file, run the benchmark.

Subcommands:

- ``nmbatch serve``: the HTTP service, exactly as ``python -m nmbatch``; options override
  the ``NMBATCH_*`` settings (``--host``, ``--port``, ``--redis-url``, ``--k``, or any
  setting with ``--set NAME=VALUE``).
- ``nmbatch fit``: cluster the rows of an ``.npy``, ``.npz`` or CSV file with an engine
  algorithm (default ``nmbatch``) and write the centroids ``(k, d)`` and the labels
  ``(n,)`` of every row (its exact nearest centroid). A progress line on stderr shows the
  iteration, the nested batch size and the energy estimate.
- ``nmbatch bench``: the benchmark (``engine.bench.cli.main``, also ``python -m
  engine.bench``); every argument after ``bench`` is passed on unchanged, ``--help``
  included.

Imports are lazy: ``nmbatch fit`` loads numpy and the engine only, never FastAPI, and
``nmbatch --help`` loads neither.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np

__all__ = ["main"]

PROG = "nmbatch"
ENV_PREFIX = "NMBATCH_"
#: Algorithms of the engine (``engine.ALGORITHMS``), repeated here so ``--help`` needs no numba.
ALGORITHM_CHOICES = ("nmbatch", "nmbatch.deact", "mbatch", "mbatch.remove", "lloyd", "elkan")
CSV_SUFFIXES = (".csv", ".tsv", ".txt")


class CLIError(Exception):
    """A user error (bad file, bad option value): printed as one line, exit status 2."""


# --------------------------------------------------------------------------------------
# argument parsing
# --------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``nmbatch`` with its three subcommands."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Streaming k-means on Nested Mini-Batch K-Means (Newling & Fleuret, 2016).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the HTTP service (like `python -m nmbatch`)",
        description=(
            "Run the clustering service. Settings come from NMBATCH_* environment variables "
            "(and a .env file); the options below override them for this run. With no Redis "
            "URL the service starts its own embedded redis-server."
        ),
    )
    serve.add_argument("--host", help="address to listen on (NMBATCH_HOST)")
    serve.add_argument("--port", type=int, help="TCP port to listen on (NMBATCH_PORT)")
    serve.add_argument(
        "--redis-url", help="Redis to persist to, e.g. redis://localhost:6379/0 (NMBATCH_REDIS_URL)"
    )
    serve.add_argument(
        "-k", "--k", dest="k", type=_positive_int, help="number of clusters (NMBATCH_K)"
    )
    serve.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override any setting, e.g. --set rho=50 (repeatable; names as in NMBATCH_NAME)",
    )

    fit = sub.add_parser(
        "fit",
        help="cluster the rows of a .npy/.npz/.csv file",
        description=(
            "Cluster the rows of a data file and write the centroids and the labels. "
            "Input: .npy (a 2-D array), .npz (the array named by --key; default 'train' if "
            "present, else the first), or .csv/.tsv/.txt (numbers; a header line is skipped). "
            "Arrays with more than 2 dimensions are flattened to (n, features). Outputs are "
            ".npy, or text when the name ends in .csv/.txt. The labels are each row's exact "
            "nearest centroid."
        ),
    )
    fit.add_argument("input", type=Path, help="data file: .npy, .npz, .csv, .tsv or .txt")
    fit.add_argument(
        "-k", "--k", dest="k", type=_positive_int, required=True, help="number of clusters"
    )
    fit.add_argument(
        "--centroids",
        type=Path,
        required=True,
        help="output file for the centroids, shape (k, d), float32",
    )
    fit.add_argument(
        "--labels",
        type=Path,
        help="output file for the label of every input row, shape (n,), int64",
    )
    fit.add_argument("--key", help="array name inside a .npz file")
    fit.add_argument(
        "--algorithm",
        choices=ALGORITHM_CHOICES,
        default="nmbatch",
        help="engine algorithm (default: %(default)s)",
    )
    fit.add_argument(
        "--rho",
        type=_positive_float,
        default=100.0,
        help="batch doubling threshold of nmbatch (default: %(default)s)",
    )
    fit.add_argument(
        "--batch-size",
        type=_positive_int,
        default=5000,
        help="first (nested) batch size (default: %(default)s)",
    )
    fit.add_argument(
        "--init",
        choices=("k-means++", "first"),
        default="k-means++",
        help="initial centroids (default: %(default)s)",
    )
    fit.add_argument(
        "--max-iter",
        type=_positive_int,
        default=300,
        help="stop after this many iterations (default: %(default)s)",
    )
    fit.add_argument(
        "--seed",
        type=int,
        default=None,
        help="random seed (shuffle and initialisation); default: random",
    )
    fit.add_argument(
        "-q", "--quiet", action="store_true", help="no progress line and no summary on stderr"
    )

    # Everything after `bench` goes to engine.bench untouched (main() never parses it);
    # this entry only makes `bench` appear in `nmbatch --help`.
    sub.add_parser(
        "bench",
        help="run the benchmark (arguments as for `python -m nmbatch.engine.bench`)",
        add_help=False,
    )
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nmbatch")
    except PackageNotFoundError:
        return "(not installed)"


# --------------------------------------------------------------------------------------
# serve
# --------------------------------------------------------------------------------------
def serve_environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``NMBATCH_*`` variables that ``serve``'s options set, checked against Settings.

    Raises ``CLIError`` for a ``--set`` name that is not a field of
    ``service.config.Settings``.
    """
    from nmbatch.service.config import Settings  # pydantic only: no FastAPI

    fields = set(Settings.model_fields)
    values: dict[str, str] = {}
    for name in ("host", "port", "redis_url", "k"):
        value = getattr(args, name)
        if value is not None:
            values[name] = str(value)
    for item in args.overrides:
        name, sep, value = item.partition("=")
        name = name.strip().lower().replace("-", "_")
        if name.startswith(ENV_PREFIX.lower()):
            name = name[len(ENV_PREFIX) :]
        if not sep or not name:
            raise CLIError(f"--set expects NAME=VALUE, got {item!r}")
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise CLIError(f"--set {name}: no such setting (known: {known})")
        values[name] = value
    return {ENV_PREFIX + name.upper(): value for name, value in values.items()}


def run_serve(args: argparse.Namespace) -> int:
    """Run ``python -m nmbatch`` in this process with the option overrides in the environment."""
    import runpy

    os.environ.update(serve_environment(args))
    saved_argv = sys.argv[:]
    sys.argv = [saved_argv[0] if saved_argv else PROG]  # the service must not see our options
    try:
        runpy.run_module("nmbatch", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved_argv
    return 0


# --------------------------------------------------------------------------------------
# fit
# --------------------------------------------------------------------------------------
def load_matrix(path: Path, key: str | None = None) -> np.ndarray:
    """Read the samples of ``path`` as a 2-D array ``(n, d)`` (dtype as stored).

    ``.npy``: the array; ``.npz``: the array ``key`` (default ``train`` if present, else
    the first one); ``.csv``/``.tsv``/``.txt``: numbers separated by ``,``/tab/whitespace,
    a first line that is not numeric is taken for a header. More than 2 dimensions are
    flattened to ``(n, prod(rest))``. Raises ``CLIError`` for anything else.
    """
    import numpy as np

    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            if key is not None:
                raise CLIError("--key applies to .npz files only")
            A = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                names = list(archive.files)
                if not names:
                    raise CLIError(f"{path}: the archive holds no array")
                if key is None:
                    key = "train" if "train" in names else names[0]
                if key not in names:
                    raise CLIError(f"{path}: no array {key!r} (arrays: {', '.join(names)})")
                A = archive[key]
        elif suffix in CSV_SUFFIXES:
            if key is not None:
                raise CLIError("--key applies to .npz files only")
            A = _load_text(path)
        else:
            raise CLIError(f"{path}: unknown file type {suffix!r} (use .npy, .npz or .csv)")
    except (OSError, ValueError) as exc:
        raise CLIError(f"{path}: cannot read: {exc}") from None
    if A.ndim < 2:
        raise CLIError(f"{path}: expected a 2-D array (n_samples, n_features), got shape {A.shape}")
    if A.ndim > 2:
        A = A.reshape(A.shape[0], -1)
    return A


def _load_text(path: Path) -> np.ndarray:
    """Delimited numbers, one sample per line; a non-numeric first line is a header."""
    import numpy as np

    delimiter = {".csv": ",", ".tsv": "\t"}.get(path.suffix.lower())
    with path.open() as handle:
        first = handle.readline()
    fields = first.strip().split(delimiter) if first.strip() else []
    try:
        [float(field) for field in fields]
        skip = 0
    except ValueError:
        skip = 1
    return np.loadtxt(path, delimiter=delimiter, skiprows=skip, ndmin=2, dtype=np.float64)


def save_array(path: Path, array: np.ndarray) -> None:
    """Write ``array`` as ``.npy``, or as text when ``path`` ends in .csv/.tsv/.txt."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix in CSV_SUFFIXES:
        delimiter = {".csv": ",", ".tsv": "\t"}.get(suffix, " ")
        fmt = "%d" if np.issubdtype(array.dtype, np.integer) else "%.9g"
        np.savetxt(path, array, fmt=fmt, delimiter=delimiter)
    else:
        # np.save would append .npy to any other name; write to the exact path asked for.
        with path.open("wb") as handle:
            np.save(handle, array, allow_pickle=False)


class ProgressLine:
    """One progress line on a stream: redrawn in place with ``\\r`` on a terminal.

    Elsewhere (a log, a pipe) a line is written when the batch grows and at the end, so
    the output stays short whatever the number of iterations.
    """

    WIDTH = 20

    def __init__(self, stream: TextIO, n_samples: int, enabled: bool = True) -> None:
        self.stream = stream
        self.n_samples = n_samples
        self.enabled = enabled
        self.tty = enabled and stream.isatty()
        self._last_draw = 0.0
        self._last_batch = -1
        self._text = ""
        self.converged = False

    def update(self, iteration: int, batch_size: int, energy: float, changed: int) -> None:
        """Show iteration ``t``, batch ``b``/N, the energy estimate and labels changed."""
        if not self.enabled:
            return
        filled = round(self.WIDTH * batch_size / max(self.n_samples, 1))
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self._text = (
            f"[{bar}] iter {iteration}  batch {batch_size}/{self.n_samples}  "
            f"energy {energy:.6g}  changed {changed}"
        )
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw >= 0.1:
                self._draw()
                self._last_draw = now
        elif batch_size != self._last_batch:
            self.stream.write(self._text + "\n")
            self.stream.flush()
        self._last_batch = batch_size

    def close(self, summary: str) -> None:
        """Draw the last state, end the line, and write ``summary``."""
        if not self.enabled:
            return
        if self.tty:
            self._draw()
            self.stream.write("\n")
        elif self._text:
            self.stream.write(self._text + "\n")
        self.stream.write(summary + "\n")
        self.stream.flush()

    def _draw(self) -> None:
        self.stream.write("\r" + self._text + "\x1b[K")
        self.stream.flush()


def _estimator_with_progress(params: dict[str, object], progress: ProgressLine) -> object:
    """A ``NestedMiniBatchKMeans(**params)`` whose every iteration updates ``progress``.

    The estimator runs the fit (validation, seeding, labels and inertia of every row), so
    ``nmbatch fit --seed S`` gives exactly ``NestedMiniBatchKMeans(random_state=S).fit(X)``;
    the progress hook wraps the ``step`` of the engine algorithm the estimator builds.
    """
    from nmbatch.engine.estimator import NestedMiniBatchKMeans

    class _ReportingKMeans(NestedMiniBatchKMeans):
        def _make_algorithm(self, store, init, seed):  # type: ignore[no-untyped-def]
            algo = super()._make_algorithm(store, init, seed)
            step = algo.step

            def reporting_step():  # type: ignore[no-untyped-def]
                stats = step()
                progress.update(
                    stats.iteration, stats.batch_size, algo.energy_estimate(), stats.n_changed
                )
                progress.converged = stats.converged
                return stats

            algo.step = reporting_step
            return algo

    return _ReportingKMeans(**params)


def run_fit(args: argparse.Namespace, stderr: TextIO) -> int:
    """Cluster ``args.input`` with ``NestedMiniBatchKMeans``; write centroids and labels."""
    X = load_matrix(args.input, args.key)
    n, d = X.shape
    progress = ProgressLine(stderr, n, enabled=not args.quiet)
    km = _estimator_with_progress(
        {
            "n_clusters": args.k,
            "rho": args.rho,
            "batch_size": args.batch_size,
            "init": args.init,
            "max_iter": args.max_iter,
            "random_state": args.seed,
            "algorithm": args.algorithm,
        },
        progress,
    )
    started = time.perf_counter()
    try:
        km.fit(X)
    except ValueError as exc:  # bad values (NaN, inf), fewer samples than clusters, ...
        raise CLIError(f"{args.input}: {exc}") from None
    seconds = time.perf_counter() - started

    save_array(args.centroids, km.cluster_centers_)
    if args.labels is not None:
        save_array(args.labels, km.labels_)
    state = "converged" if progress.converged else f"stopped at --max-iter {args.max_iter}"
    progress.close(
        f"{args.algorithm}: {state} after {km.n_iter_} iterations in {seconds:.2f} s; "
        f"k={args.k}, n={n}, d={d}, batch {km.batch_size_}/{n}, "
        f"energy (mean squared distance) {km.inertia_ / n:.6g}"
    )
    return 0


# --------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------
def run_bench(argv: Sequence[str]) -> int:
    """Call the benchmark's ``main`` with ``argv`` (as ``python -m nmbatch.engine.bench argv``)."""
    from nmbatch.engine.bench.cli import main as bench_main

    try:
        code = bench_main(list(argv))
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return int(code or 0)


# --------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nmbatch`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        # Not parsed here: the benchmark owns its options (and its --help).
        return run_bench(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return run_serve(args)
        if args.command == "fit":
            return run_fit(args, sys.stderr)
    except CLIError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse checks
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
