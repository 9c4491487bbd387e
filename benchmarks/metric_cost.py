"""The time ``metric="cosine"`` and sample weights add to a fit, on the same unit rows.

``NestedMiniBatchKMeans(n_clusters=k, metric=m, random_state=seed, n_threads=1).fit(U,
sample_weight=w)`` with one BLAS thread, for each variant (``--variants``; default all):
``euclidean`` (no weights), ``cosine``, ``weights1`` (Euclidean, every weight 1.0: the
weighted path on the unweighted model) and ``weights`` (Euclidean, integer weights drawn
uniformly from 1-4 with the seed), seed after seed, ``--repeats`` rounds; ``U``: the
benchmark's sentence embeddings (all-MiniLM-L6-v2, ``d = 384``, unit vectors;
:mod:`benchmarks.embeddings`, computed once and cached) or ``--data``'s ``train`` (and
``test``) normalised. One line per fit: variant, seed, round, fit seconds,
``n_iter_``, ``batch_size_``, seconds per iteration, the distances the steps computed
(millions; ``IterationStats.n_distances``) and the steps' seconds per million of them,
and the mean cosine dissimilarity
``1 - max_j cos(x, c_j)`` of the train and held-out rows (centroids normalised, so both
models are measured alike); then the medians per metric. The two metrics' fits take
different paths (the doubling test differs, so do the swaps' energies): the medians
compare whole fits, not one step. With ``--out``: ``results.json`` (every fit and the
medians), ``results.md`` (the medians' table) and ``fit-seconds.png``::

    python -m benchmarks.metric_cost --k 50 --out docs/bench/metric-cost/k50
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from nmbatch.engine import NestedMiniBatchKMeans
from nmbatch.engine.metric import unit_rows


def mean_dissimilarity(A: np.ndarray, C: np.ndarray) -> float:
    """Mean over the rows of ``A`` (``(n, d)``) of ``1 - max_j cos(a, c_j)`` (float64)."""
    A64 = A.astype(np.float64)
    C64 = C.astype(np.float64)
    A64 /= np.linalg.norm(A64, axis=1, keepdims=True)
    C64 /= np.linalg.norm(C64, axis=1, keepdims=True)
    return float((1.0 - (A64 @ C64.T).max(axis=1)).mean())


def _load(path: Path | None) -> tuple[str, np.ndarray, np.ndarray]:
    if path is None:
        from benchmarks.embeddings import load_sentence_embeddings

        data = load_sentence_embeddings()
        return data.name, data.train, data.test
    with np.load(path) as f:
        train = unit_rows(np.ascontiguousarray(f["train"], dtype=np.float32))
        test = unit_rows(np.ascontiguousarray(f["test"], dtype=np.float32)) if "test" in f \
            else train  # fmt: skip
    return path.name, train, test


VARIANTS = ("euclidean", "cosine", "weights1", "weights")
COLUMNS = ("fit s", "s per iteration", "distances (M)", "step s per M distances",
           "train 1-cos", "held-out 1-cos")  # fmt: skip


def _weights(variant: str, n: int, seed: int) -> np.ndarray | None:
    """The ``(n,)`` float64 sample weights of ``variant`` (None: unweighted)."""
    if variant == "weights1":
        return np.ones(n)
    if variant == "weights":
        return np.random.default_rng(1000 + seed).integers(1, 5, n).astype(np.float64)
    return None


def _write(out: Path, meta: dict[str, object], fits: list[dict[str, object]],
           medians: dict[str, list[float]]) -> None:  # fmt: skip
    """results.json, results.md and fit-seconds.png of one run in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "columns": list(COLUMNS), "fits": fits,
           "medians": {v: dict(zip(COLUMNS, m, strict=True)) for v, m in medians.items()}}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    base = medians["euclidean"][0] if "euclidean" in medians else None
    lines = [f"# The time cosine and weights add to a fit: {meta['data']}, k = {meta['k']}",
             "", f"{meta['note']}", "", "Medians over seeds and rounds; one thread.", "",
             "| variant | " + " | ".join(COLUMNS) + " | fit / euclidean |",
             "|---|" + "---:|" * (len(COLUMNS) + 1)]  # fmt: skip
    for v, m in medians.items():
        ratio = f"{m[0] / base:.2f}" if base else "-"
        lines.append(f"| {v} | " + " | ".join(f"{x:.4g}" for x in m) + f" | {ratio} |")
    lines += ["", f"Command: `{meta['command']}`", ""]
    (out / "results.md").write_text("\n".join(lines))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(medians)
    ax.bar(names, [medians[v][0] for v in names], color="tab:blue")
    ax.set_ylabel("fit seconds (median)")
    ax.set_title(f"{meta['data']}, k = {meta['k']}, one thread")
    fig.tight_layout()
    fig.savefig(out / "fit-seconds.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.metric_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help="an .npz with the key train (and test), normalised here; default: "
                        "the sentence embeddings")  # fmt: skip
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS)}")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="folder for results.json/.md/.png")
    p.add_argument("--note", default="", help="a line on the machine's state, for results.md")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := sorted(set(variants) - set(VARIANTS)):
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    name, train, test = _load(args.data)
    unit_rows(train[:2])  # numba's start-up, not the copy's time
    t0 = time.perf_counter()
    unit_rows(train)
    print(f"# {name}: train {train.shape}, held out {test.shape}; unit_rows(train) "
          f"{time.perf_counter() - t0:.3f} s (the cosine fit's copy of its input)")
    print("# variant seed round fit_s n_iter_ batch_size_ s_per_iter distances_M "
          "step_s_per_M train_1-cos held_out_1-cos")
    rows: dict[str, list[list[float]]] = {v: [] for v in variants}
    fits: list[dict[str, object]] = []
    with threadpool_limits(1):
        for round_ in range(args.repeats):
            for seed in range(args.seeds):
                for variant in variants:
                    w = _weights(variant, train.shape[0], seed)
                    steps: list[tuple[int, float]] = []
                    est = NestedMiniBatchKMeans(
                        args.k, metric="cosine" if variant == "cosine" else "euclidean",
                        random_state=seed, n_threads=1,
                        callback=lambda s, _, steps=steps: steps.append((s.n_distances,
                                                                         s.seconds)),
                    )  # fmt: skip
                    t0 = time.perf_counter()
                    est.fit(train, sample_weight=w)
                    wall = time.perf_counter() - t0
                    dist = sum(n for n, _ in steps) / 1e6
                    row = [wall, wall / est.n_iter_, dist, sum(t for _, t in steps) / dist,
                           mean_dissimilarity(train, est.cluster_centers_),
                           mean_dissimilarity(test, est.cluster_centers_)]  # fmt: skip
                    rows[variant].append(row)
                    fits.append({"variant": variant, "seed": seed, "round": round_,
                                 "n_iter": int(est.n_iter_),
                                 "batch_size": int(est.batch_size_),
                                 **dict(zip(COLUMNS, row, strict=True))})  # fmt: skip
                    print(variant, seed, round_, f"{wall:.2f}", est.n_iter_, est.batch_size_,
                          f"{row[1]:.4f}", f"{dist:.4g}", f"{row[3]:.4g}", f"{row[4]:.5f}",
                          f"{row[5]:.5f}", flush=True)  # fmt: skip
    medians = {v: [statistics.median(c) for c in zip(*rows[v], strict=True)] for v in variants}
    for v in variants:
        print(f"# median {v}: " + ", ".join(
            f"{name} {value:.4g}" for name, value in zip(COLUMNS, medians[v], strict=True)))
    if "euclidean" in medians:
        for v in variants[1:] if variants[0] == "euclidean" else variants:
            if v != "euclidean":
                print(f"# {v} / euclidean, median fit: "
                      f"{medians[v][0] / medians['euclidean'][0]:.2f}")
    if args.out is not None:
        given = sys.argv[1:] if argv is None else argv
        command = "python -m benchmarks.metric_cost " + shlex.join(  # no machine's paths
            os.path.basename(a) if os.path.isabs(a) else a for a in given)
        meta = {"data": name, "k": args.k, "seeds": args.seeds, "repeats": args.repeats,
                "train_shape": list(train.shape), "test_shape": list(test.shape),
                "note": args.note, "command": command.strip()}  # fmt: skip
        _write(args.out, meta, fits, medians)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
