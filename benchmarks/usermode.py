"""``python -m benchmarks --mode user``: the benchmark as users run it (the headline tables).

Every method runs with its own defaults and its own initialisation inside the clock, on
the same training rows (in their given order); the clock starts when the user's ``fit``
(or ``train``) is called. How each method's curve of validation energy against time is
sampled: :mod:`benchmarks.user_peers`. The validation energy ``E_V`` (mean squared
distance of held-out rows to their nearest centroid) is computed off the clock. ``E*`` is
the lowest ``E_V`` any method reached in the whole run (every seed, every thread count:
in this mode the starts differ, so there is no per-seed pairing). The table gives, per
method and thread count, the median over seeds of the seconds to reach ``(1 + eps) E*``
for eps = 5%, 2%, 1%, 0.5% ("never" when the median run does not), and the final
``E_V / E* - 1``.

Every method first runs once untimed on the first ``max(5000, 4 k)`` rows (at most 3
iterations or ``--warmup`` seconds: numba's compilation, BLAS and allocator warm-up), then
the seeds
run, the order of the methods rotated from seed to seed. Writes results.json, curves.json,
results.md and curves-threads-N.png into ``--out``. The shared-start protocol of the paper
is the other mode (``--mode shared``, :mod:`benchmarks.paper`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import datasets
from benchmarks.options import load_dataset, log
from benchmarks.process import CHECKOUT, limit_threads
from benchmarks.protocol import EPS_KEYS, Budget, Curve, record, summarize
from benchmarks.user_peers import USER_METHODS, UserProblem, available, make_user_runner

__all__ = ["build_parser", "load_user_dataset", "main", "write_markdown"]

SETTLE_SECONDS = 0.2
LABELS = {
    "nmbatch": "nmbatch (defaults)",
    "faiss": "faiss (defaults: 256·k rows, 25 it.)",
    "faiss.allrows": "faiss (all rows)",
    "sklearnex": "sklearnex KMeans",
    "superkmeans": "SuperKMeans (defaults)",
    "superkmeans.full": "SuperKMeans (f32, all rows, no early stop)",
    "sklearn": "scikit-learn KMeans",
}


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m benchmarks --mode user``."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks --mode user",
        description="Time-to-energy benchmark as users run it: every method with its own "
        "defaults and initialisation inside the clock (benchmarks.usermode).")
    p.add_argument("--dataset", default="blobs",
                   choices=("mnist", "patches", "infmnist", "minilm384", "npz", "blobs"))
    p.add_argument("--data", type=Path, help="an .npz with keys train and test (npz), or "
                   "MNIST in that layout (mnist, infmnist)")
    p.add_argument("--infmnist-n", type=int, default=400_000)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where generated data and the sentence embeddings are cached "
                   "(default: the checkout's data/ folder for the embeddings)")
    p.add_argument("--max-train", type=int)
    p.add_argument("--max-test", type=int)
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--seeds", type=int, default=None, help="default 3; quick 1")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--threads", default="1", help="thread counts, e.g. 1,2 (default 1)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds per method, seed and thread count (default 20; quick 1)")
    p.add_argument("--max-iter", type=int, default=None,
                   help="iteration cap per run (default 1000; quick 50)")
    p.add_argument("--warmup", type=float, default=None, help="default 0.5; quick 0.05")
    p.add_argument("--methods", default=None,
                   help="comma-separated subset of: " + ", ".join(USER_METHODS))
    p.add_argument("--note", default="", help="a line for results.md (e.g. the machine's load)")
    p.add_argument("--quick", action="store_true", help="small version for tests")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default bench-results/user-<dataset>-k<k>)")
    return p


def load_user_dataset(args: argparse.Namespace) -> datasets.Dataset:
    """The data set of ``args``: those of :func:`benchmarks.options.load_dataset`, and
    ``minilm384`` (:mod:`benchmarks.embeddings`)."""
    if args.dataset != "minilm384":
        return load_dataset(args)
    from benchmarks.embeddings import load_sentence_embeddings

    ds = load_sentence_embeddings(args.cache_dir or CHECKOUT / "data")
    if args.max_train or args.max_test or args.quick:
        ds = datasets.subsample(ds, args.max_train or (5_000 if args.quick else
                                                       ds.train.shape[0]),
                                args.max_test or (1_000 if args.quick else ds.test.shape[0]),
                                args.data_seed)
    return ds


def _set_threads(threads: int) -> None:
    limit_threads(threads)
    try:
        import daal4py  # sklearnex's oneDAL: its own thread count (TBB)
    except ImportError:
        return
    daal4py.daalinit(threads)


def _fmt(x: float | None) -> str:
    if x is None:
        return "never"
    return f"{x:.3g}" if x < 10 else f"{x:.0f}"


def write_markdown(path: Path, results: dict[str, Any]) -> None:
    """results.md: the table (one row per method and thread count) and how it was run."""
    lines = [
        f"# User mode: {results['dataset']['description']}",
        "",
        f"k = {results['k']}; n = {results['dataset']['n_train']} training rows, "
        f"{results['dataset']['n_test']} held out, d = {results['dataset']['dim']}; "
        f"{len(results['seeds'])} seed(s); budget {results['budget']:g} s per run. "
        "Every method with its own defaults and its own initialisation, inside the clock "
        "(`benchmarks/user_peers.py` says how each curve is sampled).",
        "",
        f"Seconds to 5% / 2% / 1% / 0.5% above E* = {results['estar']:.6g} (the best "
        "validation energy any method reached in this run), median over seeds; final: "
        "E_V / E* - 1 at the end of the median run.",
        "",
        "| method | threads | 5% | 2% | 1% | 0.5% | final |",
        "|---|---|---|---|---|---|---|",
    ]
    for threads, per in results["summary"].items():
        for name, row in per.items():
            t = row["time_to"]
            lines.append(
                f"| {LABELS.get(name, name)} | {threads} | "
                + " | ".join(_fmt(t[key]) for key in EPS_KEYS)
                + f" | {100 * row['final_rel']:+.2f}% |")
    load = results["load_average"]
    lines += [
        "",
        f"Command: `{results['command']}`",
        "",
        f"Load average (1 min) at the start {load['start']:.2f}, at the end "
        f"{load['end']:.2f}, on {os.cpu_count()} cores."
        + (f" {results['note']}" if results["note"] else ""),
        "",
    ]
    skipped = results.get("skipped") or {}
    if skipped:
        lines += ["Not run (package missing): " + ", ".join(sorted(skipped)) + ".", ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    """Run the user-mode benchmark with the options ``argv``; exit status."""
    args = build_parser().parse_args(argv)
    quick = args.quick
    args.seeds = args.seeds or (1 if quick else 3)
    args.budget = args.budget if args.budget is not None else (1.0 if quick else 20.0)
    args.max_iter = args.max_iter or (50 if quick else 1000)
    args.warmup = args.warmup if args.warmup is not None else (0.05 if quick else 0.5)
    names = list(USER_METHODS) if args.methods is None else [
        n.strip() for n in args.methods.split(",") if n.strip()]
    unknown = sorted(set(names) - set(USER_METHODS))
    if unknown:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {USER_METHODS}")
    skipped = {n: "package missing" for n in names if not available(n)}
    names = [n for n in names if n not in skipped]
    thread_counts = [int(t) for t in str(args.threads).split(",") if t.strip()]
    command = "python -m benchmarks --mode user " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    load_start = os.getloadavg()[0]
    ds = load_user_dataset(args)
    log(f"data: {ds.description}")
    X = np.ascontiguousarray(ds.train, dtype=np.float32)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    budget = Budget(args.budget, args.max_iter)
    curves: dict[int, dict[int, dict[str, Curve]]] = {}
    for threads in thread_counts:
        _set_threads(threads)
        for name in names:  # untimed warm-up on a part of the data, every method alike
            warm = UserProblem(X[: max(5000, 4 * args.k)], args.k, seeds[0], threads)
            record(name, make_user_runner(name)(warm, Budget(args.warmup, 3)), ds.test[:500],
                   seeds[0])
        curves[threads] = {}
        for si, seed in enumerate(seeds):
            order = names[si % len(names):] + names[: si % len(names)]
            curves[threads][seed] = {}
            for name in order:
                time.sleep(SETTLE_SECONDS)
                problem = UserProblem(X, args.k, seed, threads)
                c = record(name, make_user_runner(name)(problem, budget), ds.test, seed)
                curves[threads][seed][name] = c
                log(f"threads {threads} seed {seed} {name:18s} {c.n_steps:5d} points "
                    f"{c.total_seconds:8.3f} s  E_V {c.final_energy:.6g} "
                    f"({c.notes.get('stop')})")
    estar = min(min(c.energy) for per in curves.values() for s in per.values()
                for c in s.values() if c.energy)
    summary = {
        str(t): summarize(curves[t], dict.fromkeys(seeds, estar), names)
        for t in thread_counts
    }
    out = args.out or Path("bench-results") / f"user-{ds.name}-k{args.k}"
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "mode": "user",
        "dataset": {"name": ds.name, "description": ds.description,
                    "n_train": int(ds.train.shape[0]), "n_test": int(ds.test.shape[0]),
                    "dim": ds.dim},
        "k": args.k, "seeds": seeds, "threads": thread_counts, "budget": args.budget,
        "max_iter": args.max_iter, "estar": estar, "summary": summary,
        "command": command, "note": args.note, "skipped": skipped,
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "curves.json").write_text(json.dumps({
        str(t): {str(s): {n: c.to_json() for n, c in per.items()}
                 for s, per in curves[t].items()} for t in thread_counts}))
    write_markdown(out / "results.md", results)
    from benchmarks.report import plot_curves

    for t in thread_counts:
        plot_curves(out / f"curves-threads-{t}.png", curves[t], dict.fromkeys(seeds, estar),
                    names, f"user mode: {ds.name}, n={ds.train.shape[0]}, d={ds.dim}, "
                    f"k={args.k}, {t} thread(s)")
    log(f"wrote {out / 'results.json'}, results.md, curves.json, curves-threads-*.png")
    print((out / "results.md").read_text())
    return 0
