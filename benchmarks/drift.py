"""Drift benchmark: streaming k-means that forgets, against the k-means of the current window.

``python -m benchmarks --drift [options]`` (or ``python -m
benchmarks.drift``) feeds four streams, chunk by chunk in stream order, to every
method of :mod:`benchmarks.drift_peers` and writes drift.json, drift.md and
drift.png into ``--out``:

- ``stationary``: a mixture of ``k`` isotropic Gaussians (std ``--std``, default 1, means
  uniform in ``[-10, 10]^d``, equal weights: well separated, so the k-means of a window
  is the mixture's partition and a gap to it is the method's, not a local minimum's),
  ``4 W`` samples;
- ``abrupt``: ``3 W`` samples of that mixture, then at once ``3 W`` of a second one (new
  means drawn alike): with ``W = 100,000`` the 300,000 + 300,000 of issue 12;
- ``gradual``: ``2 W`` samples of the first mixture, ``2 W`` while each mean moves on a
  straight line to its place in the second (linear in the sample index), ``2 W`` of the
  second;
- ``mnist``: MNIST's training set, digits 0-4 (shuffled), then 5-9 (shuffled), then all
  60,000 again shuffled, with its own window (``--mnist-window``) and chunk.

Every ``--every`` samples (default ``W/2``) and at the end, each method's current
centroids are scored by their energy (mean squared distance to the nearest centroid) on
held-out samples of the current distribution (fresh draws of the mixture at the newest
sample's time; for mnist, MNIST's test digits of the current phase) against a reference:
k-means fitted to the last ``W`` samples by scikit-learn's exact Lloyd
(``KMeans(algorithm="lloyd", tol=0)``: to a fixed point) from nmbatch.window's centroids
and from k-means++ (``--ref-inits`` seeds), the one with the lower energy on the window.
Reported: ``100 (E / E_ref - 1)`` per checkpoint and method, and each method's rate
(vectors/s over the wall time of its updates only; one thread, ``--threads``).

Target (issue 12): nmbatch.window within 1% of the reference at every checkpoint at
least a window after the last change ended (the start counts as a change), at >= 100,000
vectors/s.
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["STREAMS", "DriftStream", "gaussian_stream", "main", "mnist_stream", "run_stream"]

STREAMS = ("stationary", "abrupt", "gradual", "mnist")
TARGET_PCT = 1.0
TARGET_RATE = 100_000.0


@dataclass
class DriftStream:
    """A stream of ``n`` samples of dimension ``dim`` and how to score it.

    rows(start, stop) -> (stop - start, dim) float32: the samples ``[start, stop)``
    heldout(t)        -> (n_test, dim) float32: held-out samples of the distribution of
                         sample ``t - 1`` (the newest after ``t`` samples)
    changes           : ((start, end), ...) sample positions where each change of the
                        distribution starts and ends (``start == end``: abrupt)
    """

    name: str
    description: str
    n: int
    dim: int
    k: int
    window: int
    chunk: int
    every: int
    rows: Callable[[int, int], np.ndarray]
    heldout: Callable[[int], np.ndarray]
    changes: tuple[tuple[int, int], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def target_applies(self, t: int) -> bool:
        """True when no change is under way at ``t`` and the last one ended (or the stream
        began) at least a window before ``t``."""
        if any(s < t < e for s, e in self.changes):
            return False
        last = max([0, *(e for _, e in self.changes if e <= t)])
        return t - last >= self.window


def gaussian_stream(
    kind: str,
    *,
    k: int,
    dim: int,
    window: int,
    chunk: int,
    every: int,
    n_test: int,
    seed: int,
    std: float = 1.0,
    box: float = 10.0,
) -> DriftStream:
    """The ``stationary``, ``abrupt`` or ``gradual`` mixture stream (module docstring).

    The means are ``A`` (k, dim) before and ``B`` after the change; sample ``t`` has mean
    ``A + f(t) (B - A)`` of its component, ``f`` = 0 (stationary), ``[t >= 3W]``
    (abrupt), or ``clip((t - 2W) / 2W, 0, 1)`` (gradual). Chunk rows and held-out sets are
    drawn from generators seeded by ``(seed, start)`` and ``(seed, t)``: reproducible.
    """
    rng = np.random.default_rng([seed, 0])
    A, B = rng.uniform(-box, box, (2, k, dim))
    if kind == "stationary":
        n, changes = 4 * window, ()

        def frac(t: np.ndarray) -> np.ndarray:
            return np.zeros(t.shape)
    elif kind == "abrupt":
        n, changes = 6 * window, ((3 * window, 3 * window),)

        def frac(t: np.ndarray) -> np.ndarray:
            return (t >= 3 * window).astype(np.float64)
    elif kind == "gradual":
        n, changes = 6 * window, ((2 * window, 4 * window),)

        def frac(t: np.ndarray) -> np.ndarray:
            return np.clip((t - 2 * window) / (2 * window), 0.0, 1.0)
    else:
        raise ValueError(f"unknown mixture stream {kind!r}")

    def draw(g: np.random.Generator, t: np.ndarray) -> np.ndarray:
        comp = g.integers(0, k, t.shape[0])
        means = A[comp] + frac(t)[:, None] * (B - A)[comp]
        return (means + std * g.standard_normal((t.shape[0], dim))).astype(np.float32)

    def rows(start: int, stop: int) -> np.ndarray:
        return draw(np.random.default_rng([seed, 1, start]), np.arange(start, stop))

    def heldout(t: int) -> np.ndarray:
        return draw(np.random.default_rng([seed, 2, t]), np.full(n_test, max(t - 1, 0)))

    return DriftStream(
        kind,
        f"{k} Gaussians (std {std:g}, means uniform in [-{box:g}, {box:g}]^{dim}), "
        f"n = {n}" + "".join(f", change over [{s}, {e}]" for s, e in changes),
        n,
        dim,
        k,
        window,
        chunk,
        every,
        rows,
        heldout,
        changes,
        {"means_before": A, "means_after": B, "fraction": frac},
    )


def mnist_stream(
    path: Path,
    *,
    k: int,
    window: int,
    chunk: int,
    every: int,
    seed: int,
    per_phase: int | None = None,
) -> DriftStream:
    """MNIST train in a drifting order: 0-4 shuffled, 5-9 shuffled, then all shuffled.

    ``path``: an ``.npz`` with ``train`` (n, 784), ``train_labels`` (n,), ``test``,
    ``test_labels`` (the layout of :mod:`benchmarks.mnist`). ``per_phase`` keeps
    only that many samples of each phase (quick runs). The held-out set is every test
    digit of the phase of the newest sample. ``extra["order"]`` (n,) int64 are the train
    rows in stream order, ``extra["phase_ends"]`` the positions where phases end.
    """
    with np.load(path) as f:
        missing = {"train", "train_labels", "test", "test_labels"} - set(f.files)
        if missing:
            raise ValueError(f"{path.name} lacks key(s) {sorted(missing)}")
        train, ytr = np.asarray(f["train"]), np.asarray(f["train_labels"]).ravel()
        test, yte = np.asarray(f["test"]), np.asarray(f["test_labels"]).ravel()
    rng = np.random.default_rng([seed, 3])
    phases = [np.flatnonzero(ytr <= 4), np.flatnonzero(ytr >= 5), np.arange(ytr.shape[0])]
    phases = [rng.permutation(p)[:per_phase] for p in phases]
    order = np.concatenate(phases).astype(np.int64)
    ends = np.cumsum([p.shape[0] for p in phases])
    digits = [yte <= 4, yte >= 5, np.ones(yte.shape[0], dtype=bool)]
    held = [np.ascontiguousarray(test[m], dtype=np.float32) for m in digits]

    def rows(start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(train[order[start:stop]], dtype=np.float32)

    def heldout(t: int) -> np.ndarray:
        return held[int(np.searchsorted(ends, max(t - 1, 0), side="right"))]

    n = int(ends[-1])
    return DriftStream(
        "mnist",
        f"MNIST train ({path.name}): digits 0-4 ({ends[0]}), then 5-9 "
        f"({ends[1] - ends[0]}), then all ({n - ends[1]}), each shuffled; held out: the "
        "test digits of the current phase",
        n,
        int(train.shape[1]),
        k,
        window,
        chunk,
        every,
        rows,
        heldout,
        ((int(ends[0]),) * 2, (int(ends[1]),) * 2),
        {"order": order, "phase_ends": ends, "labels": ytr[order]},
    )


def run_stream(
    stream: DriftStream,
    names: list[str],
    *,
    seed: int,
    rate: float,
    ref_inits: int,
    river_sample: int,
    threads: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Feed ``stream`` to each method of ``names`` (in a rotating order, one chunk at a
    time), score them at the checkpoints; returns a JSON-able dict of it all."""
    from benchmarks.drift_peers import make_method, river_check, warm_up
    from benchmarks.drift_report import score

    warm = warm_up(stream.rows(0, min(stream.n, 3000)), stream.k, names, rate, seed, threads)
    methods = {
        n: make_method(
            n, k=stream.k, window=stream.window, chunk=stream.chunk, rate=rate, seed=seed
        )
        for n in names
    }
    seconds = dict.fromkeys(names, 0.0)
    recent: collections.deque[np.ndarray] = collections.deque()
    held = 0
    checkpoints: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    scoring = 0.0
    for ci, start in enumerate(range(0, stream.n, stream.chunk)):
        stop = min(start + stream.chunk, stream.n)
        X = stream.rows(start, stop)
        order = names[ci % len(names) :] + names[: ci % len(names)]
        for name in order:
            t0 = time.perf_counter()
            methods[name].update(X, start / rate)
            seconds[name] += time.perf_counter() - t0
        recent.append(X)
        held += X.shape[0]
        while held - recent[0].shape[0] >= stream.window:
            held -= recent.popleft().shape[0]
        if stop % stream.every == 0 or stop == stream.n:
            t0 = time.perf_counter()
            window = np.concatenate(list(recent))[-stream.window :]
            row = {"position": stop, "target_applies": stream.target_applies(stop)}
            row |= score(window, stream.heldout(stop), methods, stream.k, seed + stop, ref_inits)
            checkpoints.append(row)
            scoring += time.perf_counter() - t0
            log(
                f"{stream.name} {stop:>9d} ref[{row['reference']['source']}] "
                + "  ".join(f"{n} {row['above_pct'][n]:+.2f}%" for n in names)
            )
    out: dict[str, Any] = {
        "name": stream.name,
        "description": stream.description,
        "n": stream.n,
        "dim": stream.dim,
        "k": stream.k,
        "window": stream.window,
        "chunk": stream.chunk,
        "every": stream.every,
        "changes": [list(c) for c in stream.changes],
        "warmup_seconds": warm,
        "scoring_seconds": scoring,
        "stream_seconds": time.perf_counter() - t_start,
        "update_seconds": seconds,
        "vectors_per_s": {n: stream.n / max(seconds[n], 1e-12) for n in names},
        "checkpoints": checkpoints,
    }
    if "river.kmeans" in names and river_sample > 0:
        m = min(river_sample, stream.n)
        first = np.concatenate(
            [stream.rows(s, min(s + stream.chunk, m)) for s in range(0, m, stream.chunk)]
        )
        out["river_check"] = river_check(first, stream.chunk, stream.k, stream.window, seed)
    return out


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.drift_peers import METHODS

    p = argparse.ArgumentParser(
        prog="python -m benchmarks --drift", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--streams",
        default=",".join(STREAMS),
        help="comma-separated subset of " + ", ".join(STREAMS),
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="comma-separated subset of " + ", ".join(METHODS),
    )
    p.add_argument("--k", type=int, default=16)
    p.add_argument(
        "--std", type=float, default=1.0, help="std of the Gaussians (means in [-10, 10]^d)"
    )
    p.add_argument("--dim", type=int, default=32, help="d of the Gaussian streams")
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="W of the Gaussian streams (default 100000; quick 4000)",
    )
    p.add_argument("--chunk", type=int, default=None, help="default 5000; quick 500")
    p.add_argument("--every", type=int, default=None, help="checkpoint interval (default W/2)")
    p.add_argument(
        "--n-test",
        type=int,
        default=None,
        help="held-out samples per checkpoint of the Gaussian streams (default 20000; quick 2000)",
    )
    p.add_argument("--mnist-window", type=int, default=None, help="default 10000; quick 1000")
    p.add_argument("--mnist-chunk", type=int, default=None, help="default 1000; quick 250")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="MNIST .npz (train, train_labels, "
        "test, test_labels); default: the data folder's mnist.npz, downloaded "
        "once (benchmarks.mnist)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=100_000.0,
        help="stream clock: vectors/s "
        "(chunk time = first sample index / rate; max_age_seconds = W / rate)",
    )
    p.add_argument("--ref-inits", type=int, default=3, help="k-means++ seeds of the reference")
    p.add_argument(
        "--river-sample",
        type=int,
        default=None,
        help="samples river itself learns for its rate (default 20000, mnist 2000; quick 500)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="small sizes for CI (seconds)")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "drift")
    return p


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _streams(args: argparse.Namespace, names: list[str]) -> tuple[list[DriftStream], list[str]]:
    quick = args.quick
    W = args.window or (4000 if quick else 100_000)
    chunk = args.chunk or (500 if quick else 5000)
    n_test = args.n_test or (2000 if quick else 20_000)
    out, notes = [], []
    for name in names:
        if name != "mnist":
            out.append(
                gaussian_stream(
                    name,
                    k=args.k,
                    dim=args.dim,
                    window=W,
                    chunk=chunk,
                    every=args.every or W // 2,
                    n_test=n_test,
                    seed=args.seed,
                    std=args.std,
                )
            )
            continue
        from benchmarks import mnist

        try:
            path = args.data or mnist.fetch_mnist(log=_log)
        except mnist.MnistDownloadError as exc:
            notes.append(f"mnist stream skipped: {exc} (pass --data FILE.npz)")
            continue
        mw = args.mnist_window or (1000 if quick else 10_000)
        out.append(
            mnist_stream(
                Path(path),
                k=args.k,
                window=mw,
                chunk=args.mnist_chunk or (250 if quick else 1000),
                every=mw // 2,
                seed=args.seed,
                per_phase=1500 if quick else None,
            )
        )
    return out, notes


def main(argv: list[str] | None = None) -> int:
    from benchmarks import drift_report, machine
    from benchmarks.drift_peers import METHODS
    from benchmarks.process import keep_freed_memory, limit_threads

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args([a for a in argv if a != "--drift"])
    names = [s for s in args.streams.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(names) - set(STREAMS)) + sorted(set(methods) - set(METHODS))
    if bad:
        raise SystemExit(f"unknown stream(s)/method(s) {bad}")
    command = "python -m benchmarks " + shlex.join(
        argv if "--drift" in argv else ["--drift", *argv]
    )
    keep_freed_memory()
    limit_threads(args.threads)
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    streams, notes = _streams(args, names)
    results = []
    for stream in streams:
        _log(
            f"stream {stream.name}: {stream.description}; W = {stream.window}, "
            f"chunk = {stream.chunk}"
        )
        sample = (
            args.river_sample
            if args.river_sample is not None
            else (500 if args.quick else 2000 if stream.name == "mnist" else 20_000)
        )
        results.append(
            run_stream(
                stream,
                methods,
                seed=args.seed,
                rate=args.rate,
                ref_inits=args.ref_inits,
                river_sample=sample,
                threads=args.threads,
                log=_log,
            )
        )
    run = {
        "command": command,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine.machine_info(),
        "notes": notes,
        "streams": results,
        "target": {"above_pct": TARGET_PCT, "vectors_per_s": TARGET_RATE},
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "wall_seconds": time.perf_counter() - t0,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    drift_report.write_all(args.out, run)
    _log(f"wrote {args.out / 'drift.json'}, drift.md, drift.png")
    print((args.out / "drift.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
