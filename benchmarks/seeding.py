"""``python -m benchmarks.seeding``: the seedings by time to energy, the seeding inside the clock.

For each ``k`` of ``--ks``, seed ``s`` of ``--seeds`` and method of ``--methods``
(:data:`nmbatch.engine.seeding.SEEDINGS`): shuffle the training set with
``default_rng(s)`` (:func:`benchmarks.protocol.shuffled_problem`), time the seeding
alone on the rows nmbatch seeds from (its first batch, ``b_0 = max(batch_size, 20 k)``
rows: :func:`nmbatch.engine.algorithms.growth.first_batch_size`), then fit
``NestedMiniBatchKMeans(init=<those centroids>, random_state=s)`` with a callback that
records the fit's own time (its time inside the callback excluded) and the held-out
energy ``E_V`` (:func:`benchmarks.protocol.record`'s grid: after each of the first 20
iterations, then whenever the time grew by ``--eval-grid``). A curve's times are the
seeding's seconds plus the fit's. ``E*`` is the lowest ``E_V`` of any method for that
data set, ``k`` and seed; the report gives, per method (median over seeds), the seeding's
seconds, the time to ``(1 + eps) E*`` for eps 5/2/1/0.5% *including* the seeding, the
seeding's share of the time to 1%, and the final ``E_V / E* - 1``.

Besides the engine's methods, ``--methods`` takes variants of k-means++ named
``kpp.<rows>.t<trials>``: ``<rows>`` is ``full`` (the whole first batch) or ``sub<R>``
(``R k`` uniform rows of it), ``t<trials>`` the trials per centroid (left out: greedy's
``2 + floor(ln k)``); for example ``kpp.sub4.t1`` is plain k-means++ on ``4 k`` rows,
the rule ``"auto"`` takes at large ``k`` (:func:`variant_rows`).

Writes ``OUT/<dataset>-k<k>.json`` per run, then rebuilds ``OUT/seeding.json``,
``OUT/seeding.md`` and ``OUT/seeding.png`` from every such file in ``OUT`` (runs of
several data sets into one folder add up). Kernels on ``--threads`` (default 1), BLAS
on one, as the estimator iterates. Compilation is done before any timing (a warm-up
of every method on a small slice).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import options
from benchmarks.protocol import (
    EPS_KEYS,
    EPSILONS,
    Curve,
    median_or_none,
    shuffled_problem,
    time_to,
)

__all__ = ["METHODS", "build_parser", "main", "run_one", "summarize_folder", "variant_rows"]

METHODS = ("auto", "k-means++", "k-means++.sub", "k-means||", "afk-mc2", "random")
_RUN_FILE = re.compile(r"^(?P<dataset>.+)-k(?P<k>\d+)\.json$")
_VARIANT = re.compile(r"^kpp\.(?:full|sub(?P<per>\d+))(?:\.t(?P<trials>\d+))?$")


def variant_rows(method: str, X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Rows ``(k,)`` int64 of ``X`` ``(n, d)`` float32 that the variant ``method``
    (``kpp.full``, ``kpp.sub<R>``, either with ``.t<trials>``) picks."""
    from nmbatch.engine.seeding import kmeans_plusplus, kmeans_plusplus_subsample

    match = _VARIANT.match(method)
    if match is None:
        raise ValueError(f"not a k-means++ variant: {method!r}")
    trials = None if match["trials"] is None else int(match["trials"])
    if match["per"] is None:
        return kmeans_plusplus(X, k, rng, trials=trials)
    return kmeans_plusplus_subsample(X, k, rng, int(match["per"]), trials=trials)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.seeding", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=("npz", "mnist", "patches", "blobs", "minilm384"),
                   default=None)
    p.add_argument("--data", type=Path, default=None, help="an .npz with train and test")
    p.add_argument("--max-train", type=int, default=None)
    p.add_argument("--max-test", type=int, default=None)
    p.add_argument("--ks", default="50,256,1024,4096")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=5000)
    p.add_argument("--budget", type=float, default=60.0,
                   help="seconds of a fit (after the seeding) before it is stopped")
    p.add_argument("--max-iter", type=int, default=300)
    p.add_argument("--eval-grid", type=float, default=0.01)
    p.add_argument("--out", type=Path, default=Path("bench-results") / "seeding")
    p.add_argument("--summarize-only", action="store_true")
    return p


def _load(args: argparse.Namespace) -> Any:
    if args.dataset == "minilm384":  # the sentence embeddings of the user-mode benchmark
        from benchmarks.embeddings import load_sentence_embeddings
        from benchmarks.usermode import CHECKOUT

        return load_sentence_embeddings(CHECKOUT / "data")
    argv: list[str] = []
    if args.dataset:
        argv += ["--dataset", args.dataset]
    if args.data:
        argv += ["--data", str(args.data)]
    if args.max_train:
        argv += ["--max-train", str(args.max_train)]
    if args.max_test:
        argv += ["--max-test", str(args.max_test)]
    return options.load_dataset(options.build_parser().parse_args(argv))


def run_one(
    train: np.ndarray, test: np.ndarray, k: int, method: str, seed: int, *,
    batch_size: int = 5000, budget: float = 60.0, max_iter: int = 300,
    eval_grid: float = 0.01, threads: int = 1,
) -> tuple[float, Curve]:
    """Seed with ``method`` and fit; returns ``(seeding seconds, curve)`` whose times
    include the seeding. ``train`` (n, d), ``test`` (m, d): float32."""
    from nmbatch.engine import NestedMiniBatchKMeans, energy
    from nmbatch.engine.algorithms.growth import first_batch_size
    from nmbatch.engine.seeding import initial_centroids
    from nmbatch.engine.threads import kernel_threads

    problem = shuffled_problem(train, seed, k, batch_size=batch_size)
    X = problem.train
    b0 = first_batch_size(batch_size, k, X.shape[0])
    first = np.ascontiguousarray(X[:b0])
    with kernel_threads(threads):
        t0 = time.perf_counter()
        rng = np.random.default_rng(seed)
        if _VARIANT.match(method):
            C0 = np.array(first[variant_rows(method, first, k, rng)], order="C")
        else:
            C0 = initial_centroids(method, first, k, rng)
        seed_seconds = time.perf_counter() - t0
    curve = Curve(method, seed)
    clock = {"elapsed": seed_seconds, "resumed": 0.0, "last_eval": -math.inf}
    pending: list[Any] = []

    def watch(stats: Any, state: Any) -> bool:
        clock["elapsed"] += time.perf_counter() - clock["resumed"]
        t = clock["elapsed"]
        curve.n_steps += 1
        curve.converged = curve.converged or bool(state.converged)
        due = (stats.iteration <= 20 or state.converged
               or t - clock["last_eval"] >= eval_grid * t)
        if due:
            curve.seconds.append(t)
            curve.energy.append(energy(test, state.centroids))
            curve.iteration.append(int(stats.iteration))
            clock["last_eval"] = t
            pending.clear()
        else:
            pending[:] = [t, np.array(state.centroids), int(stats.iteration)]
        stop = t - seed_seconds >= budget
        clock["resumed"] = time.perf_counter()
        return stop

    est = NestedMiniBatchKMeans(n_clusters=k, init=C0, batch_size=batch_size,
                                random_state=seed, max_iter=max_iter, n_threads=threads,
                                callback=watch)
    clock["resumed"] = time.perf_counter()
    est.fit(X)
    if pending:
        curve.seconds.append(pending[0])
        curve.energy.append(energy(test, pending[1]))
        curve.iteration.append(pending[2])
    curve.notes = {"seed_seconds": seed_seconds, "first_batch": int(b0),
                   "n_iter": int(est.n_iter_), "final_batch": int(est.batch_size_)}
    return seed_seconds, curve


def _warm_up(train: np.ndarray, test: np.ndarray, methods: list[str], threads: int) -> None:
    """Compile every kernel the runs call (seedings and fit) on a small slice."""
    small = np.ascontiguousarray(train[:3000])
    for method in methods:
        run_one(small, test[:200], 16, method, 0, batch_size=300, budget=5.0, max_iter=6,
                threads=threads)


def _run_k(ds: Any, k: int, args: argparse.Namespace, methods: list[str]) -> dict[str, Any]:
    runs = []
    for s in range(args.first_seed, args.first_seed + args.seeds):
        curves = {}
        for method in methods:
            print(f"# {ds.name} k={k} seed={s} {method}", file=sys.stderr, flush=True)
            _, curve = run_one(ds.train, ds.test, k, method, s, batch_size=args.batch_size,
                               budget=args.budget, max_iter=args.max_iter,
                               eval_grid=args.eval_grid, threads=args.threads)
            curves[method] = curve.to_json()
        runs.append({"seed": s, "curves": curves})
    from benchmarks.machine import machine_info

    return {"dataset": ds.name, "k": k, "n_train": int(ds.train.shape[0]),
            "n_test": int(ds.test.shape[0]), "dim": int(ds.train.shape[1]),
            "threads": args.threads, "budget": args.budget, "batch_size": args.batch_size,
            "machine": machine_info(), "runs": runs}


def _summary(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method: medians over seeds of seeding seconds, times to each level, share."""
    per: dict[str, dict[str, list[float]]] = {}
    for run in doc["runs"]:
        curves = {m: Curve.from_json(c) for m, c in run["curves"].items()}
        estar = min(min(c.energy) for c in curves.values() if c.energy)
        for m, c in curves.items():
            row = per.setdefault(m, {"seed": [], "final": [], **{e: [] for e in EPS_KEYS}})
            row["seed"].append(c.notes["seed_seconds"])
            row["final"].append(c.final_energy / estar - 1.0)
            for key, eps in zip(EPS_KEYS, EPSILONS, strict=True):
                row[key].append(time_to(c, (1 + eps) * estar))
    out = {}
    for m, row in per.items():
        times = {key: median_or_none(row[key]) for key in EPS_KEYS}
        seed = float(np.median(row["seed"]))
        t1 = times["0.01"]
        out[m] = {"seed_seconds": seed, "time_to": times,
                  "seed_share_of_1pct": None if t1 is None else seed / t1,
                  "final_rel": float(np.median(row["final"]))}
    return out


def _cell(t: float | None) -> str:
    return "never" if t is None else f"{t:.3g}"


def summarize_folder(folder: Path, command: str | None = None) -> dict[str, Any]:
    """Rebuild ``seeding.json``, ``seeding.md``, ``seeding.png`` from the run files."""
    docs = []
    for f in sorted(folder.iterdir()) if folder.is_dir() else []:
        if _RUN_FILE.match(f.name):
            docs.append(json.loads(f.read_text()))
    docs.sort(key=lambda d: (d["dataset"], d["k"]))
    for d in docs:
        d["summary"] = _summary(d)
    out = {"runs": docs}
    (folder / "seeding.json").write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")
    L = ["# Seeding inside the clock\n"]
    if command:
        L.append(f"Last command: `{command}`\n")
    L.append("Per method (median over seeds): the seeding's seconds, the seconds to "
             "(1+eps) E* *including the seeding* (E*: the lowest held-out E_V of any "
             "method for that data set, k and seed), the seeding's share of the time to "
             "1%, and the final E_V/E* - 1.\n")
    for d in docs:
        m = d["machine"]
        L.append(f"## {d['dataset']}, k = {d['k']:,} (n = {d['n_train']:,}, d = {d['dim']}, "
                 f"seeds {len(d['runs'])}, threads {d['threads']}, budget {d['budget']} s; "
                 f"{m.get('cpu', m.get('cpu_model', '?'))})\n")
        if d.get("command"):
            L.append(f"Command: `{d['command']}`\n")
        L.append("| init | seeding | 5% | 2% | 1% | 0.5% | seeding / 1% | final |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, row in d["summary"].items():
            share = row["seed_share_of_1pct"]
            cells = " | ".join(_cell(row["time_to"][e]) for e in EPS_KEYS)
            label = name.replace("|", "\\|")
            L.append(f"| {label} | {row['seed_seconds']:.3g} | {cells} | "
                     f"{'-' if share is None else f'{100 * share:.0f}%'} | "
                     f"{100 * row['final_rel']:.2f}% |")
        L.append("")
    (folder / "seeding.md").write_text("\n".join(L))
    _plot(folder / "seeding.png", docs)
    return out


def _plot(path: Path, docs: list[dict[str, Any]]) -> None:
    """One panel per data set and k: E_V/E* - 1 against seconds (seeding included) of
    the first seed, one line per method; a marker where the seeding ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not docs:
        return
    cols = min(3, len(docs))
    rows = -(-len(docs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), dpi=100, squeeze=False)
    from nmbatch.engine.seeding import SEEDINGS

    ran = {m for d in docs for m in d["runs"][0]["curves"]}
    names = list(SEEDINGS) + sorted(ran - set(SEEDINGS))
    colors = {m: plt.get_cmap("tab20")(i % 20) for i, m in enumerate(names)}  # one per method
    for ax, d in zip(axes.flat, docs, strict=False):
        run = d["runs"][0]
        curves = {m: Curve.from_json(c) for m, c in run["curves"].items()}
        estar = min(min(c.energy) for c in curves.values() if c.energy)
        for m, c in curves.items():
            rel = np.maximum(np.asarray(c.energy) / estar - 1.0, 1e-5)
            color = colors.get(m, "black")
            ax.plot(c.seconds, rel, label=m, lw=1.2, color=color, marker=".", ms=3)
            ax.axvline(max(c.notes["seed_seconds"], 1e-4), color=color, ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(0.01, color="grey", lw=0.6)
        ax.set_title(f"{d['dataset']}, k = {d['k']} (seed {run['seed']})")
        ax.set_xlabel("seconds, seeding included (dotted: seeding ends)")
        ax.set_ylabel("E_V / E* - 1")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(docs):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    command = "python -m benchmarks.seeding " + shlex.join(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarize_only:
        from nmbatch.engine.seeding import SEEDINGS

        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        bad = [m for m in methods if m not in SEEDINGS and not _VARIANT.match(m)]
        if bad:
            raise SystemExit(f"unknown methods {bad}; known: {', '.join(SEEDINGS)} and "
                             "kpp.<full|subR>[.tT]")
        ks = [int(x) for x in args.ks.split(",") if x.strip()]
        ds = _load(args)
        _warm_up(ds.train, ds.test, methods, args.threads)
        for k in ks:
            doc = _run_k(ds, k, args, methods)
            doc["command"] = command
            (args.out / f"{ds.name}-k{k}.json").write_text(
                json.dumps(doc, indent=1, allow_nan=False) + "\n")
            summarize_folder(args.out, command)
    summarize_folder(args.out, command)
    print((args.out / "seeding.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
