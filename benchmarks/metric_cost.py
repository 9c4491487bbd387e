"""The time ``metric="cosine"`` adds to a fit, on the same unit rows as ``"euclidean"``.

``NestedMiniBatchKMeans(n_clusters=k, metric=m, random_state=seed, n_threads=1).fit(U)``
with one BLAS thread, for ``m`` euclidean then cosine, seed after seed, ``--repeats``
rounds; ``U``: the benchmark's sentence embeddings (all-MiniLM-L6-v2, ``d = 384``, unit
vectors; :mod:`benchmarks.embeddings`, computed once and cached) or ``--data``'s
``train`` (and ``test``) normalised. One line per fit: metric, seed, round, fit seconds,
``n_iter_``, ``batch_size_``, seconds per iteration, the distances the steps computed
(millions; ``IterationStats.n_distances``) and the steps' seconds per million of them,
and the mean cosine dissimilarity
``1 - max_j cos(x, c_j)`` of the train and held-out rows (centroids normalised, so both
models are measured alike); then the medians per metric. The two metrics' fits take
different paths (the doubling test differs, so do the swaps' energies): the medians
compare whole fits, not one step::

    python -m benchmarks.metric_cost --k 50
"""

from __future__ import annotations

import argparse
import statistics
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.metric_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None,
                   help="an .npz with the key train (and test), normalised here; default: "
                        "the sentence embeddings")  # fmt: skip
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    name, train, test = _load(args.data)
    unit_rows(train[:2])  # numba's start-up, not the copy's time
    t0 = time.perf_counter()
    unit_rows(train)
    print(f"# {name}: train {train.shape}, held out {test.shape}; unit_rows(train) "
          f"{time.perf_counter() - t0:.3f} s (the cosine fit's copy of its input)")
    print("# metric seed round fit_s n_iter_ batch_size_ s_per_iter distances_M "
          "step_s_per_M train_1-cos held_out_1-cos")
    columns = ("fit s", "s per iteration", "distances (M)", "step s per M distances",
               "train 1-cos", "held-out 1-cos")  # fmt: skip
    medians: dict[str, list[list[float]]] = {"euclidean": [], "cosine": []}
    with threadpool_limits(1):
        for round_ in range(args.repeats):
            for seed in range(args.seeds):
                for metric in ("euclidean", "cosine"):
                    steps: list[tuple[int, float]] = []
                    est = NestedMiniBatchKMeans(
                        args.k, metric=metric, random_state=seed, n_threads=1,
                        callback=lambda s, _, steps=steps: steps.append((s.n_distances,
                                                                         s.seconds)),
                    )  # fmt: skip
                    t0 = time.perf_counter()
                    est.fit(train)
                    wall = time.perf_counter() - t0
                    dist = sum(n for n, _ in steps) / 1e6
                    row = [wall, wall / est.n_iter_, dist, sum(t for _, t in steps) / dist,
                           mean_dissimilarity(train, est.cluster_centers_),
                           mean_dissimilarity(test, est.cluster_centers_)]  # fmt: skip
                    medians[metric].append(row)
                    print(metric, seed, round_, f"{wall:.2f}", est.n_iter_, est.batch_size_,
                          f"{row[1]:.4f}", f"{dist:.4g}", f"{row[3]:.4g}", f"{row[4]:.5f}",
                          f"{row[5]:.5f}", flush=True)  # fmt: skip
    for metric in ("euclidean", "cosine"):
        values = [statistics.median(c) for c in zip(*medians[metric], strict=True)]
        print(f"# median {metric}: " + ", ".join(
            f"{name} {value:.4g}" for name, value in zip(columns, values, strict=True)))
    fits = {m: statistics.median(r[0] for r in medians[m]) for m in medians}
    ratio = fits["cosine"] / fits["euclidean"]
    print(f"# cosine / euclidean, median fit: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
