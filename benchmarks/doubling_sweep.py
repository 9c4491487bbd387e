"""Seconds to each level of held-out energy under several doubling rules (issue 16), or
under other revisit settings (``--bounds``, ``--dense-fraction``).

Runs nmbatch from the benchmark's start (the seed's shuffle, the first ``k`` rows as
centroids) once per setting of the doubling test, ``rho`` (the test's threshold where the
first batch is sized to ``k``: ``large_k_rho``) and ``q`` (``doubling_tolerance``), on
one thread, timing only the steps; the held-out energy after each step is computed
outside the clock. ``E*`` is the benchmark's ``E*_s`` when ``--estar`` names its
``curves.json``, else the lowest held-out energy of these runs::

    python -m benchmarks.doubling_sweep --dataset mnist --data data/mnist.npz --k 1024 \\
        --setting 100,0.05 --setting 1,0.5 --estar docs/bench/large-k/mnist-k1024/curves.json

``--bounds`` (a bound mode) and ``--dense-fraction`` (the share of open pairs past which
a revisit goes through BLAS) apply to every setting: they change how fast a step runs,
not what it computes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# The held-out energy as the benchmark measures it (mean squared distance to the nearest).
from nmbatch.engine.assign import energy as validation_energy

LEVELS = (5.0, 2.0, 1.0, 0.5)


def run_setting(
    train: np.ndarray, test: np.ndarray, k: int, rho: float, q: float, *,
    seed: int = 0, max_steps: int = 400, max_seconds: float = 16.0, batch_size: int = 5000,
    bounds: str = "auto", dense_fraction: float | None = None,
) -> dict:
    """One nmbatch run with ``large_k_rho = rho`` and ``doubling_tolerance = q`` (and the
    bound mode ``bounds``, the revisit's ``dense_revisit_fraction``: None, the default):
    per step the cumulated step seconds, the batch size and the held-out energy."""
    import numba

    from benchmarks.protocol import shuffled_problem
    from nmbatch.engine import NestedBatchStore, make_algorithm
    from nmbatch.engine.threads import kernel_threads

    problem = shuffled_problem(train, seed, k, batch_size=batch_size)
    store = NestedBatchStore(train.shape[1], seed=seed, capacity=train.shape[0])
    store.append(problem.train)
    algo = make_algorithm("nmbatch", store, k, init=problem.init, rho=problem.rho,
                          batch_size=batch_size, random_state=seed, bounds=bounds)
    algo.large_k_rho, algo.doubling_tolerance = float(rho), float(q)
    algo.dense_revisit_fraction = dense_fraction
    seconds, sizes, energy = [], [], []
    total = 0.0
    with kernel_threads(numba.get_num_threads()):
        for _ in range(max_steps):
            t0 = time.perf_counter()
            stats = algo.step()
            total += time.perf_counter() - t0
            seconds.append(total)
            sizes.append(int(stats.batch_size))
            energy.append(validation_energy(test, algo.centroids))
            if stats.converged or total > max_seconds:
                break
    return {"rho": rho, "q": q, "seconds": seconds, "batch_size": sizes, "energy": energy,
            "converged": bool(stats.converged)}


def levels(run: dict, estar: float) -> dict:
    """Seconds to ``(1 + eps) E*`` for each level of :data:`LEVELS` (None: never), and
    the final energy above ``E*`` in percent."""
    out: dict = {}
    for level in LEVELS:
        hit = [t for t, e in zip(run["seconds"], run["energy"], strict=True)
               if e <= (1.0 + level / 100.0) * estar]
        out[f"{level:g}%"] = round(hit[0], 3) if hit else None
    out["final"] = round(100.0 * (run["energy"][-1] / estar - 1.0), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.doubling_sweep", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--dataset", choices=("mnist", "patches"), required=True)
    parser.add_argument("--data", help="mnist.npz (with --dataset mnist)")
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--setting", action="append", required=True,
                        help="rho,q (repeatable)")
    parser.add_argument("--estar", help="the benchmark's curves.json (E*_s of seed 0)")
    parser.add_argument("--bounds", default="auto", help="nmbatch's bound mode")
    parser.add_argument("--dense-fraction", type=float,
                        help="dense_revisit_fraction (default: the engine's)")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--max-seconds", type=float, default=16.0)
    parser.add_argument("--out", help="write every run's curve here (JSON)")
    args = parser.parse_args(argv)

    import numba

    from benchmarks import datasets

    numba.set_num_threads(1)
    if args.dataset == "mnist":
        if not args.data:
            parser.error("--dataset mnist needs --data")
        ds = datasets.load_npz(args.data, "mnist")
    else:
        ds = datasets.make_patches(seed=0)
    runs = []
    for setting in args.setting:
        rho, q = (float(x) for x in setting.split(","))
        runs.append(run_setting(ds.train, ds.test, args.k, rho, q,
                                max_steps=args.max_steps, max_seconds=args.max_seconds,
                                bounds=args.bounds, dense_fraction=args.dense_fraction))
    if args.estar:
        estar = float(json.loads(Path(args.estar).read_text())["estar_per_seed"]["0"])
    else:
        estar = min(min(r["energy"]) for r in runs)
    for r in runs:
        r["levels"] = levels(r, estar)
        print(json.dumps({"dataset": args.dataset, "k": args.k, "rho": r["rho"], "q": r["q"],
                          "bounds": args.bounds, "dense_fraction": args.dense_fraction,
                          "steps": len(r["seconds"]), **r["levels"]}))
    if args.out:
        Path(args.out).write_text(json.dumps({"estar": estar, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
