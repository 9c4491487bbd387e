"""Run the faiss peers in a separate process, so its BLAS can be configured by environment.

faiss-cpu bundles its own OpenBLAS, which picks its kernels from the CPU at load time and
can mis-detect recent processors; ``OPENBLAS_CORETYPE`` (e.g. ``SkylakeX``) overrides that,
but only before the library is loaded, hence a subprocess. Used by
``python -m benchmarks --faiss-blas-fixed``; not meant to be run by hand.

Usage: ``python -m benchmarks.faiss_worker DIR`` where ``DIR`` holds ``config.json``
(seeds, k, rho, batch_size, budget, max_iter, eval_grid, threads, warmup, suffix),
``train.npy`` and ``test.npy`` (float32). It shuffles exactly as the parent does, runs
``faiss`` and ``faiss.subsampled`` per seed, and writes ``DIR/curves.json``:
``{"blas": [...], "curves": {seed: {name + suffix: curve}}}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    work = Path(argv[0])
    cfg = json.loads((work / "config.json").read_text())
    from threadpoolctl import threadpool_info

    from benchmarks.peers import make_peer
    from benchmarks.process import keep_freed_memory, limit_threads, prefault_memory
    from benchmarks.protocol import Budget, record, shuffled_problem

    if cfg["keep_memory"]:
        keep_freed_memory()
    limit_threads(int(cfg["threads"]))
    prefault_memory(float(cfg["prefault_gb"]))
    train = np.load(work / "train.npy")
    test = np.load(work / "test.npy")
    names = ("faiss", "faiss.subsampled")
    budget = Budget(float(cfg["budget"]), int(cfg["max_iter"]))
    out: dict[str, dict[str, object]] = {}
    for i, seed in enumerate(cfg["seeds"]):
        problem = shuffled_problem(
            train, int(seed), int(cfg["k"]), rho=float(cfg["rho"]),
            batch_size=int(cfg["batch_size"]),
        )
        if i == 0:  # warm-up, as in the parent
            for name in names:
                warm = Budget(float(cfg["warmup"]), 3)
                record(name, make_peer(name)(problem, warm), test, int(seed))
        out[str(seed)] = {}
        for name in names:
            curve = record(
                name + cfg["suffix"], make_peer(name)(problem, budget), test, int(seed),
                eval_grid=float(cfg["eval_grid"]),
            )
            out[str(seed)][curve.name] = curve.to_json()
            print(f"  [worker] seed {seed} {curve.name}: {curve.n_steps} steps, "
                  f"{curve.total_seconds:.2f} s", file=sys.stderr)
    blas = [
        {"library": Path(b["filepath"]).name, "version": b.get("version"),
         "architecture": b.get("architecture")}
        for b in threadpool_info()
        if b.get("internal_api") == "openblas" and "faiss" in b.get("filepath", "")
    ]
    (work / "curves.json").write_text(json.dumps({"blas": blas, "curves": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
