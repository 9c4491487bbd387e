"""Exact nearest centroid of arbitrary samples (prediction, ``/assign``, energies).

Both kernels measure every candidate that the float32 estimates cannot rule out in
float64, summed sequentially: the answer (ties to the lowest index) and its squared
distance are the same whichever kernel computes them.
"""

from __future__ import annotations

import numba
import numpy as np

from nmbatch.engine.kernels.common import (
    EMPTY_F64,
    UNIT_ROUNDOFF32,
    bound_factors,
    gemm_estimates,
    projected_estimates,
    sqdist64,
    sqdist_safe,
)
from nmbatch.engine.kernels.parallel import block_rows, parallel_rows

__all__ = ["nearest_dense", "nearest_direct"]


@numba.njit(cache=True, nogil=True)
def _nearest_range(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out, lo, hi, rx, rc, slack):
    """:func:`nearest_dense` over the rows ``[lo, hi)`` (``rx`` empty: ``dots`` the full
    products; otherwise products in a subspace, as in :func:`.dense._dense_range`)."""
    k = C.shape[0]
    d = X.shape[1]
    low = np.empty(k, dtype=np.float64)
    high = np.empty(k, dtype=np.float64)  # scratch of the estimates
    norm_c = np.sqrt(cc)
    projected = rx.shape[0] > 0
    g = (d + 3) * UNIT_ROUNDOFF32  # sqdist32_error(d)
    _, g_hi = bound_factors(g / (1.0 - g))
    for q in range(lo, hi):
        x = X[q]
        if projected:
            top = projected_estimates(x, C, xx[q], rx[q], dots[q], cc, norm_c, rc, slack, d,
                                      g_hi, low, high)  # fmt: skip
        else:
            top = gemm_estimates(xx[q], dots[q], cc, norm_c, g_gemm, d, low, high)
        best = -1
        best_e = np.inf
        for j in range(k):
            if low[j] <= top:
                e = sqdist64(x, C[j])
                if e < best_e:
                    best = j
                    best_e = e
        labels_out[q] = best
        sqdist_out[q] = best_e


@numba.njit(cache=True, nogil=True)
def _nearest_serial(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out, rx, rc, slack):
    """:func:`nearest_dense` on one thread."""
    _nearest_range(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out, 0, X.shape[0], rx, rc,
                   slack)  # fmt: skip


@numba.njit(cache=True, nogil=True, parallel=True)
def _nearest_blocks(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out, block, rx, rc, slack):
    """:func:`nearest_dense`, one task per block of ``block`` rows."""
    m = X.shape[0]
    for bi in numba.prange((m + block - 1) // block):
        lo = bi * block
        _nearest_range(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out, lo,
                       min(m, lo + block), rx, rc, slack)  # fmt: skip


def nearest_dense(
    X: np.ndarray,
    xx: np.ndarray,
    dots: np.ndarray,
    C: np.ndarray,
    cc: np.ndarray,
    g_gemm: float,
    labels_out: np.ndarray,
    sqdist_out: np.ndarray,
    projected: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """Exact nearest centroid of every row (ties: lowest index) and its squared distance.

    X          : (m, d) float32   IN
    xx         : (m,) float64     IN   ``||X[q]||^2``
    dots       : (m, k) float32   IN   ``X @ C.T``
    C          : (k, d) float32   IN
    cc         : (k,) float64     IN
    g_gemm     : float            IN   ``gemm_error(d)``
    labels_out : (m,) int64       OUT
    sqdist_out : (m,) float64     OUT  ``||X[q] - C[label]||^2`` accumulated in float64
    projected  : ``(rx, rc, slack)`` or None: ``dots`` are then products in a subspace
                 (:mod:`nmbatch.engine.projection`); the same answer
    """
    sub = (EMPTY_F64, EMPTY_F64, EMPTY_F64) if projected is None else projected
    if parallel_rows(X.shape[0]):
        block = block_rows(X.shape[0])
        _nearest_blocks(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out, block, *sub)
    else:
        _nearest_serial(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out, *sub)


@numba.njit(cache=True, nogil=True)
def nearest_direct(x: np.ndarray, C: np.ndarray, g: float) -> tuple[int, float]:
    """Exact nearest row of ``C`` to ``x`` (ties: lowest index) and its float64 squared distance.

    x : (d,) float32     IN
    C : (k, d) float32   IN   k >= 1
    g : float            IN   ``sqdist32_error(d)``

    Every centroid's distance is first taken in float32 (SIMD, relative error <= g);
    only the centroids whose interval can reach the smallest upper bound (the bounds
    widened to 2g for the float64 rounding of the products) are measured in float64,
    exactly as :func:`nearest_dense` measures its candidates.
    """
    k = C.shape[0]
    approx = np.empty(k, dtype=np.float64)
    top = np.inf
    for j in range(k):
        s = sqdist_safe(x, C[j])
        approx[j] = s
        upper = s * (1.0 + 2.0 * g)
        if upper < top:
            top = upper
    best = -1
    best_e = np.inf
    for j in range(k):
        if approx[j] * (1.0 - 2.0 * g) <= top:
            e = sqdist64(x, C[j])
            if e < best_e:
                best = j
                best_e = e
    return best, best_e
