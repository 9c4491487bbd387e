"""What a user's ``fit`` spends before its first step (issue 33), phase by phase.

Times ``NestedMiniBatchKMeans(n_clusters=k, random_state=seed, n_threads=T).fit(X)`` from
the call to the end of its first iteration (the ``callback``), and on to the end of step
``--steps``, where the callback stops the fit; the phases inside are timed by wrapping
the functions that do them (the wrappers are installed by this tool only):

* ``validation``: ``_check_X`` (conversion to C-contiguous float32 and the finiteness test);
* ``store``: the store's construction and loading (``NestedBatchStore.__init__``,
  ``append``, ``load`` and ``_fill`` where the store has them): copy and shuffle, before
  the first step and inside it;
* ``seeding``: the algorithm's ``_initialise`` (k-means++ or the first ``k`` rows);
* ``step``: the rest of the first step (the first batch's assignment and update).

``store_fit``: the store's seconds over the whole ``fit`` call (with a lazy load, the
rows copied as the batch grows and the rest copied at the end).

Datasets: ``mnist`` (the 60,000 x 784 training digits of ``--data``, as float32 in 0..255)
and ``unit384`` (74,000 x 384 float32 unit vectors: MNIST's 70,000 train and test digits,
cycled to 74,000 rows, through a seeded Gaussian projection to 384 dimensions, with a
little noise (sd 0.01 of the rows' scale) so no two rows are equal, each row normalised
to norm 1: a stand-in for sentence embeddings)::

    python -m benchmarks.first_step --data data/mnist.npz --k 50 --k 1024 \\
        --label new --out docs/bench/first-step

Appends one JSON line per fit to ``OUT/runs.jsonl`` and rewrites ``OUT/first-step.md`` (the
median of each phase per label, dataset and k, over every line of the file) and
``OUT/first-step.png``. Run it from two environments (before and after a change), in
alternation, with the same ``--out``, to compare them in one table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PHASES", "first_step_run", "main", "summarise", "unit384"]

PHASES = ("validation", "store", "seeding", "step")


def unit384(mnist: dict[str, np.ndarray], n: int = 74_000, dim: int = 384) -> np.ndarray:
    """``(n, dim)`` float32 unit rows from MNIST's train and test digits (module docstring)."""
    X = np.concatenate([mnist["train"], mnist["test"]]).astype(np.float32)
    rows = np.arange(n) % X.shape[0]
    rng = np.random.default_rng(384)
    P = rng.standard_normal((X.shape[1], dim)).astype(np.float32) / np.sqrt(dim)
    Y = X[rows] @ P
    Y += 0.01 * float(np.abs(Y).mean()) * rng.standard_normal(Y.shape).astype(np.float32)
    Y /= np.linalg.norm(Y, axis=1, keepdims=True)
    return np.ascontiguousarray(Y, dtype=np.float32)


class _Clock:
    """Seconds spent in wrapped functions, by phase; nested wrapped calls count once."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._depth = 0

    def wrap(self, owner: Any, name: str, phase: str) -> Callable[[], None]:
        """Time ``owner.name`` under ``phase``; returns the function that unwraps it."""
        if name not in vars(owner):
            return lambda: None
        original = vars(owner)[name]
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if clock._depth:
                return original(*args, **kwargs)
            clock._depth += 1
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                clock.seconds[phase] += time.perf_counter() - t0
                clock._depth -= 1

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)


def first_step_run(X: np.ndarray, k: int, *, seed: int = 0, steps: int = 5,
                   n_threads: int = 1, batch_size: int = 5000) -> dict:
    """One ``fit`` of ``X`` stopped after ``steps`` iterations: seconds per phase before
    the end of the first step, seconds to the end of steps 1 and ``steps``, and the
    fit's wall time (which also finishes the store and labels all of ``X``)."""
    from nmbatch.engine import NestedMiniBatchKMeans
    from nmbatch.engine._estimator_use import ModelUseMixin
    from nmbatch.engine.algorithms import base
    from nmbatch.engine.store import NestedBatchStore

    clock = _Clock()
    undo = [clock.wrap(ModelUseMixin, "_check_X", "validation")]
    for name in ("__init__", "append", "load", "_fill"):
        undo.append(clock.wrap(NestedBatchStore, name, "store"))
    undo.append(clock.wrap(base.KMeansAlgorithm, "_initialise", "seeding"))
    ends: list[float] = []
    at_first: dict[str, float] = {}

    def callback(stats: Any, state: Any) -> bool:
        ends.append(time.perf_counter())
        if len(ends) == 1:
            at_first.update(clock.seconds)
            at_first["b0"] = stats.batch_size
        return len(ends) >= steps

    est = NestedMiniBatchKMeans(n_clusters=k, random_state=seed, n_threads=n_threads,
                                batch_size=batch_size, callback=callback)  # fmt: skip
    try:
        t0 = time.perf_counter()
        est.fit(X)
        t_fit = time.perf_counter() - t0
    finally:
        for u in undo:
            u()
    first = ends[0] - t0
    phases = {p: at_first.get(p, 0.0) for p in PHASES[:-1]}
    phases["step"] = first - sum(phases.values())
    return {"k": k, "seed": seed, "n": int(X.shape[0]), "d": int(X.shape[1]),
            "threads": n_threads, "first_step": first, **phases,
            f"step{len(ends)}": ends[-1] - t0, "fit": t_fit,
            "store_fit": clock.seconds.get("store", 0.0),
            "b0": int(at_first["b0"])}  # fmt: skip


def summarise(records: list[dict]) -> tuple[list[str], dict]:
    """Medians of the records by (label, dataset, k): the markdown table's lines and the
    medians themselves (``{(label, dataset, k): {column: seconds}}``)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["label"], r["dataset"], r["k"])].append(r)
    columns = ("validation", "store", "seeding", "step", "first_step", "fit")
    lines = ["| label | data | k | runs | " + " | ".join(columns) + " | to step S "
             "| store in fit |", "|---|---|---:|---:|" + "---:|" * (len(columns) + 2)]
    medians: dict = {}
    for key in sorted(groups, key=lambda g: (g[1], g[2], g[0])):
        rs = groups[key]
        med = {c: float(np.median([r[c] for r in rs])) for c in columns}
        last = [v for r in rs for c, v in r.items() if c.startswith("step") and c != "step"]
        med["to_last"] = float(np.median(last)) if last else float("nan")
        in_fit = [r["store_fit"] for r in rs if "store_fit" in r]
        med["store_fit"] = float(np.median(in_fit)) if in_fit else float("nan")
        medians[key] = med
        cells = " | ".join(f"{1e3 * med[c]:.1f}" for c in (*columns, "to_last", "store_fit"))
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | {cells} |")
    return lines, medians


def _plot(medians: dict, path: Path) -> None:
    """Stacked phases per (label, dataset, k): all of them, and all but seeding (which
    can dwarf the others at large ``k``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(medians, key=lambda g: (g[1], g[2], g[0]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(keys) + 1.8), sharey=True)
    colors = dict(zip(PHASES, ("#999999", "#d62728", "#1f77b4", "#2ca02c"), strict=True))
    for ax, phases in zip(axes, (PHASES, tuple(p for p in PHASES if p != "seeding")),
                          strict=True):  # fmt: skip
        for y, key in enumerate(keys):
            left = 0.0
            for p in phases:
                w = 1e3 * medians[key][p]
                ax.barh(y, w, left=left, color=colors[p], label=p if y == 0 else None)
                left += w
        ax.set_xlabel("ms from fit() to the end of the first step (median)")
        ax.legend(loc="lower right")
    axes[1].set_title("without seeding")
    axes[0].set_yticks(range(len(keys)), [f"{d} k={k} {lab}" for lab, d, k in keys])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.first_step",
                                description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("--data", type=Path, required=True, help="mnist.npz (train, test)")
    p.add_argument("--dataset", action="append", choices=("mnist", "unit384"))
    p.add_argument("--k", type=int, action="append")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="stop the fit after this step")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--label", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from threadpoolctl import threadpool_limits

    z = dict(np.load(args.data))
    data = {"mnist": np.ascontiguousarray(z["train"], dtype=np.float32)}
    names = args.dataset or ["mnist", "unit384"]
    if "unit384" in names:
        data["unit384"] = unit384(z)
    args.out.mkdir(parents=True, exist_ok=True)
    with threadpool_limits(args.threads):
        first_step_run(data["mnist"][:3000], 20, steps=2, n_threads=args.threads)  # compile
        with open(args.out / "runs.jsonl", "a") as f:
            for _ in range(args.repeats):
                for name in names:
                    for k in args.k or [50, 1024]:
                        for seed in range(args.seeds):
                            r = first_step_run(data[name], k, seed=seed, steps=args.steps,
                                               n_threads=args.threads)  # fmt: skip
                            r = {"label": args.label, "dataset": name,
                                 **{c: round(v, 5) if isinstance(v, float) else v
                                    for c, v in r.items()}}  # fmt: skip
                            f.write(json.dumps(r) + "\n")
                            print(json.dumps(r), flush=True)
    records = [json.loads(s) for s in (args.out / "runs.jsonl").read_text().splitlines() if s]
    lines, medians = summarise(records)
    (args.out / "first-step.md").write_text(
        "Milliseconds from `fit()` to the end of its first step, by phase (medians; "
        "`fit`: the whole call, stopped after step S, which also finishes the store and "
        "labels every row).\n\n" + "\n".join(lines) + "\n")  # fmt: skip
    _plot(medians, args.out / "first-step.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
