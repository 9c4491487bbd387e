"""The fused kernel of greedy k-means++: the trials' distances, mins and costs in one pass.

One round of greedy k-means++ (Arthur & Vassilvitskii 2007, as scikit-learn runs it)
draws ``t = 2 + floor(ln k)`` trial rows and keeps the one whose addition lowers the
potential ``phi = sum_i w(i) D(i)^2`` most. :func:`trial_costs` computes, for every
row ``i`` and trial ``j``, ``min(D(i)^2, ||x(i) - p(j)||^2)`` (the distance in float32
from the differences, so a row's distance to itself is exactly 0, widened to float64)
and the per-block sums ``sum_i w(i) min(...)`` in float64, reading each row once.

Rows are split into blocks of :data:`SEED_BLOCK` rows, a size that never depends on the
thread count: a block is one task of the parallel kernel, its sums are taken in row
order, and the caller adds the blocks' sums in block order. So the costs, and the rows
k-means++ chooses from them, are bit-identical with 1, 2 or 64 threads.
:func:`sample_rows` draws rows with probability ``w(i) D(i)^2 / phi`` from the same
block sums, in the same fixed order.
"""

from __future__ import annotations

import numba
import numpy as np

from nmbatch.engine.kernels.common import FASTMATH
from nmbatch.engine.kernels.parallel import parallel_rows

__all__ = ["SEED_BLOCK", "sample_rows", "trial_costs"]

SEED_BLOCK = 512  # rows per block of the seeding kernel; fixed: sums never depend on threads


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _row_sqdist32(x, P, s):
    """``s[j] = sum((x - P[j])**2)`` accumulated in float32, four trials per pass over
    ``x`` (one load of ``x[c]`` for four differences; vectorised over ``c``).

    x : (d,) float32   P : (t, d) float32   s : (t,) float32 OUT
    """
    t = P.shape[0]
    d = x.shape[0]
    j = 0
    while j + 4 <= t:
        p0 = P[j]
        p1 = P[j + 1]
        p2 = P[j + 2]
        p3 = P[j + 3]
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        for c in range(d):
            xc = x[c]
            d0 = xc - p0[c]
            d1 = xc - p1[c]
            d2 = xc - p2[c]
            d3 = xc - p3[c]
            s0 += d0 * d0
            s1 += d1 * d1
            s2 += d2 * d2
            s3 += d3 * d3
        s[j] = s0
        s[j + 1] = s1
        s[j + 2] = s2
        s[j + 3] = s3
        j += 4
    while j < t:
        p = P[j]
        acc = np.float32(0.0)
        for c in range(d):
            diff = x[c] - p[c]
            acc += diff * diff
        s[j] = acc
        j += 1


@numba.njit(cache=True, nogil=True)
def _block(X, w, weighted, closest, P, out, partial, bi, block):
    """Rows of block ``bi``: ``out[j, i] = min(closest[i], ||x(i) - P[j]||^2)`` and
    ``partial[bi, j] = sum_i w(i) out[j, i]`` in row order."""
    n = X.shape[0]
    t = P.shape[0]
    lo = bi * block
    hi = min(n, lo + block)
    s32 = np.empty(t, dtype=np.float32)
    for j in range(t):
        partial[bi, j] = 0.0
    for i in range(lo, hi):
        _row_sqdist32(X[i], P, s32)
        ci = closest[i]
        wi = w[i] if weighted else 1.0
        for j in range(t):
            s = np.float64(s32[j])
            m = s if s < ci else ci
            out[j, i] = m
            partial[bi, j] += wi * m


@numba.njit(cache=True, nogil=True)
def _trials_serial(X, w, weighted, closest, P, out, partial, block):
    for bi in range(partial.shape[0]):
        _block(X, w, weighted, closest, P, out, partial, bi, block)


@numba.njit(cache=True, nogil=True, parallel=True)
def _trials_parallel(X, w, weighted, closest, P, out, partial, block):
    for bi in numba.prange(partial.shape[0]):
        _block(X, w, weighted, closest, P, out, partial, bi, block)


def trial_costs(
    X: np.ndarray,
    closest: np.ndarray,
    P: np.ndarray,
    out: np.ndarray,
    partial: np.ndarray,
    weights: np.ndarray | None = None,
) -> None:
    """The trials' new distances and their per-block costs, in one pass over ``X``.

    X       : (n, d) float32, C-contiguous   IN
    closest : (n,) float64                   IN   ``D(i)^2`` to the chosen rows (inf: none)
    P       : (t, d) float32, C-contiguous   IN   the trial rows
    out     : (t, n) float64                 OUT  ``min(closest[i], ||x(i) - P[j]||^2)``
    partial : (ceil(n / SEED_BLOCK), t) float64  OUT  per block, ``sum_i w(i) out[j, i]``
    weights : (n,) float64 or None           IN   ``w(i)`` (None: all 1)

    The float32 distance is a vectorised loop (its summation order fixed by the code, not
    by the threads); sums are float64. Results do not depend on the thread count.
    """
    weighted = weights is not None
    w = weights if weighted else np.empty(0, dtype=np.float64)
    if parallel_rows(partial.shape[0], 2):
        _trials_parallel(X, w, weighted, closest, P, out, partial, SEED_BLOCK)
    else:
        _trials_serial(X, w, weighted, closest, P, out, partial, SEED_BLOCK)


@numba.njit(cache=True, nogil=True)
def _sample(values, w, weighted, block_sums, u, block):
    n = values.shape[0]
    nb = block_sums.shape[0]
    picks = np.empty(u.shape[0], dtype=np.int64)
    cum = np.empty(nb, dtype=np.float64)
    s = 0.0
    for b in range(nb):
        s += block_sums[b]
        cum[b] = s
    for q in range(u.shape[0]):
        target = u[q]
        b = 0
        while b < nb - 1 and not cum[b] > target:
            b += 1
        rest = target - (cum[b - 1] if b > 0 else 0.0)
        lo = b * block
        hi = min(n, lo + block)
        pick = -1
        last = -1
        run = 0.0
        for i in range(lo, hi):
            vi = values[i] * (w[i] if weighted else 1.0)
            if vi > 0.0:
                last = i
                run += vi
                if run > rest:
                    pick = i
                    break
        if pick < 0:
            pick = last
        if pick < 0:  # rounding past the last block of mass: its last row of mass
            for i in range(n - 1, -1, -1):
                if values[i] * (w[i] if weighted else 1.0) > 0.0:
                    pick = i
                    break
        picks[q] = pick
    return picks


def sample_rows(
    values: np.ndarray,
    block_sums: np.ndarray,
    u: np.ndarray,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Rows drawn with probability ``w(i) values[i] / sum``, by inverse transform.

    values     : (n,) float64 >= 0   IN   ``D(i)^2``
    block_sums : (nb,) float64       IN   ``sum_i w(i) values[i]`` per block of
                 :data:`SEED_BLOCK` rows (as :func:`trial_costs` gives them)
    u          : (t,) float64        IN   uniform draws in ``[0, phi)``, ``phi`` the sum
                 of ``block_sums`` in block order
    weights    : (n,) float64 or None
    Returns (t,) int64: for each ``u``, the block where the running sum of ``block_sums``
    first exceeds it, then the row of that block where the running sum of its rows first
    exceeds the remainder (rounding: the block's last row of positive mass). A row of
    zero mass is never drawn.
    """
    weighted = weights is not None
    w = weights if weighted else np.empty(0, dtype=np.float64)
    return _sample(values, w, weighted, block_sums, u, SEED_BLOCK)
