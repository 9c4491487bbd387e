"""``python -m benchmarks.distributed``: distributed nmbatch on this machine, and
what it would cost on a cluster (issue 14's benchmark).

Three parts, one folder (``--out``, default ``bench-results/distributed``):

1. **Time to 1% on P shards** (``OUT/<dataset>/``): the benchmark itself
   (``python -m benchmarks --algorithms nmbatch,ray.1,ray.2,ray.4 ...``, run
   here in a child process per data set unless ``--skip-runs``), the single-machine
   engine and ``ray.P`` (:mod:`benchmarks.ray_runner`) from the same start and
   the same nested prefix, measured against the same ``E*_s``.
2. **Constants** (:func:`measure_constants`, ``OUT/constants.json``), at ``k = 100``,
   ``d = 128`` on Gaussian blobs: the bytes of every round on ``P`` shards (sent and
   received, against the formula ``P (4kd + 8k) + P (8kd + 16k)``), the time of a round
   that is not the slowest shard's own step (Ray's calls and the coordinator: the
   overhead), the single-machine seconds per new and per revisited prefix row (a least
   squares fit of each step's time), whether ``P`` shards reach the single-machine
   centroids bit for bit, the coordinator's time
   to merge one shard's deltas, the bytes a shard holds per row, and how many rounds the
   run spends at each batch size.
3. **A cost model** (:mod:`benchmarks.distributed_model`): 8-64 nodes, ``10^9``
   samples at ``d = 128``, from those constants.

``OUT/distributed.json``, ``OUT/distributed.md`` and ``OUT/distributed.png`` gather the
three (``--summarize-only`` rebuilds them from the folder).
"""

from __future__ import annotations

import argparse
import json
import pickle
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import distributed_model as model
from benchmarks.process import child_env

__all__ = ["BLOB_STD", "build_parser", "main", "measure_constants", "summarize_runs"]

BLOB_STD = 8.0
"""Spread of the constants' blobs (centres in [-10, 10]^d): clusters that overlap, so a
batch size takes several rounds, as on real data."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.distributed",
        description="Distributed nmbatch (Ray shard actors) against the single-machine "
        "engine, the bytes and overhead of a round, and a cost model of a cluster.",
    )
    p.add_argument("--out", type=Path, default=Path("bench-results") / "distributed")
    p.add_argument("--datasets", default="mnist,infmnist",
                   help="comma-separated data sets of the benchmark (--dataset values)")
    p.add_argument("--shards", default="1,2,4", help="comma-separated shard counts P")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--budget", type=float, default=10.0,
                   help="seconds of its own time per run (the benchmark's --budget)")
    p.add_argument("--reference-seconds", type=float, default=120.0)
    p.add_argument("--threads", type=int, default=1,
                   help="threads of the single-machine engine and of each shard's kernels")
    p.add_argument("--skip-runs", action="store_true",
                   help="use the <dataset> folders already in --out")
    p.add_argument("--summarize-only", action="store_true",
                   help="only rebuild distributed.json/.md/.png from --out")
    p.add_argument("--constants-n", type=int, default=200_000,
                   help="rows of the k = 100, d = 128 blobs for the constants")
    p.add_argument("--quick", action="store_true", help="small version for tests")
    return p


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _shards(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 1:
        raise SystemExit(f"--shards needs integers >= 1, got {text!r}")
    return values


# -- part 1: the benchmark runs -------------------------------------------------------------


def run_dataset(dataset: str, args: argparse.Namespace) -> Path:
    """The benchmark on ``dataset`` with nmbatch and ray.P into ``OUT/<dataset>``."""
    out = args.out / dataset
    algorithms = ",".join(["nmbatch", *(f"ray.{P}" for P in _shards(args.shards))])
    argv = [
        "--dataset", dataset, "--seeds", str(args.seeds), "--budget", str(args.budget),
        "--threads", str(args.threads), "--algorithms", algorithms,
        "--reference-seconds", str(args.reference_seconds), "--out", str(out),
    ]  # fmt: skip
    if args.quick:
        argv.append("--quick")
    _log("python -m benchmarks " + shlex.join(argv))
    subprocess.run([sys.executable, "-m", "benchmarks", *argv], check=True, env=child_env())
    return out


def summarize_runs(folder: Path) -> dict[str, Any]:
    """Per algorithm of ``folder/curves.json``: the median over seeds of the time to each
    level, the final ``E_V / E*_s - 1`` and, for ``ray.P``, its notes' medians."""
    from benchmarks.protocol import Curve, summarize

    got = json.loads((folder / "curves.json").read_text())
    estar = {int(s): float(e) for s, e in got["estar_per_seed"].items()}
    curves = {int(s): {n: Curve.from_json(c) for n, c in per.items()}
              for s, per in got["curves"].items()}
    names = list(next(iter(curves.values())))
    summary = summarize(curves, estar, names)
    keys = ("setup_seconds", "round_bytes", "round_seconds", "shard_seconds",
            "overhead_seconds", "iterations", "n_lost")
    for name in names:
        notes = [curves[s][name].notes for s in curves]
        summary[name]["notes"] = {
            key: float(np.median([n[key] for n in notes])) for key in keys
            if all(key in n for n in notes)
        }
        summary[name]["steps"] = float(np.median([curves[s][name].n_steps for s in curves]))
    results = json.loads((folder / "results.json").read_text())
    return {"dataset": results["dataset"], "n_train": results["n_train"],
            "dim": results["dim"], "k": results["k"], "seeds": results["seeds"],
            "algorithms": summary}


# -- part 2: the constants ------------------------------------------------------------------


def measure_constants(shards: list[int], *, n: int, k: int = 100, d: int = 128,
                      threads: int = 1) -> dict[str, Any]:
    """The cost model's inputs measured on this machine (see the module); blobs of ``n``
    rows, ``k`` clusters, dimension ``d``; each run to convergence (at most 400 rounds)."""

    from benchmarks.datasets import make_blobs
    from nmbatch.engine import NestedBatchStore, energy, make_algorithm
    from nmbatch.engine.distributed.fit import priorities, ray_session
    from nmbatch.engine.distributed.shard import ShardState
    from nmbatch.engine.threads import kernel_threads
    from nmbatch.engine.warmup import warm_up

    ds = make_blobs(n_train=n, n_test=min(n // 4, 20_000), dim=d, centers=k, std=BLOB_STD,
                    seed=0)
    X, init = ds.train, ds.train[:k].copy()
    warm_up()
    store = NestedBatchStore(d, seed=0, capacity=n)
    store.append(X)
    algo = make_algorithm("nmbatch", store, k, init=init, random_state=0)
    levels: list[tuple[int, int, float, float]] = []  # (b, n_new, seconds, E_V) per step
    with kernel_threads(threads):
        for _ in range(400):
            t0 = time.perf_counter()
            stats = algo.step()
            levels.append((stats.batch_size, stats.n_new, time.perf_counter() - t0,
                           energy(ds.test, algo.centroids)))
            if stats.converged:
                break
    b, new, sec, e = (np.array(col) for col in zip(*levels, strict=True))
    at_1pc = int(np.flatnonzero(e <= 1.01 * e.min())[0])
    # seconds of a step ~ t_new (rows assigned for the first time) + t_rev (rows revisited)
    (t_new, t_rev), *_ = np.linalg.lstsq(np.stack([new, b - new], axis=1).astype(float), sec,
                                         rcond=None)
    local = {
        "steps": len(levels), "seconds": float(sec.sum()),
        "rounds_per_level": {str(s): int((b == s).sum()) for s in sorted(set(b.tolist()))},
        "batch_at_1pc": int(b[at_1pc]), "steps_to_1pc": at_1pc + 1,
        "seconds_per_new_row": max(float(t_new), 0.0),
        "seconds_per_revisited_row": max(float(t_rev), 0.0),
    }  # fmt: skip

    pi = priorities(n, 0)
    per_shards: dict[str, Any] = {}
    with ray_session(None):  # Ray for these runs only, unless already running
        for P in shards:
            per_shards[str(P)] = _shard_run(X, init, pi, k, P, threads, len(levels),
                                            algo.centroids)

    # One shard's answer naming every cluster, as the coordinator takes it in.
    j, dS, dv, dQ = np.arange(k), np.ones((k, d)), np.ones(k, np.int64), np.ones(k)
    blob = pickle.dumps(((j, dS, dv, dQ), 1, 1, 1, 1, 0.0), protocol=5)
    S, v, Q = np.zeros((k, d)), np.zeros(k, np.int64), np.zeros(k)
    t0 = time.perf_counter()
    for _ in range(200):
        (j, dS, dv, dQ), *_ = pickle.loads(blob)
        for sums in ((S, v, Q), (S, v, Q)):  # the totals and the shard's ledger
            sums[0][j] += dS
            sums[1][j] += dv
            sums[2][j] += dQ
    merge = (time.perf_counter() - t0) / 200

    shard = ShardState(X[:20_000], np.arange(20_000), pi[:20_000], k, "auto", threads)
    shard.step((init, np.zeros(k)), int(np.sort(pi[:20_000])[-1]) + 1)
    held = sum(a.nbytes for a in (shard.data, shard.ids, shard.priority))
    per_row = held / 20_000 + shard._algo.bytes_per_sample()
    return {
        "k": k, "d": d, "n": n, "threads": threads, "local": local, "shards": per_shards,
        "merge_seconds_per_shard": merge, "shard_bytes_per_row": per_row,
        "bound_mode": shard._algo.bound_mode,
    }


def _shard_run(X: np.ndarray, init: np.ndarray, pi: np.ndarray, k: int, P: int, threads: int,
               local_steps: int, local_centroids: np.ndarray) -> dict[str, Any]:
    """One run of :func:`measure_constants` on ``P`` shards, to convergence (at most 400
    rounds), against the single-machine run's step count and centroids."""
    import ray

    from nmbatch.engine.distributed.coordinator import Coordinator
    from nmbatch.engine.distributed.fit import partition

    n, d = X.shape
    parts = [(ray.put(X[ids]), ids, pi[ids]) for ids in partition(n, P)]
    coord = Coordinator(parts, k, d, init=init, random_state=0, n_threads=threads)
    try:
        ray.get([s.warm_up.remote() for s in coord.shards])
        seconds = []
        for _ in range(400):
            stats = coord.step()
            seconds.append(stats.seconds)
            if stats.converged:
                break
    finally:
        coord.close()
    rounds, shard = np.array(seconds), np.array(coord.round_shard_seconds)
    return {
        "rounds": len(seconds), "seconds": float(rounds.sum()),
        "round_bytes": coord.round_bytes, "formula_bytes": model.round_bytes(P, k, d),
        "overhead_per_round": float(np.median(rounds - shard)),
        "shard_seconds": float(shard.sum()),
        "same_rounds_as_local": len(seconds) == local_steps,
        "same_centroids_as_local": bool(np.array_equal(coord.centroids, local_centroids)),
    }  # fmt: skip


# -- the folder ----------------------------------------------------------------------------


def summarize_folder(out: Path, datasets: list[str]) -> dict[str, Any]:
    """``OUT/distributed.json``/``.md``/``.png`` from the folders and ``constants.json``."""
    from benchmarks import machine

    runs = {ds: summarize_runs(out / ds) for ds in datasets if (out / ds / "curves.json").exists()}
    constants = json.loads((out / "constants.json").read_text())
    doc = {"runs": runs, "constants": constants, "cost_model": model.cost_table(constants),
           "limits": model.limits(constants), "machine": machine.machine_info()}
    (out / "distributed.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "distributed.md").write_text(model.markdown(doc))
    model.plot(out / "distributed.png", doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    datasets = [s.strip() for s in args.datasets.split(",") if s.strip()]
    if not args.summarize_only:
        if not args.skip_runs:
            for ds in datasets:
                run_dataset(ds, args)
        n = 20_000 if args.quick else args.constants_n
        constants = measure_constants(_shards(args.shards), n=n, threads=args.threads)
        constants["command"] = "python -m benchmarks.distributed " + shlex.join(
            sys.argv[1:] if argv is None else argv
        )
        (args.out / "constants.json").write_text(json.dumps(constants, indent=1) + "\n")
    summarize_folder(args.out, datasets)
    print((args.out / "distributed.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
