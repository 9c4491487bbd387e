"""The dense pass with group bounds: assignment from a BLAS product of all distances,
each row keeping one lower bound per group of centroids (``.grouped``'s layout).

The same pass as :mod:`.dense` (new samples, dense revisits); a row's bound for group
``g`` is the smallest estimate over the members of ``g`` other than its label.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nmbatch.engine.kernels.common import (
    DOWN,
    EMPTY_F64,
    FLT_MAX,
    UP,
    add_vote,
    bound_factors,
    down32,
    exact_argmin,
    gemm_error,
    gemm_estimates,
    move_vote,
    push_candidate,
    sqdist32_error,
    sqdist_safe,
    sqnorm,
    weight_of,
)
from nmbatch.engine.kernels.parallel import (
    apply_moves,
    block_rows,
    parallel_rows,
)

__all__ = ["assign_dense_grouped", "dense_blocks"]


@numba.njit(cache=True, nogil=True)
def _dense_range(
    X, rows, lo, hi, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower,
    upper, group_of, S, v, sse, Q, w, prev, old_d2,
):  # fmt: skip
    """:func:`assign_dense_grouped` over ``rows[lo:hi]``; returns ``n_changed``.

    ``xx``: IN, or OUT when ``fill_xx``. ``prev``, ``old_d2`` (m,) int32, (m,) float64,
    or empty: when given, the vote a row casts is left to
    :func:`~nmbatch.engine.kernels.parallel.apply_moves` (``prev[q]`` the cluster it
    leaves, ``-1``: none; ``old_d2[q]`` its old ``d(i)^2``); otherwise ``S``, ``v``,
    ``Q``, ``sse`` change here.
    """
    k = C.shape[0]
    d = X.shape[1]
    G = lower.shape[1]
    g_lo, g_hi = bound_factors(g)
    defer = prev.shape[0] > 0
    cand = np.empty(k, dtype=np.int64)
    cand_s = np.empty(k, dtype=np.float64)
    low = np.empty(k, dtype=np.float64)
    high = np.empty(k, dtype=np.float64)  # scratch of gemm_estimates
    low_g = np.empty(G, dtype=np.float64)  # smallest estimate per group
    norm_c = np.sqrt(cc)
    n_changed = 0
    for q in range(lo, hi):
        i = rows[q]
        x = X[i]
        if fill_xx:
            xx[q] = sqnorm(x)
        top = gemm_estimates(xx[q], dots[q], cc, norm_c, g_gemm, d, low, high)
        # One pass: a centroid whose estimate does not rule it out is a candidate, its
        # distance computed directly; the others' estimates give their group's bound.
        # The float32 bound of an estimate, f(l) = float32(min(sqrt(max(l, 0)) DOWN,
        # FLT_MAX)), is nondecreasing in l, so the smallest over a group is f of the
        # group's smallest estimate: one square root per group, not per centroid.
        for g_i in range(G):
            low_g[g_i] = np.inf
        nc = 0
        best = -1
        best_s = np.inf
        for j in range(k):
            if low[j] <= top:
                s_j = sqdist_safe(x, C[j])
                nc, best, best_s = push_candidate(j, s_j, cand, cand_s, nc, best, best_s)
            else:
                g_j = group_of[j]
                low_g[g_j] = min(low_g[g_j], low[j])
        best, s_new = exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s)
        lg = lower[i]
        for g_i in range(G):
            lg[g_i] = np.float32(min(math.sqrt(max(low_g[g_i], 0.0)) * DOWN, FLT_MAX))
        for q2 in range(nc):  # the candidates' bounds; the label (one of them) has none
            j = cand[q2]
            if j != best:
                g_j = group_of[j]
                lg[g_j] = min(lg[g_j], down32(math.sqrt(cand_s[q2] * g_lo)))
        upper[i] = math.sqrt(s_new * g_hi) * UP
        old = labels[i]
        if old >= 0 and old != best:
            n_changed += 1
        if defer:
            prev[q] = old if remove else -1
            old_d2[q] = dist2[i]
        elif remove and old >= 0:
            wi = weight_of(w, i)
            sse[old] -= wi * dist2[i]
            sse[best] += wi * s_new
            if old != best:
                move_vote(x, xx[q], wi, old, best, S, v, Q)
        else:
            wi = weight_of(w, i)
            sse[best] += wi * s_new
            add_vote(x, xx[q], wi, best, S, v, Q)
        labels[i] = best
        dist2[i] = s_new
    return n_changed


@numba.njit(cache=True, nogil=True)
def _assign_dense_grouped(
    X, rows, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower, upper,
    group_of, S, v, sse, Q, w,
):  # fmt: skip
    """The kernel of :func:`assign_dense_grouped` on one thread (``xx``: IN, or OUT when
    ``fill_xx``)."""
    no_prev = np.empty(0, dtype=np.int32)
    no_d2 = np.empty(0, dtype=np.float64)
    return _dense_range(
        X, rows, 0, rows.shape[0], xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels,
        dist2, lower, upper, group_of, S, v, sse, Q, w, no_prev, no_d2,
    )  # fmt: skip


@numba.njit(cache=True, nogil=True, parallel=True)
def dense_blocks(
    X, rows, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower, upper,
    group_of, prev, old_d2, block,
):  # fmt: skip
    """Labels, distances and group bounds of :func:`assign_dense_grouped`, one task per
    block of ``block`` rows; returns ``n_changed``.

    The votes are left in ``prev`` (m,) int32 and ``old_d2`` (m,) float64 (OUT, as
    ``_dense_range`` writes them); the other arguments as ``_assign_dense_grouped``.
    """
    m = rows.shape[0]
    n_blocks = (m + block - 1) // block
    changed = np.zeros(n_blocks, dtype=np.int64)
    no_S = np.empty((0, 0), dtype=np.float64)
    no_v = np.empty(0, dtype=np.int64)
    no_f = np.empty(0, dtype=np.float64)
    for bi in numba.prange(n_blocks):
        lo = bi * block
        hi = min(m, lo + block)
        changed[bi] = _dense_range(
            X, rows, lo, hi, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2,
            lower, upper, group_of, no_S, no_v, no_f, no_f, no_f, prev, old_d2,
        )  # fmt: skip
    return changed.sum()


def assign_dense_grouped(
    X: np.ndarray,
    rows: np.ndarray,
    C: np.ndarray,
    *,
    dots: np.ndarray,
    cc: np.ndarray,
    labels: np.ndarray,
    dist2: np.ndarray,
    S: np.ndarray,
    v: np.ndarray,
    sse: np.ndarray,
    Q: np.ndarray,
    lower_bounds: np.ndarray,
    upper_bounds: np.ndarray,
    group_of: np.ndarray,
    remove: bool = False,
    sqnorms: np.ndarray | None = None,
    sqnorms_known: bool = False,
    weights: np.ndarray | None = None,
) -> int:
    """:func:`.dense.assign_dense` that writes group bounds: for each row, ``lower[i, g]``
    is the smallest float32 lower bound (from the BLAS estimate, or from the direct
    distance of a candidate) of the members of ``g`` other than the new label.

    lower_bounds : (N, G) float32   OUT
    upper_bounds : (N,) float64     OUT
    group_of     : (k,) int32       IN
    The other arguments (``weights`` included) and the return value as
    :func:`.dense.assign_dense`.
    """
    d = X.shape[1]
    m = rows.shape[0]
    w = EMPTY_F64 if weights is None else weights
    fill = sqnorms is None or not sqnorms_known
    xx = np.empty(m, dtype=np.float64) if fill else sqnorms[rows]
    args = (X, rows, xx, fill, dots, C, cc, gemm_error(d), sqdist32_error(d), remove,
            labels, dist2, lower_bounds, upper_bounds, group_of)  # fmt: skip
    if parallel_rows(m):
        prev = np.empty(m, dtype=np.int32)
        old_d2 = np.empty(m, dtype=np.float64)
        n_changed = dense_blocks(*args, prev, old_d2, block_rows(m))
        apply_moves(X, rows, prev, labels[rows], S=S, v=v, Q=Q, sqnorms=xx, sse=sse,
                    old_dist2=old_d2, new_dist2=dist2[rows], weights=w)  # fmt: skip
    else:
        n_changed = _assign_dense_grouped(*args, S, v, sse, Q, w)
    if fill and sqnorms is not None:
        sqnorms[rows] = xx
    return int(n_changed)
