"""The reassignment pass of a grouped revisit (:mod:`.grouped`'s pass 2b), one thread or
block by block.

The listed rows' bounds have been swept (:func:`.grouped.group_sweep`) and, optionally,
their distance to ``a(i)`` settled (:func:`.grouped.settle_assigned_grouped`); each open
group's members are measured unless Yinyang's local filter excludes them, the nearest is
decided exactly and the vote moves. Layout of the arrays: :mod:`.grouped`.
:func:`reassign_grouped_rows` runs :func:`reassign_grouped` on one thread, or
:func:`reassign_blocks` block by block with the votes cast afterwards in row order by
:func:`~nmbatch.engine.kernels.parallel.apply_moves` (the same results, bit for bit).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nmbatch.engine.kernels.common import (
    EMPTY_F64,
    PREFETCH_AHEAD,
    UP,
    UP32,
    bound_factors,
    down32,
    exact_argmin,
    move_vote,
    prefetch_row,
    push_candidate,
    sqdist32_error,
    sqdist_safe,
    sqnorm,
    weight_of,
)
from nmbatch.engine.kernels.parallel import apply_moves, block_rows, parallel_rows

__all__ = ["LOCAL_DOWN", "reassign_blocks", "reassign_grouped", "reassign_grouped_rows"]

LOCAL_DOWN = 1.0 - 2.0**-50
"""Factor that keeps ``lower + (pmax - p(j))``, two float64 additions of non-negative
terms, below its exact value."""


@numba.njit(cache=True, nogil=True)
def _reassign_range(
    X, rows, lo, hi, C, g, group_of, members, starts, p, pmax, labels, upper, lower, S, v,
    Q, w, s_assigned, known, prev, xx,
):  # fmt: skip
    """:func:`reassign_grouped` over ``rows[lo:hi]``; returns ``(n_changed, n_distances)``.

    ``prev``, ``xx`` (m,) int32, (m,) float64, or empty: when given, a row's old label
    goes to ``prev[t]`` (and, if it changed, ``||x||^2`` to ``xx[t]``) and its vote is
    left to :func:`~nmbatch.engine.kernels.parallel.apply_moves`; otherwise the vote
    moves here (``S``, ``v``, ``Q``; ``w`` (N,) float64 the rows' weights, or (0,): 1).
    """
    k = C.shape[0]
    G = lower.shape[1]
    g_lo, g_hi = bound_factors(g)
    defer = prev.shape[0] > 0
    cand = np.empty(k, dtype=np.int64)
    cand_s = np.empty(k, dtype=np.float64)
    open_g = np.empty(G, dtype=np.int64)
    opened = np.empty(G, dtype=np.int64)
    min1 = np.empty(G, dtype=np.float64)
    arg1 = np.empty(G, dtype=np.int64)
    min2 = np.empty(G, dtype=np.float64)
    n_changed = 0
    n_dist = 0
    for t in range(lo, hi):
        if t + PREFETCH_AHEAD < hi:
            prefetch_row(X, rows[t + PREFETCH_AHEAD])
        i = rows[t]
        lg = lower[i]
        a = labels[i]
        x = X[i]
        if known:
            s_a = s_assigned[i]
        else:
            s_a = sqdist_safe(x, C[a])
            n_dist += 1
        best = a
        best_s = s_a
        u = math.sqrt(best_s * g_hi)
        cand[0] = a
        cand_s[0] = s_a
        nc = 1
        # Branch-free gathering of the groups whose bound does not exclude them.
        u32 = np.float32(u * UP32)
        n_cand_groups = 0
        for gi in range(G):
            open_g[n_cand_groups] = gi
            n_cand_groups += np.int64(lg[gi] <= u32)
        n_opened = 0
        for q0 in range(n_cand_groups):
            gi = open_g[q0]
            lgo = np.float64(lg[gi])
            if lgo > u:  # every member farther than the best found meanwhile
                continue
            m1 = np.inf
            j1 = -1
            m2 = np.inf
            top = pmax[gi]
            for q in range(starts[gi], starts[gi + 1]):
                j = np.int64(members[q])
                if j == a:
                    continue
                # Local filter (a bound only when the swept bound is positive).
                lb = (lgo + (top - p[j])) * LOCAL_DOWN if lgo > 0.0 else -np.inf
                if lb <= u:
                    s_j = sqdist_safe(x, C[j])
                    n_dist += 1
                    lb = math.sqrt(s_j * g_lo)
                    nc, best, best_s = push_candidate(j, s_j, cand, cand_s, nc, best, best_s)
                    if best == j:
                        u = math.sqrt(best_s * g_hi)
                if lb < m1:
                    m2 = m1
                    m1 = lb
                    j1 = j
                elif lb < m2:
                    m2 = lb
            opened[n_opened] = gi
            min1[n_opened] = m1
            arg1[n_opened] = j1
            min2[n_opened] = m2
            n_opened += 1
        if nc > 1:
            best, s_new = exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s)
            upper[i] = math.sqrt(s_new * g_hi) * UP
        else:
            upper[i] = u * UP
        for q in range(n_opened):
            lg[opened[q]] = down32(min2[q] if arg1[q] == best else min1[q])
        if defer:
            prev[t] = a
        if best != a:
            ga = group_of[a]
            lg[ga] = min(lg[ga], down32(math.sqrt(s_a * g_lo)))
            n_changed += 1
            labels[i] = best
            if defer:
                xx[t] = sqnorm(x)
            else:
                move_vote(x, sqnorm(x), weight_of(w, i), a, best, S, v, Q)
    return n_changed, n_dist


@numba.njit(cache=True, nogil=True)
def reassign_grouped(
    X, rows, C, g, group_of, members, starts, p, pmax, labels, upper, lower, S, v, Q, w,
    s_assigned, known,
):  # fmt: skip
    """Pass 2 of a grouped revisit on the listed rows (bounds already swept), one thread.

    For each row: the exact distance to ``a(i)`` (read from ``s_assigned`` when
    ``known``), then every group whose bound does not exceed ``u(i)`` (``u`` shrinking
    as nearer centroids are found) is opened: each member ``j != a(i)`` is measured
    unless the local filter ``lower[i, g] + pmax(g) - p(j) > u(i)`` excludes it. The
    nearest is decided exactly (ties to the lowest index, :func:`.common.exact_argmin`).
    An opened group's bound becomes the smallest bound of its members other than the new
    label (measured: their float32 distance rounded down; skipped: the local filter
    value); if the label changed, the old label's group takes in the distance to it.
    ``S``, ``v``, ``Q`` change only for rows whose label changed.

    group_of : (k,) int32, members : (k,) int32, starts : (G + 1,) int64   IN
    p : (k,) float64, pmax : (G,) float64   IN   (as given to :func:`.grouped.group_sweep`)
    s_assigned : (n,) float64 IN (``known``), known : bool; the rest as
    :func:`.bounded.reassign_rows`.

    Returns ``(n_changed, n_distances)``. :func:`reassign_grouped_rows` runs it, or its
    parallel driver on enough rows.
    """
    no_prev = np.empty(0, dtype=np.int32)
    no_xx = np.empty(0, dtype=np.float64)
    return _reassign_range(
        X, rows, 0, rows.shape[0], C, g, group_of, members, starts, p, pmax, labels, upper,
        lower, S, v, Q, w, s_assigned, known, no_prev, no_xx,
    )  # fmt: skip


@numba.njit(cache=True, nogil=True, parallel=True)
def reassign_blocks(
    X, rows, C, g, group_of, members, starts, p, pmax, labels, upper, lower, s_assigned,
    known, block,
):  # fmt: skip
    """Labels and bounds of :func:`reassign_grouped`, one task per block of
    ``block`` listed rows (arguments as there, without ``S``, ``v``, ``Q``).

    Returns ``(prev, xx, n_distances)``: ``prev`` (m,) int32 the old labels, ``xx`` (m,)
    float64 ``||x||^2`` of the rows whose label changed (other entries unset); the votes
    are left to :func:`~nmbatch.engine.kernels.parallel.apply_moves`.
    """
    m = rows.shape[0]
    prev = np.empty(m, dtype=np.int32)
    xx = np.empty(m, dtype=np.float64)
    n_blocks = (m + block - 1) // block
    n_dist = np.zeros(n_blocks, dtype=np.int64)
    no_S = np.empty((0, 0), dtype=np.float64)
    no_v = np.empty(0, dtype=np.int64)
    no_Q = np.empty(0, dtype=np.float64)
    for bi in numba.prange(n_blocks):
        lo = bi * block
        hi = min(m, lo + block)
        n_dist[bi] = _reassign_range(
            X, rows, lo, hi, C, g, group_of, members, starts, p, pmax, labels, upper, lower,
            no_S, no_v, no_Q, no_Q, s_assigned, known, prev, xx,
        )[1]  # fmt: skip
    return prev, xx, n_dist.sum()


def reassign_grouped_rows(
    X: np.ndarray,
    rows: np.ndarray,
    C: np.ndarray,
    *,
    group_of: np.ndarray,
    members: np.ndarray,
    starts: np.ndarray,
    p: np.ndarray,
    pmax: np.ndarray,
    labels: np.ndarray,
    upper_bounds: np.ndarray,
    lower_bounds: np.ndarray,
    S: np.ndarray,
    v: np.ndarray,
    Q: np.ndarray,
    assigned_sqdist: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> tuple[int, int]:
    """Keyword wrapper of :func:`reassign_grouped` (on one thread, or block by block with
    the votes cast afterwards in row order); returns ``(n_changed, n_distances)``.
    ``weights`` (n,) float64 or None: a row's vote counts its weight (None: 1)."""
    w = EMPTY_F64 if weights is None else weights
    known = assigned_sqdist is not None
    s_a = assigned_sqdist if known else EMPTY_F64
    args = (X, rows, C, sqdist32_error(X.shape[1]), group_of, members, starts, p, pmax,
            labels, upper_bounds, lower_bounds)  # fmt: skip
    if not parallel_rows(rows.shape[0]):
        n_changed, n_dist = reassign_grouped(*args, S, v, Q, w, s_a, known)
        return int(n_changed), int(n_dist)
    prev, xx, n_dist = reassign_blocks(*args, s_a, known, block_rows(rows.shape[0]))
    n_changed = apply_moves(X, rows, prev, labels[rows], S=S, v=v, Q=Q, sqnorms=xx,
                            weights=w)
    return n_changed, int(n_dist)
