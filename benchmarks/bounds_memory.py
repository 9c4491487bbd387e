"""Memory per sample and speed of nmbatch's bound modes (``full``, ``group``, ``hamerly``).

``python -m benchmarks.bounds_memory [--data FILE.npz] [--n N] [--ks 50,1024]
[--modes full,group,hamerly] [--steps S] [--budget SECONDS] [--json OUT]`` runs nmbatch
with each bound mode at each ``k`` on the same data, from the same initial centroids
(the first ``k`` rows of the shuffled store) and the same store seed, and reports:

- ``bounds``: lower bounds kept per sample (``k``, ``G`` or 1);
- ``bytes_per_sample``: the algorithm's per-sample state (labels, norms, distances,
  bounds; ``KMeansAlgorithm.bytes_per_sample``), and ``with_rows``: that plus the row
  and its id in the store (``4 d + 8``);
- ``steps``, ``seconds`` (all steps), ``revisit_seconds`` (the steps after the first,
  where the bounds act), ``distances`` computed, ``energy`` (``sse / b``) and ``b``;
- ``same_centroids``: whether a mode that ran as many steps as ``full`` (the first
  mode) ended on the same centroids bit for bit (every mode is exact, so it must);
  ``None`` (shown ``-``) when it ran fewer steps within the budget.

Each run stops after ``--steps`` steps, at convergence, or once ``--budget`` seconds
have passed. A run whose bounds would take more than ``--max-bound-bytes`` (at ``n``
samples) is reported as skipped. ``--data``: an ``.npz`` with ``train`` (e.g. MNIST,
:mod:`.mnist`); without it, Gaussian blobs of ``--dim`` features. ``n`` rows are drawn
from the data with ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nmbatch.engine.algorithms import make_algorithm
from nmbatch.engine.algorithms.bounds import resolve_bound_mode
from nmbatch.engine.store import NestedBatchStore

__all__ = ["DEFAULT_KS", "load_rows", "main", "measure", "render"]

DEFAULT_KS = (50, 1_024, 4_096, 16_384)
DEFAULT_MODES = ("full", "group", "hamerly")


def load_rows(data: str | None, n: int, *, dim: int = 64, seed: int = 0) -> np.ndarray:
    """``n`` rows, ``(n, d)`` float32: drawn without replacement from ``train`` of the
    ``.npz`` file ``data``, or Gaussian blobs (``dim`` features, ``max(n // 200, 2)``
    centres) when ``data`` is None."""
    rng = np.random.default_rng(seed)
    if data is not None:
        with np.load(Path(data)) as f:
            train = f["train"]
            m = min(n, train.shape[0])
            rows = np.sort(rng.choice(train.shape[0], size=m, replace=False))
            return np.ascontiguousarray(train[rows], dtype=np.float32)
    centres = 10.0 * rng.standard_normal((max(n // 200, 2), dim))
    X = centres[rng.integers(0, centres.shape[0], size=n)] + rng.standard_normal((n, dim))
    return X.astype(np.float32)


def _run(X: np.ndarray, k: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One nmbatch run with bound mode ``mode``; returns its row of the report."""
    store = NestedBatchStore(X.shape[1], seed=args.seed, capacity=X.shape[0])
    store.append(X)
    sized = {} if args.batch_size is None else {"batch_size": args.batch_size}
    algo = make_algorithm("nmbatch", store, k, init="first", rho=args.rho,
                          random_state=args.seed, bounds=mode, **sized)  # fmt: skip
    steps = 0
    seconds = revisit = 0.0
    distances = 0
    while steps < args.steps and seconds < args.budget:
        t0 = time.perf_counter()
        stats = algo.step()
        dt = time.perf_counter() - t0
        seconds += dt
        revisit += dt if steps > 0 else 0.0
        distances += stats.n_distances
        steps += 1
        if stats.converged:
            break
    per_sample = algo.bytes_per_sample()
    return {
        "k": k, "mode": mode, "resolved": algo.bound_mode, "bounds": int(algo._lower.shape[1]),
        "bytes_per_sample": per_sample, "with_rows": per_sample + 4 * X.shape[1] + 8,
        "steps": steps, "seconds": round(seconds, 4), "revisit_seconds": round(revisit, 4),
        "distances": int(distances), "energy": algo.energy_estimate(),
        "b": int(algo.batch_size), "converged": bool(algo.converged),
        "_centroids": algo.centroids.copy(),
    }  # fmt: skip


def measure(X: np.ndarray, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (k, mode) of ``args`` on the rows ``X``; the report's rows, in that order."""
    out: list[dict[str, Any]] = []
    for k in args.ks:
        if k > X.shape[0]:
            out.append({"k": k, "skipped": f"k > n = {X.shape[0]}"})
            continue
        runs = []
        for mode in args.modes:
            width = resolve_bound_mode(mode, k, X.shape[1])[1]
            need = 4 * width * X.shape[0]
            if need > args.max_bound_bytes:
                gib = f"bounds need {need / 2**30:.1f} GiB"
                out.append({"k": k, "mode": mode, "skipped": gib})
                continue
            runs.append(_run(X, k, mode, args))
        ref = runs[0]["_centroids"] if runs else None
        for row in runs:
            # Compared only after as many steps as the first mode's (None: not compared).
            same = row["steps"] == runs[0]["steps"]
            row["same_centroids"] = bool((row["_centroids"] == ref).all()) if same else None
        for row in runs:
            del row["_centroids"]
            out.append(row)
    return out


def render(rows: Sequence[dict[str, Any]], about: str) -> str:
    """The report as a Markdown table."""
    lines = [
        f"nmbatch bound modes on {about}",
        "",
        "| k | mode | bounds | bytes/sample | with rows | steps | s | s revisits | "
        "distances | energy | b | same C |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['k']} | {r.get('mode', '')} | skipped: {r['skipped']} |")
            continue
        mode = r["mode"] if r["mode"] == r["resolved"] else f"{r['mode']} ({r['resolved']})"
        lines.append(
            f"| {r['k']} | {mode} | {r['bounds']} | {r['bytes_per_sample']} | "
            f"{r['with_rows']} | {r['steps']} | {r['seconds']:.2f} | "
            f"{r['revisit_seconds']:.2f} | {r['distances']:.3g} | {r['energy']:.6g} | "
            f"{r['b']} | {'-' if r['same_centroids'] is None else r['same_centroids']} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ints = lambda s: tuple(int(v) for v in s.split(","))  # noqa: E731
    words = lambda s: tuple(s.split(","))  # noqa: E731
    p = argparse.ArgumentParser(prog="python -m benchmarks.bounds_memory")
    p.add_argument("--data", help=".npz with a 'train' array (default: Gaussian blobs)")
    p.add_argument("--n", type=int, default=20_000, help="rows used (default 20000)")
    p.add_argument("--dim", type=int, default=64, help="features of the blobs")
    p.add_argument("--ks", type=ints, default=DEFAULT_KS)
    p.add_argument("--modes", type=words, default=DEFAULT_MODES)
    p.add_argument("--steps", type=int, default=30, help="most steps per run")
    p.add_argument("--budget", type=float, default=60.0, help="seconds per run (between steps)")
    p.add_argument("--batch-size", type=int, help="b0 (default: make_algorithm's)")
    p.add_argument("--rho", type=float, default=100.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-bound-bytes", type=float, default=8 * 2**30)
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    X = load_rows(args.data, args.n, dim=args.dim, seed=args.seed)
    name = Path(args.data).name if args.data else "blobs"
    about = f"{name}, n = {X.shape[0]}, d = {X.shape[1]}"
    rows = measure(X, args)
    print(render(rows, about))
    if args.json is not None:
        args.json.write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
