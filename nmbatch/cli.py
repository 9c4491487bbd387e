"""The ``nmbatch`` command-line tool: run the service, cluster a file, run the benchmark.

Subcommands, each run by the package it belongs to:

- ``nmbatch serve`` (``nmbatch.service.cli``): the HTTP service, exactly as
  ``python -m nmbatch``; options override the ``NMBATCH_*`` settings (``--host``,
  ``--port``, ``--redis-url``, ``--k``, or any setting with ``--set NAME=VALUE``).
- ``nmbatch fit`` (``nmbatch.engine.fit``): cluster the rows of an ``.npy``, ``.npz`` or
  CSV file with an engine algorithm (default ``nmbatch``) and write the centroids
  ``(k, d)`` and the labels ``(n,)`` of every row (its exact nearest centroid). A
  progress line on stderr shows the iteration, the nested batch size and the energy
  estimate.
- ``nmbatch sweep`` (``nmbatch.engine.fit``, the math in ``nmbatch.engine.sweep``):
  fit several ``k`` on a data file, report the held-out energy and silhouette of each,
  and recommend one.
- ``nmbatch push FILE`` and ``nmbatch watch`` (``nmbatch_client.cli``): send
  the rows of a ``.npy``/``.csv`` file to a running service, and follow its centroid
  versions and statistics, with the Python client.
- ``nmbatch bench``: the benchmarks, which live in the repository's ``benchmarks/``
  folder and are not installed with the wheel. From a checkout (the current directory,
  or the checkout this package was installed from in editable mode) it runs
  ``python -m benchmarks`` with every argument after ``bench`` unchanged, ``--help``
  included; elsewhere it says where the benchmarks are and exits with status 2.

This module holds the argument parser and the dispatch. Imports are lazy: ``nmbatch
fit`` loads numpy and the engine only, never FastAPI, and ``nmbatch --help`` loads
neither. ``python -m nmbatch.cli`` is the same as the ``nmbatch`` console script.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ALGORITHM_CHOICES", "build_parser", "main"]

PROG = "nmbatch"
#: Algorithms of the engine (``nmbatch.engine.ALGORITHMS``), repeated here so ``--help``
#: needs no numba.
ALGORITHM_CHOICES = ("nmbatch", "nmbatch.deact", "mbatch", "mbatch.remove", "lloyd", "elkan")


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


def _ks(text: str) -> list[int]:
    """``--ks``: comma-separated positive integers."""
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"every k must be >= 1, got {text!r}")
    return ks


#: The seeding methods of ``nmbatch fit --init`` (the engine's ``SEEDINGS``, without numba).
INIT_METHODS = ("auto", "k-means++", "k-means++.sub", "k-means||", "afk-mc2", "random", "first")


def _init_choice(text: str) -> str | Path:
    """A seeding method of :data:`INIT_METHODS`, or the path of a centroids file."""
    if text in INIT_METHODS:
        return text
    path = Path(text)
    if path.suffix.lower() not in (".npy", ".npz", ".csv", ".tsv", ".txt"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a method ({', '.join(INIT_METHODS)}) nor a .npy/.csv file"
        )
    return path


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``nmbatch`` with its subcommands."""
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
        "-k", "--k", dest="k", type=_positive_int,
        help="number of clusters (default with --init FILE: its rows)",
    )  # fmt: skip
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
        type=_init_choice,
        default="auto",
        metavar="METHOD|FILE",
        help=f"initial centroids, as the estimator's init=: a method ({', '.join(INIT_METHODS)}) "
        "or a .npy/.csv file of (k, d) centroids (default: %(default)s)",
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

    sweep = sub.add_parser(
        "sweep",
        help="fit several k on a data file and recommend one",
        description=(
            "Choose k: fit each k of --ks on 80%% of the rows (drawn uniformly) and report "
            "the held-out energy of the other 20%%, the silhouette of up to 2,000 of them, "
            "the fit's time, and a recommended k (the elbow of the held-out energy on "
            "log-log axes). Input as for `nmbatch fit`."
        ),
    )
    sweep.add_argument("input", type=Path, help="data file: .npy, .npz, .csv, .tsv or .txt")
    sweep.add_argument(
        "--ks", type=_ks, required=True, metavar="K,K,...",
        help="the values of k to fit, comma-separated (e.g. 8,16,32,64,128)",
    )  # fmt: skip
    sweep.add_argument("--key", help="array name inside a .npz file")
    sweep.add_argument(
        "--metric", choices=("euclidean", "cosine"), default="euclidean",
        help="euclidean (k-means) or cosine (spherical k-means) (default: %(default)s)",
    )  # fmt: skip
    sweep.add_argument(
        "--batch-size", type=_positive_int, default=5000,
        help="first (nested) batch size of each fit (default: %(default)s)",
    )  # fmt: skip
    sweep.add_argument(
        "--max-rows", type=_positive_int,
        help="fit on a uniform sample of at most this many rows (default: all)",
    )  # fmt: skip
    sweep.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    sweep.add_argument(
        "--threads", type=_positive_int, help="threads of each fit (default: all cores)"
    )
    sweep.add_argument("--json", type=Path, help="also write the result as JSON to this file")

    from nmbatch_client.cli import add_client_commands  # argparse only

    add_client_commands(sub, _positive_int)

    # Everything after `bench` goes to the checkout's benchmarks untouched (main() never
    # parses it); this entry only makes `bench` appear in `nmbatch --help`.
    sub.add_parser(
        "bench",
        help="run the benchmarks from a checkout of the repository (arguments as for "
        "`python -m benchmarks`)",
        add_help=False,
    )
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nmbatch")
    except PackageNotFoundError:
        return "(not installed)"


def _is_checkout(root: Path) -> bool:
    """Whether ``root`` is a checkout of this repository with its ``benchmarks/`` folder."""
    import tomllib

    try:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    name = project.get("project", {}).get("name")
    return name == "nmbatch" and (root / "benchmarks" / "cli.py").is_file()


def benchmarks_checkout(roots: Sequence[Path] | None = None) -> Path | None:
    """The first of ``roots`` that is a checkout holding ``benchmarks/``, or None.

    Default ``roots``: the current directory, then the folder above this package (the
    source checkout after an editable install; ``site-packages`` after a wheel's, where
    no ``benchmarks`` is installed).
    """
    if roots is None:
        roots = [Path.cwd(), Path(__file__).resolve().parents[1]]
    return next((root for root in roots if _is_checkout(root)), None)


def run_bench(argv: Sequence[str], roots: Sequence[Path] | None = None) -> int:
    """Run ``python -m benchmarks argv`` from the checkout :func:`benchmarks_checkout`
    finds among ``roots``; without one, say where the benchmarks are and return 2."""
    root = benchmarks_checkout(roots)
    if root is None:
        print(
            f"{PROG} bench: the benchmarks live in a checkout of the repository: they are "
            "not installed with the package. Clone the repository, install it with "
            "`pip install -e '.[bench]'`, and run `nmbatch bench` (or `python -m "
            "benchmarks`) from its root.",
            file=sys.stderr,
        )
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks.cli import main as bench_main

    try:
        code = bench_main(list(argv))
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return int(code or 0)


def _error(command: str, exc: Exception) -> int:
    print(f"{PROG} {command}: error: {exc}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nmbatch`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        # Not parsed here: the benchmark owns its options (and its --help).
        return run_bench(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from nmbatch.service.cli import ServeError, run_serve

        try:
            return run_serve(args)
        except ServeError as exc:
            return _error(args.command, exc)
    if args.command in ("push", "watch"):
        from nmbatch_client.cli import run_client_command

        return run_client_command(args)
    if args.command in ("fit", "sweep"):
        from nmbatch.engine.fit import FitError, run_fit, run_sweep

        try:
            if args.command == "sweep":
                return run_sweep(args, sys.stdout)
            return run_fit(args, sys.stderr)
        except FitError as exc:
            return _error(args.command, exc)
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse checks
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
