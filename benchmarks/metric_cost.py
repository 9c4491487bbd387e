"""The time ``metric="cosine"`` adds to a fit, on the same unit rows as ``"euclidean"``.

``NestedMiniBatchKMeans(n_clusters=k, metric=m, random_state=seed, n_threads=1).fit(U)``
with one BLAS thread, for ``m`` euclidean then cosine, seed after seed, ``--repeats``
rounds; ``U``: the benchmark's sentence embeddings (all-MiniLM-L6-v2, ``d = 384``, unit
vectors; :mod:`benchmarks.embeddings`, computed once and cached) or ``--data``'s
``train`` (and ``test``) normalised. One line per fit: metric, seed, round, fit seconds,
``n_iter_``, ``batch_size_``, seconds per iteration, and the mean cosine dissimilarity
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
    t0 = time.perf_counter()
    unit_rows(train)
    print(f"# {name}: train {train.shape}, held out {test.shape}; unit_rows(train) "
          f"{time.perf_counter() - t0:.3f} s (the cosine fit's copy of its input)")
    print("# metric seed round fit_s n_iter_ batch_size_ s_per_iter "
          "train_1-cos held_out_1-cos")
    seconds: dict[str, list[float]] = {"euclidean": [], "cosine": []}
    per_iter: dict[str, list[float]] = {"euclidean": [], "cosine": []}
    with threadpool_limits(1):
        for round_ in range(args.repeats):
            for seed in range(args.seeds):
                for metric in ("euclidean", "cosine"):
                    est = NestedMiniBatchKMeans(args.k, metric=metric, random_state=seed,
                                                n_threads=1)  # fmt: skip
                    t0 = time.perf_counter()
                    est.fit(train)
                    wall = time.perf_counter() - t0
                    seconds[metric].append(wall)
                    per_iter[metric].append(wall / est.n_iter_)
                    print(metric, seed, round_, f"{wall:.2f}", est.n_iter_, est.batch_size_,
                          f"{wall / est.n_iter_:.4f}",
                          f"{mean_dissimilarity(train, est.cluster_centers_):.5f}",
                          f"{mean_dissimilarity(test, est.cluster_centers_):.5f}",
                          flush=True)  # fmt: skip
    for metric in ("euclidean", "cosine"):
        print(f"# median {metric}: fit {statistics.median(seconds[metric]):.2f} s, "
              f"{statistics.median(per_iter[metric]):.4f} s per iteration")
    ratio = statistics.median(seconds["cosine"]) / statistics.median(seconds["euclidean"])
    print(f"# cosine / euclidean, median fit: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
