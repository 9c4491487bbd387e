"""Memory per sample of each algorithm, measured as the peak resident memory a run adds.

Each measurement runs in a fresh process (``python -m benchmarks.memory DIR``):
it loads the first ``n`` rows of ``DIR/train.npy``, shuffles them as the benchmark does
(:func:`~benchmarks.protocol.shuffled_problem`), runs the algorithm once on a
small problem (JIT, BLAS and library set-up), then resets the kernel's high-water mark of
the process (``/proc/self/clear_refs``, Linux), reads its resident memory (``VmRSS``),
runs ``iterations`` iterations of the algorithm on the ``n`` rows and reads the high-water
mark again (``VmHWM``). The difference is what the run added at its peak: its copies of
the data, per-sample state (labels, distances, bounds), per-cluster sums and scratch.

Each algorithm is measured at ``n`` and ``n / 2`` rows; bytes per sample is the slope,
``(added(n) - added(n/2)) / (n - n/2)``, so costs that do not grow with ``n`` (centroids,
per-cluster arrays, library buffers) cancel, and the fixed part is reported apart. The
engine's algorithms are measured with the whole data in the batch (``batch_size = n``),
the state of a nested batch once it has grown to ``N``. The peak of a process whose
high-water mark cannot be reset is not measured (``None``).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.process import child_env

__all__ = ["measure_memory", "memory_markdown", "read_status_kib"]


def read_status_kib(field: str) -> int | None:
    """``field`` (``"VmRSS"``, ``"VmHWM"``) of ``/proc/self/status`` in KiB; None if absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set size to the current one
        return True
    except OSError:
        return False


def _runner(name: str) -> Callable[..., Any]:
    from benchmarks.ours import OURS, run_ours
    from benchmarks.peers import make_peer

    return run_ours(name) if name in OURS else make_peer(name)


def _worker(work: Path) -> int:
    """Measure one (algorithm, k, n) as the module docstring says; writes result.json."""
    cfg = json.loads((work / "config.json").read_text())
    name, k, n = str(cfg["name"]), int(cfg["k"]), int(cfg["n"])
    from benchmarks.ours import OURS
    from benchmarks.process import limit_threads
    from benchmarks.protocol import Budget, shuffled_problem

    limit_threads(int(cfg["threads"]))
    full = np.load(work / "train.npy")
    X = np.ascontiguousarray(full[:n], dtype=np.float32)
    del full
    ours = name in OURS
    run = _runner(name)
    # Set-up run: compiles, loads BLAS and the libraries' buffers (not measured).
    n_small = min(n, max(4 * k, 1000))
    small = shuffled_problem(X[:n_small], int(cfg["seed"]), k,
                             batch_size=n_small if ours else int(cfg["batch_size"]))
    for _ in run(small, Budget(float("inf"), 1)):
        pass
    problem = shuffled_problem(X, int(cfg["seed"]), k,
                               batch_size=n if ours else int(cfg["batch_size"]))
    del X, small
    gc.collect()
    reset = _reset_peak()
    base = read_status_kib("VmRSS")
    t0 = time.perf_counter()
    steps = 0
    for _ in run(problem, Budget(float("inf"), int(cfg["iterations"]))):
        steps += 1
    seconds = time.perf_counter() - t0
    peak = read_status_kib("VmHWM")
    added = (peak - base) * 1024 if reset and peak is not None and base is not None else None
    (work / "result.json").write_text(json.dumps({
        "name": name, "k": k, "n": n, "iterations": steps, "seconds": seconds,
        "baseline_bytes": None if base is None else base * 1024,
        "peak_bytes": None if peak is None else peak * 1024, "added_bytes": added,
    }))
    return 0


def _measure_one(
    work: Path, name: str, k: int, n: int, *, threads: int, iterations: int, seed: int,
    batch_size: int, timeout: float,
) -> dict[str, Any]:
    (work / "config.json").write_text(json.dumps({
        "name": name, "k": k, "n": n, "threads": threads, "iterations": iterations,
        "seed": seed, "batch_size": batch_size,
    }))
    (work / "result.json").unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", str(work)],
        check=True, timeout=timeout, env=child_env(MPLBACKEND="Agg"),
    )
    return json.loads((work / "result.json").read_text())


def measure_memory(
    train: np.ndarray, names: list[str], k: int, *, n: int | None = None, threads: int = 1,
    iterations: int = 2, seed: int = 0, batch_size: int = 5000, timeout: float = 3600.0,
    log: Callable[[str], None] = lambda _msg: None,
) -> list[dict[str, Any]]:
    """Bytes per sample of each of ``names`` at ``k`` on the first ``n`` rows of ``train``
    ((N, d) float32; ``n`` default N), each measured at ``n`` and ``n // 2`` rows in fresh
    processes. Returns one dict per algorithm: ``name``, ``k``, ``n``, ``d``,
    ``bytes_per_sample`` (the slope, None if unmeasured), ``fixed_bytes``, and the two
    raw measurements under ``runs``."""
    n = int(train.shape[0] if n is None else min(n, train.shape[0]))
    half = n // 2
    if half < k:
        raise ValueError(f"n // 2 = {half} rows, fewer than k = {k}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nmbatch-memory-") as tmp:
        work = Path(tmp)
        np.save(work / "train.npy", np.ascontiguousarray(train[:n], dtype=np.float32))
        for name in names:
            runs = [
                _measure_one(work, name, k, m, threads=threads, iterations=iterations,
                             seed=seed, batch_size=batch_size, timeout=timeout)
                for m in (half, n)
            ]
            a, b = runs[0]["added_bytes"], runs[1]["added_bytes"]
            slope = None if a is None or b is None else (b - a) / (n - half)
            fixed = None if slope is None else a - slope * half
            rows.append({"name": name, "k": int(k), "n": n, "d": int(train.shape[1]),
                         "bytes_per_sample": slope, "fixed_bytes": fixed, "runs": runs})
            log(f"memory k={k} {name:24s} "
                + ("unmeasured" if slope is None else
                   f"{slope:10.0f} B/sample, fixed {fixed / 2**20:8.1f} MiB"))
    return rows


def memory_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """A markdown table of :func:`measure_memory` rows (any datasets and k)."""
    out = [
        "| data | k | algorithm | bytes per sample | one float32 row (4d) | fixed (MiB) "
        "| added at n/2, n (MiB) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        runs = r["runs"]
        added = [x["added_bytes"] for x in runs]
        per = r["bytes_per_sample"]
        fixed = r["fixed_bytes"]
        out.append(
            f"| {r.get('dataset', '')} (n = {r['n']:,}) | {r['k']:,} | {r['name']} | "
            + ("n/a" if per is None else f"{per:,.0f}") + f" | {4 * r['d']:,} | "
            + ("n/a" if fixed is None else f"{fixed / 2**20:.1f}") + " | "
            + ", ".join("n/a" if x is None else f"{x / 2**20:.1f}" for x in added) + " |"
        )
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m benchmarks.memory DIR (see the module docstring)",
              file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(_worker(Path(sys.argv[1])))
