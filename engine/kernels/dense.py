"""Assignment of rows from a BLAS product of all their distances (the dense path).

Used for new samples (every distance is needed), for revisits that the bounds leave
mostly open, and by the baselines. ``||x - c||^2 = xx + cc - 2 x.c`` with the error of
the float32 product bounded by ``2 g_gemm ||x|| ||c||``: candidates that the bound cannot
rule out are separated by a direct distance, in float64 when needed. ``d(i)^2`` is always
a direct computation.
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
    projected_estimates,
    push_candidate,
    sqdist32_error,
    sqdist_safe,
    sqnorm,
    weight_of,
)
from nmbatch.engine.kernels.parallel import apply_moves, block_rows, parallel_rows

__all__ = ["TIGHT_BOUNDS", "assign_dense"]

TIGHT_BOUNDS = 1.0


@numba.njit(cache=True, nogil=True)
def _dense_range(
    X, rows, lo, hi, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower,
    upper, S, v, sse, Q, w, prev, old_d2, rx, rc, slack,
):
    """:func:`assign_dense` over ``rows[lo:hi]``; returns ``n_changed``.

    xx      : (m,) float64   ``||X[rows[q]]||^2``: IN, or OUT when ``fill_xx``
    rx, rc, slack : (m,), (k,), (4,) float64, or empty: ``dots`` are the products of
              the full rows. Otherwise ``dots`` are products in a subspace and these its
              residual norms and slack (:func:`~.common.projected_estimates`).
    lower   : (N, k) float32, or (0, k): no lower bounds
    upper   : (N,) float64, or (0,): no upper bounds
    w       : (N,) float64, or (0,): unweighted   the weight of each row (its vote)
    prev, old_d2 : (m,) int32, (m,) float64, or empty. When given, the vote a row casts is
              left to :func:`~nmbatch.engine.kernels.parallel.apply_moves`: ``prev[q]``
              the cluster it leaves (``-1``: none, a first vote), ``old_d2[q]`` its old
              ``d(i)^2``; otherwise ``S``, ``v``, ``Q``, ``sse`` change here.
    """
    k = C.shape[0]
    d = X.shape[1]
    g_lo, g_hi = bound_factors(g)
    keep_bounds = lower.shape[0] > 0
    keep_upper = upper.shape[0] > 0
    defer = prev.shape[0] > 0
    cand = np.empty(k, dtype=np.int64)
    cand_s = np.empty(k, dtype=np.float64)
    low = np.empty(k, dtype=np.float64)
    high = np.empty(k, dtype=np.float64)  # scratch of gemm_estimates
    norm_c = np.sqrt(cc)
    projected = rx.shape[0] > 0
    n_changed = 0
    for q in range(lo, hi):
        i = rows[q]
        x = X[i]
        if fill_xx:
            xx[q] = sqnorm(x)
        if projected:
            top = projected_estimates(x, C, xx[q], rx[q], dots[q], cc, norm_c, rc, slack, d,
                                      g_hi, low, high) * TIGHT_BOUNDS  # fmt: skip
        else:
            top = gemm_estimates(xx[q], dots[q], cc, norm_c, g_gemm, d, low, high)
        # Candidates whose lower estimate does not exceed the best upper estimate.
        nc = 0
        best = -1
        best_s = np.inf
        for j in range(k):
            if low[j] <= top:
                s_j = sqdist_safe(x, C[j])
                nc, best, best_s = push_candidate(j, s_j, cand, cand_s, nc, best, best_s)
        best, s_new = exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s)
        if keep_bounds:
            li = lower[i]
            for j in range(k):  # branch-free down32 (vectorised)
                li[j] = np.float32(min(math.sqrt(max(low[j], 0.0)) * DOWN, FLT_MAX))
            for q2 in range(nc):
                li[cand[q2]] = down32(math.sqrt(cand_s[q2] * g_lo))
        if keep_upper:
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
def _assign_dense(
    X, rows, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower, upper, S, v,
    sse, Q, w, rx, rc, slack,
):
    """The kernel of :func:`assign_dense` on one thread (arguments of :func:`_dense_range`)."""
    no_prev = np.empty(0, dtype=np.int32)
    no_d2 = np.empty(0, dtype=np.float64)
    return _dense_range(
        X, rows, 0, rows.shape[0], xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels,
        dist2, lower, upper, S, v, sse, Q, w, no_prev, no_d2, rx, rc, slack,
    )


@numba.njit(cache=True, nogil=True, parallel=True)
def _dense_blocks(
    X, rows, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower, upper,
    prev, old_d2, block, rx, rc, slack,
):
    """Labels, distances and bounds of :func:`assign_dense`, one task per block of
    ``block`` rows; the votes are left in ``prev``/``old_d2``. Returns ``n_changed``."""
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
            lower, upper, no_S, no_v, no_f, no_f, no_f, prev, old_d2, rx, rc, slack,
        )
    return changed.sum()


def assign_dense(
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
    remove: bool = False,
    sqnorms: np.ndarray | None = None,
    sqnorms_known: bool = False,
    lower_bounds: np.ndarray | None = None,
    upper_bounds: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    projected: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> int:
    """Assign ``rows`` from a BLAS product of all their distances; update sums (and bounds).

    X             : (N, d) float32   IN   sample buffer (rows indexed by ``rows``)
    rows          : (m,) int64       IN   the rows to assign
    C             : (k, d) float32   IN
    dots          : (m, k) float32   IN   ``X[rows] @ C.T``
    cc            : (k,) float64     IN   ``||C[j]||^2``
    labels        : (N,) int32       INOUT  ``-1`` for unassigned rows
    dist2         : (N,) float64     INOUT  ``d(i)^2``
    S, v, sse, Q                     INOUT  ``Q``: sum of ``||x||^2`` per cluster
    remove        : bool  one sample, one vote: a row with ``labels >= 0`` gives back its
                    old contribution (only if its label changes, plus its old ``sse``
                    term). ``False``: always add (mbatch, and a fresh pass whose sums
                    start at zero).
    sqnorms       : (N,) float64 or None  ``||X[i]||^2`` by row. Read for ``rows`` when
                    ``sqnorms_known``; otherwise computed as each row is read (one pass
                    over the rows, not two) and written for ``rows``. None: computed,
                    not kept.
    lower_bounds  : (N, k) float32 or None  OUT  tight lower bounds of ``rows``
    upper_bounds  : (N,) float64 or None    OUT  ``u(i)`` of ``rows``
    weights       : (N,) float64 or None    IN   the weight of each row (its vote counts
                    ``w(i)`` times: ``S += w x``, ``v += w``, ``Q += w ||x||^2``, ``sse +=
                    w d^2``); None or empty: every weight 1
    projected     : ``(rx, rc, slack)``, (m,), (k,), (4,) float64, or None: ``dots`` are
                    then the products in a subspace, ``(m, k)`` float32
                    (:mod:`nmbatch.engine.projection`); the same labels, distances and
                    votes, lower bounds from the subspace's estimates

    Returns ``n_changed``: rows that had a label and now have another.
    """
    d = X.shape[1]
    w = EMPTY_F64 if weights is None else weights
    fill = sqnorms is None or not sqnorms_known
    xx = np.empty(rows.shape[0], dtype=np.float64) if fill else sqnorms[rows]
    if lower_bounds is None:
        lower_bounds = np.empty((0, C.shape[0]), dtype=np.float32)
    if upper_bounds is None:
        upper_bounds = EMPTY_F64
    args = (X, rows, xx, fill, dots, C, cc, gemm_error(d), sqdist32_error(d), remove,
            labels, dist2, lower_bounds, upper_bounds)
    subspace = (EMPTY_F64, EMPTY_F64, EMPTY_F64) if projected is None else projected
    if parallel_rows(rows.shape[0]):
        prev = np.empty(rows.shape[0], dtype=np.int32)
        old_d2 = np.empty(rows.shape[0], dtype=np.float64)
        n_changed = _dense_blocks(*args, prev, old_d2, block_rows(rows.shape[0]), *subspace)
        apply_moves(X, rows, prev, labels[rows], S=S, v=v, Q=Q, sqnorms=xx, sse=sse,
                    old_dist2=old_d2, new_dist2=dist2[rows], weights=w)
    else:
        n_changed = _assign_dense(*args, S, v, sse, Q, w, *subspace)
    if fill and sqnorms is not None:
        sqnorms[rows] = xx
    return int(n_changed)
