"""Where a fit ends from each seeding: the final held-out energy of nmbatch from given seeds.

For each seed and variant ``m:t``: shuffle the training rows with the seed, draw ``k``
centroids by k-means++ on the first ``m`` of them with ``t`` trials per centroid (``g``:
greedy's ``2 + ln k``), then ``NestedMiniBatchKMeans(k, init=<those rows>,
random_state=seed).fit(train)`` to convergence (or ``max_iter``) and measure the mean
squared distance of the held-out rows to their nearest centroid. One thread. Writes
``results.jsonl`` (one line per fit: seeding and fit seconds, the energy, ``n_iter_``,
the energy over ``--estar`` minus 1) and ``results.md``::

    python -m benchmarks.seed_endpoints --dataset patches --k 1024 --seeds 1,2,3 \\
        --variants 4096:1,16384:1,40000:1,114196:1,16384:g,40000:2,114196:2 \\
        --estar 26877 --out docs/bench/seeding/patches-k1024-endpoints
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
from nmbatch.engine.seeding import kmeans_plusplus

__all__ = ["heldout_energy", "main", "parse_variant"]


def parse_variant(text: str) -> tuple[int, int | None]:
    """``"m:t"`` -> ``(m, t)``; ``t = "g"`` -> None (greedy's trial count)."""
    m, _, t = text.partition(":")
    return int(m), None if t == "g" else int(t)


def heldout_energy(V: np.ndarray, C: np.ndarray) -> float:
    """Mean over the rows of ``V`` ``(n, d)`` of the squared distance to the nearest row
    of ``C`` ``(k, d)``, in float64, 512 centroids at a time."""
    V64 = V.astype(np.float64)
    vv = (V64**2).sum(axis=1)
    best = np.full(V.shape[0], np.inf)
    for lo in range(0, C.shape[0], 512):
        Cb = C[lo : lo + 512].astype(np.float64)
        d = vv[:, None] - 2.0 * V64 @ Cb.T + (Cb**2).sum(axis=1)[None, :]
        best = np.minimum(best, d.min(axis=1))
    return float(np.maximum(best, 0.0).mean())


def _load(args: argparse.Namespace) -> tuple[str, np.ndarray, np.ndarray]:
    from benchmarks.datasets import load_npz, make_patches

    if args.dataset == "patches":
        ds = make_patches()
    else:
        ds = load_npz(Path(args.data))
    return ds.name, ds.train, ds.test


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.seed_endpoints", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=("patches", "npz"), default="patches")
    p.add_argument("--data", default=None, help="an .npz with train and test (--dataset npz)")
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--variants", required=True, help="comma-separated m:t (t: 1, 2, .., g)")
    p.add_argument("--estar", type=float, default=None, help="E* (default: the lowest here)")
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    name, X, V = _load(args)
    variants = [v for v in args.variants.split(",") if v]
    fits = []
    with threadpool_limits(1):
        for seed in (int(s) for s in args.seeds.split(",")):
            for variant in variants:
                m, trials = parse_variant(variant)
                rng = np.random.default_rng(seed)
                Xs = X[rng.permutation(X.shape[0])]
                t0 = time.perf_counter()
                idx = kmeans_plusplus(Xs[: min(m, X.shape[0])], args.k, rng, trials=trials)
                init = Xs[idx].copy()
                seeding = time.perf_counter() - t0
                est = NestedMiniBatchKMeans(args.k, init=init, random_state=seed, n_threads=1,
                                            max_iter=args.max_iter)  # fmt: skip
                t0 = time.perf_counter()
                est.fit(X)
                fit = time.perf_counter() - t0
                fits.append({"seed": seed, "variant": variant, "seeding": seeding, "fit": fit,
                             "E": heldout_energy(V, est.cluster_centers_),
                             "n_iter": int(est.n_iter_)})  # fmt: skip
                print(json.dumps(fits[-1]), flush=True)
    estar = args.estar if args.estar is not None else min(f["E"] for f in fits)
    for f in fits:
        f["rel"] = f["E"] / estar - 1.0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.jsonl").write_text("".join(json.dumps(f) + "\n" for f in fits))
    given = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.seed_endpoints " + shlex.join(
        os.path.basename(a) if os.path.isabs(a) else a for a in given)  # no machine's paths
    lines = [f"# Where a fit ends from each seeding: {name}, k = {args.k}", "",
             f"E* = {estar:.6g}; final held-out energy over E*, minus 1; seconds of "
             "seeding and of the fit (one thread).", "",
             "| variant (rows:trials) | final, per seed | median seeding s | median fit s |",
             "|---|---|---:|---:|"]  # fmt: skip
    for variant in variants:
        rows = [f for f in fits if f["variant"] == variant]
        finals = ", ".join(f"{f['rel']:+.2%}" for f in rows)
        lines.append(f"| {variant} | {finals} | {statistics.median(f['seeding'] for f in rows):.3g}"
                     f" | {statistics.median(f['fit'] for f in rows):.3g} |")  # fmt: skip
    lines += ["", f"Command: `{command}`", ""]
    (args.out / "results.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
