"""``nmbatch fit``: cluster the rows of a data file and write the centroids and labels.

The command line (``nmbatch/cli.py``) parses the options and calls :func:`run_fit`; this
module reads the file, fits ``NestedMiniBatchKMeans`` with the options, shows a progress
line on stderr through the estimator's per-iteration ``callback``, and writes the
centroids ``(k, d)`` and the labels ``(n,)`` of every row (its exact nearest centroid).
It loads numpy and the engine only, never the service.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TextIO

import numpy as np

from nmbatch.engine.estimator import NestedMiniBatchKMeans
from nmbatch.engine.seeding.given import given_centroids
from nmbatch.engine.state import IterationStats, ModelState
from nmbatch.engine.sweep import UniformSample, sweep

__all__ = [
    "CSV_SUFFIXES",
    "FitError",
    "ProgressLine",
    "fit_init",
    "load_matrix",
    "run_fit",
    "run_sweep",
    "save_array",
]

CSV_SUFFIXES = (".csv", ".tsv", ".txt")


class FitError(Exception):
    """A user error of ``nmbatch fit`` (bad file, bad option value, data the estimator
    refuses): printed as one line, exit status 2."""


def load_matrix(path: Path, key: str | None = None) -> np.ndarray:
    """Read the samples of ``path`` as a 2-D array ``(n, d)`` (dtype as stored).

    ``.npy``: the array; ``.npz``: the array ``key`` (default ``train`` if present, else
    the first one); ``.csv``/``.tsv``/``.txt``: numbers separated by ``,``/tab/whitespace,
    a first line that is not numeric is taken for a header. More than 2 dimensions are
    flattened to ``(n, prod(rest))``. Raises ``FitError`` for anything else.
    """
    if not path.is_file():
        raise FitError(f"{path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            if key is not None:
                raise FitError("--key applies to .npz files only")
            A = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                names = list(archive.files)
                if not names:
                    raise FitError(f"{path}: the archive holds no array")
                if key is None:
                    key = "train" if "train" in names else names[0]
                if key not in names:
                    raise FitError(f"{path}: no array {key!r} (arrays: {', '.join(names)})")
                A = archive[key]
        elif suffix in CSV_SUFFIXES:
            if key is not None:
                raise FitError("--key applies to .npz files only")
            A = _load_text(path)
        else:
            raise FitError(f"{path}: unknown file type {suffix!r} (use .npy, .npz or .csv)")
    except (OSError, ValueError) as exc:
        raise FitError(f"{path}: cannot read: {exc}") from None
    if A.ndim < 2:
        raise FitError(f"{path}: expected a 2-D array (n_samples, n_features), got shape {A.shape}")
    if A.ndim > 2:
        A = A.reshape(A.shape[0], -1)
    return A


def _load_text(path: Path) -> np.ndarray:
    """Delimited numbers, one sample per line; a non-numeric first line is a header."""
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
    the output stays short whatever the number of iterations. An instance is the
    estimator's ``callback``: it never stops the fit.
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

    def __call__(self, stats: IterationStats, state: ModelState) -> None:
        """The estimator's per-iteration callback: show the step, remember convergence."""
        energy = state.energy if state.energy is not None else float("nan")
        self.update(stats.iteration, stats.batch_size, energy, stats.n_changed)
        self.converged = stats.converged

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


def fit_init(init: str | Path, k: int | None, d: int) -> tuple[str | np.ndarray, int]:
    """``--init`` and ``-k`` as the estimator's ``init`` and ``n_clusters``: a method
    (``-k`` required), or the centroids of a file (``(k, d)``, checked by
    :func:`~nmbatch.engine.seeding.given.given_centroids`; ``-k`` defaults to its rows and
    must match them). Raises ``FitError``."""
    if isinstance(init, str):
        if k is None:
            raise FitError("-k is required unless --init is a file of centroids")
        return init, k
    C = load_matrix(init)
    try:
        return given_centroids(C, k if k is not None else C.shape[0], d, "euclidean"), len(C)
    except ValueError as exc:
        raise FitError(f"{init}: {exc}") from None


def run_fit(args: argparse.Namespace, stderr: TextIO) -> int:
    """Cluster ``args.input`` with ``NestedMiniBatchKMeans``; write centroids and labels.

    ``args`` holds the options of ``nmbatch fit`` (``input``, ``k``, ``centroids``,
    ``labels``, ``key``, ``algorithm``, ``rho``, ``batch_size``, ``init`` (a method, or
    a file of centroids: :func:`fit_init`), ``max_iter``, ``seed``, ``quiet``).
    ``--seed S`` gives exactly ``NestedMiniBatchKMeans(random_state=S).fit(X)``. Returns
    the exit status (0); raises ``FitError`` for a user error.
    """
    X = load_matrix(args.input, args.key)
    n, d = X.shape
    init, k = fit_init(args.init, args.k, d)
    progress = ProgressLine(stderr, n, enabled=not args.quiet)
    km = NestedMiniBatchKMeans(
        n_clusters=k,
        rho=args.rho,
        batch_size=args.batch_size,
        init=init,
        max_iter=args.max_iter,
        random_state=args.seed,
        algorithm=args.algorithm,
        callback=progress,
    )
    started = time.perf_counter()
    try:
        km.fit(X)
    except ValueError as exc:  # bad values (NaN, inf), fewer samples than clusters, ...
        raise FitError(f"{args.input}: {exc}") from None
    seconds = time.perf_counter() - started

    save_array(args.centroids, km.cluster_centers_)
    if args.labels is not None:
        save_array(args.labels, km.labels_)
    state = "converged" if progress.converged else f"stopped at --max-iter {args.max_iter}"
    progress.close(
        f"{args.algorithm}: {state} after {km.n_iter_} iterations in {seconds:.2f} s; "
        f"k={k}, n={n}, d={d}, batch {km.batch_size_}/{n}, "
        f"energy (mean squared distance) {km.inertia_ / n:.6g}"
    )
    return 0


def run_sweep(args: argparse.Namespace, stdout: TextIO) -> int:
    """``nmbatch sweep``: :func:`~nmbatch.engine.sweep.sweep` of ``args.ks`` on the rows
    of ``args.input`` (a uniform sample of ``args.max_rows`` of them if set); a table on
    ``stdout``, and the result as JSON in ``args.json`` if set. Returns 0; raises
    ``FitError`` for a user error."""
    X = load_matrix(args.input, args.key)
    if args.max_rows is not None and X.shape[0] > args.max_rows:
        sample = UniformSample(args.max_rows, rng=args.seed)
        sample.offer(np.asarray(X, dtype=np.float32))
        X = sample.rows()
    try:
        result = sweep(X, args.ks, random_state=args.seed, metric=args.metric,
                       n_threads=args.threads, batch_size=args.batch_size)  # fmt: skip
    except ValueError as exc:
        raise FitError(f"{args.input}: {exc}") from None
    stdout.write(f"{'k':>7}  {'held-out energy':>16}  {'train energy':>14}  "
                 f"{'silhouette':>10}  {'iterations':>10}  {'seconds':>8}\n")  # fmt: skip
    for p in result.points:
        mark = "  <- recommended" if p.k == result.recommended_k else ""
        sil = f"{p.silhouette:10.4f}" if p.silhouette is not None else f"{'-':>10}"
        stdout.write(f"{p.k:>7}  {p.heldout_energy:16.6g}  {p.train_energy:14.6g}  {sil}  "
                     f"{p.n_iter:>10}  {p.seconds:8.2f}{mark}\n")  # fmt: skip
    stdout.write(
        f"recommended k = {result.recommended_k}; {result.n_train} rows fitted, "
        f"{result.n_heldout} held out, silhouette on {result.n_silhouette}; "
        f"{result.seconds:.2f} s\nrule: {result.rule}\n"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    return 0
