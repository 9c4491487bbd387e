"""The machine's peak for k-means' distance work, and the fraction of it each phase reaches.

The peak is what numpy reaches on a float32 GEMM of the dense pass's shape, ``(rows, d) @
(d, k)``, with BLAS on the thread count measured (:func:`gemm_peak`): what a tuned Lloyd
iteration (oneDAL's, faiss's) spends its time in. Each dense phase's fraction of it
(:func:`peak_table`) is the seconds that GEMM would take for the phase's pairs
(``2 d`` flops per row and centroid) over the phase's seconds: 100% for a BLAS product at
the peak, for the kernel after it the share of a peak product's time it adds, and for
the whole dense pass (product and kernel, or both in one pooled task per chunk) what a
Lloyd iteration's distance pass reaches. The
whole fit is compared alike with a Lloyd iteration at the peak over every step's batch
(``b k`` pairs per step): what an exact pass over the same batches would cost at the least.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

__all__ = ["PEAK_ROWS", "gemm_peak", "lloyd_at_peak", "peak_table"]

PEAK_ROWS = 16_384  # rows of the timed product: 16 of the dense pass's 1,024-row chunks

# A phase's pairs come from its dense pass's BLAS product (rows read and products written,
# ``4 (d + k)`` bytes a row, as :func:`benchmarks.phases.instrument` counts them).
_PRODUCT = {"assign new": "assign new: BLAS product", "revisit": "revisit: BLAS product"}


def gemm_peak(d: int, k: int, threads: int, *, rows: int = PEAK_ROWS, repeats: int = 5
              ) -> dict[str, Any]:  # fmt: skip
    """GFLOP/s (1e9 multiply-adds x 2) of ``A @ B``, ``A`` (rows, d), ``B`` (d, k), float32,
    with BLAS on ``threads`` threads: best of ``repeats`` after one untimed call.

    Returns ``{"gflops", "seconds", "rows", "d", "k", "threads"}``.
    """
    rng = np.random.default_rng(0)
    A = rng.standard_normal((rows, d), dtype=np.float32)
    B = np.ascontiguousarray(rng.standard_normal((k, d), dtype=np.float32).T)
    out = np.empty((rows, k), dtype=np.float32)
    best = math.inf
    with threadpool_limits(threads, user_api="blas"):
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            np.matmul(A, B, out=out)
            best = min(best, time.perf_counter() - t0)
    flops = 2.0 * rows * d * k
    return {"gflops": flops / best / 1e9, "seconds": best, "rows": rows, "d": d, "k": k,
            "threads": threads}  # fmt: skip


def _peak_seconds(pairs: float, d: int, gflops: float) -> float:
    """Seconds of ``pairs`` distances' products at ``gflops``."""
    return 2.0 * pairs * d / (gflops * 1e9)


def lloyd_at_peak(batch_sizes: Sequence[int], d: int, k: int, gflops: float) -> float:
    """Seconds of one exact pass over each step's batch (``b k`` pairs) at ``gflops``."""
    return _peak_seconds(float(sum(batch_sizes)) * k, d, gflops)


def peak_table(doc: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Per dense phase of :func:`benchmarks.phases.summarize`'s ``doc`` (product and
    kernel) and per thread count: its fraction of the peak (seconds at the peak for its
    pairs / its seconds). ``{phase: {"pairs": float, "<n>": fraction or None}}``."""
    d, k = doc["dim"], doc["k"]
    out: dict[str, dict[str, float | None]] = {}
    for context, product in _PRODUCT.items():
        ph = doc["phases"].get(product)
        if not ph or not ph.get("bytes"):
            continue
        pairs = ph["bytes"] / (4.0 * (d + k)) * k
        names = [product, f"{context}: assign kernel", f"{context}: pooled product and kernel"]
        names = [n for n in names if n in doc["phases"]]
        total: dict[str, float] = {}
        for name in names:
            for n, s in doc["phases"][name]["seconds"].items():
                total[n] = total.get(n, 0.0) + s
        # With the pooled pass the product phase holds only what precedes the pool.
        shown = [] if f"{context}: pooled product and kernel" in names else names
        for name, seconds in [*((n, doc["phases"][n]["seconds"]) for n in shown),
                              (f"{context}: dense pass (all of the above)", total)]:
            row: dict[str, float | None] = {"pairs": pairs}
            for n, s in seconds.items():
                peak = doc["peak"][n]["gflops"]
                row[n] = _peak_seconds(pairs, d, peak) / s if s > 0 else None
            out[name] = row
    return out
