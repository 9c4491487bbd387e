"""The bounded revisit of samples already in the batch (nmbatch lines 10-21).

A revisit runs in passes over the prefix rows: :func:`bound_sweep` updates every bound
and lists the rows whose label the bounds cannot settle; :func:`settle_assigned`
(optional) computes their exact distance to ``a(i)``, which settles some rows and
tightens the others' bounds; :func:`reassign_rows` then measures, for each row still
listed, the centroids its bounds leave open and moves its vote if its nearest changed.

Per-sample arrays (``n`` rows): ``labels`` ``a(i)`` int32, ``upper`` ``u(i) >=
||x(i) - c(a(i))||`` float64, ``lower`` ``l(i, j) <= ||x(i) - c(j)||`` ``(n, k)`` float32.
Per-cluster sums: ``S`` ``(k, d)`` float64, ``v`` ``(k,)`` int64, ``Q`` ``(k,)`` float64
(sum of ``||x(i)||^2``).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nmbatch.engine.kernels.common import (
    DOWN32,
    EMPTY_F64,
    PREFETCH_AHEAD,
    UP,
    UP32,
    bound_factors,
    down32,
    exact_argmin,
    list_row,
    move_vote,
    open_pairs,
    prefetch_row,
    push_candidate,
    sqdist32_error,
    sqdist_safe,
    sqnorm,
    weight_of,
)
from nmbatch.engine.kernels.parallel import (
    MIN_SWEEP_ROWS,
    apply_moves,
    block_rows,
    parallel_rows,
)

__all__ = ["bound_sweep", "reassign_rows", "settle_assigned"]


@numba.njit(cache=True, nogil=True)
def _rounded_moves(p):
    """``p`` rounded up to float32, so that the float32 bound update stays below the truth:
    ``fl(fl(l - p32) * (1 - 2^-23)) <= l - p`` for ``l - p > 0`` (a negative bound is valid)."""
    k = p.shape[0]
    p32 = np.empty(k, dtype=np.float32)
    for j in range(k):
        p32[j] = np.float32(p[j] * UP32)
    return p32


@numba.njit(cache=True, nogil=True)
def _sweep_range(p, p32, labels, upper, lower, lo, hi, todo, start):
    """:func:`bound_sweep` over the rows ``[lo, hi)``, listing them from ``todo[start]``.

    Returns ``(listed, n_open)``: rows listed (in ``todo[start : start + listed]``) and
    their open pairs.
    """
    k = lower.shape[1]
    down = np.float32(DOWN32)
    n_todo = start
    n_pairs = 0
    for i in range(lo, hi):
        li = lower[i]
        a = labels[i]
        ub = (upper[i] + p[a]) * UP
        ub32 = np.float32(ub * UP32)
        for j in range(k):  # branch-free, vectorised
            li[j] = (li[j] - p32[j]) * down
        upper[i] = ub
        pairs = open_pairs(li, a, ub32)
        n_todo = list_row(todo, n_todo, i, pairs > 0)
        n_pairs += pairs
    return n_todo - start, n_pairs


@numba.njit(cache=True, nogil=True)
def _bound_sweep(p, labels, upper, lower):
    """:func:`bound_sweep` on one thread."""
    n = labels.shape[0]
    todo = np.empty(n, dtype=np.int64)
    n_todo, n_pairs = _sweep_range(p, _rounded_moves(p), labels, upper, lower, 0, n, todo, 0)
    return todo[:n_todo], n_pairs


@numba.njit(cache=True, nogil=True)
def _join_blocks(todo, listed, block):
    """Move the rows each block listed (``todo[b * block : b * block + listed[b]]``) to the
    front of ``todo``, blocks in order; returns how many rows were listed."""
    n_todo = 0
    for bi in range(listed.shape[0]):
        lo = bi * block
        for q in range(listed[bi]):
            todo[n_todo] = todo[lo + q]
            n_todo += 1
    return n_todo


@numba.njit(cache=True, nogil=True, parallel=True)
def _bound_sweep_blocks(p, labels, upper, lower, block):
    """:func:`bound_sweep`, one task per block of ``block`` rows."""
    n = labels.shape[0]
    p32 = _rounded_moves(p)
    n_blocks = (n + block - 1) // block
    todo = np.empty(n, dtype=np.int64)
    listed = np.zeros(n_blocks, dtype=np.int64)
    pairs = np.zeros(n_blocks, dtype=np.int64)
    for bi in numba.prange(n_blocks):
        lo = bi * block
        hi = min(n, lo + block)
        listed[bi], pairs[bi] = _sweep_range(p, p32, labels, upper, lower, lo, hi, todo, lo)
    return todo[: _join_blocks(todo, listed, block)], pairs.sum()


def bound_sweep(
    p: np.ndarray, labels: np.ndarray, upper: np.ndarray, lower: np.ndarray
) -> tuple[np.ndarray, int]:
    """Pass 1 of a bounded revisit (nmbatch lines 10-13): update every bound, list the open rows.

    Over every row ``i``: the bound update ``l(i, j) -= p(j)`` and ``u(i) += p(a(i))``
    (fused, rounded safely, vectorised). If ``u(i) < l(i, j)`` for every ``j != a(i)``,
    ``a(i)`` is still the unique nearest centroid and the sample need not be read at all;
    otherwise ``i`` is listed in ``todo``.

    p      : (k,) float64     IN   distance moved by each centroid at the last update
    labels : (n,) int32       IN   ``a(i)``
    upper  : (n,) float64     INOUT  ``u(i) >= ||x(i) - c(a(i))||``
    lower  : (n, k) float32   INOUT  ``l(i, j) <= ||x(i) - c(j)||``

    Returns ``(todo, n_open)``: ``todo`` (m,) int64, the rows whose bounds do not settle
    their label, in increasing order; ``n_open`` the number of (row, centroid) pairs of
    those rows that the bounds leave open, ``a(i)`` included (at most ``m k``).
    """
    n = labels.shape[0]
    if parallel_rows(n, MIN_SWEEP_ROWS):
        return _bound_sweep_blocks(p, labels, upper, lower, block_rows(n, MIN_SWEEP_ROWS // 4))
    return _bound_sweep(p, labels, upper, lower)


@numba.njit(cache=True, nogil=True)
def _settle_range(X, rows, lo, hi, C, g, labels, upper, lower, s_assigned, todo, start):
    """:func:`settle_assigned` over ``rows[lo:hi]``, listing from ``todo[start]``;
    returns ``(listed, n_open)``."""
    g_lo, g_hi = bound_factors(g)
    n_todo = start
    n_pairs = 0
    for t in range(lo, hi):
        if t + PREFETCH_AHEAD < hi:
            prefetch_row(X, rows[t + PREFETCH_AHEAD])
        i = rows[t]
        a = labels[i]
        s_a = sqdist_safe(X[i], C[a])
        s_assigned[i] = s_a
        u = math.sqrt(s_a * g_hi)
        upper[i] = u * UP
        li = lower[i]
        li[a] = down32(math.sqrt(s_a * g_lo))
        pairs = open_pairs(li, a, np.float32(u * UP32))
        n_todo = list_row(todo, n_todo, i, pairs > 0)
        n_pairs += pairs
    return n_todo - start, n_pairs


@numba.njit(cache=True, nogil=True)
def _settle_assigned(X, rows, C, g, labels, upper, lower, s_assigned):
    """:func:`settle_assigned` on one thread."""
    m = rows.shape[0]
    todo = np.empty(m, dtype=np.int64)
    n_todo, n_pairs = _settle_range(
        X, rows, 0, m, C, g, labels, upper, lower, s_assigned, todo, 0
    )
    return todo[:n_todo], n_pairs


@numba.njit(cache=True, nogil=True, parallel=True)
def _settle_blocks(X, rows, C, g, labels, upper, lower, s_assigned, block):
    """:func:`settle_assigned`, one task per block of ``block`` listed rows."""
    m = rows.shape[0]
    n_blocks = (m + block - 1) // block
    todo = np.empty(m, dtype=np.int64)
    listed = np.zeros(n_blocks, dtype=np.int64)
    pairs = np.zeros(n_blocks, dtype=np.int64)
    for bi in numba.prange(n_blocks):
        lo = bi * block
        hi = min(m, lo + block)
        listed[bi], pairs[bi] = _settle_range(
            X, rows, lo, hi, C, g, labels, upper, lower, s_assigned, todo, lo
        )
    return todo[: _join_blocks(todo, listed, block)], pairs.sum()


def settle_assigned(
    X: np.ndarray,
    rows: np.ndarray,
    C: np.ndarray,
    g: float,
    labels: np.ndarray,
    upper: np.ndarray,
    lower: np.ndarray,
    s_assigned: np.ndarray,
) -> tuple[np.ndarray, int]:
    """Pass 2a of a bounded revisit (nmbatch lines 14-15): the exact distance to ``a(i)``.

    For each listed row: ``s = ||x(i) - c(a(i))||^2``, stored in ``s_assigned[i]``;
    ``u(i)`` and ``l(i, a(i))`` become tight. A row whose tight ``u(i)`` is now below every
    other ``l(i, j)`` keeps its label and leaves the list.

    X          : (n, d) float32   IN
    rows       : (m,) int64       IN   rows listed by ``bound_sweep``
    C          : (k, d) float32   IN   current centroids
    g          : float            IN   ``sqdist32_error(d)``
    labels     : (n,) int32       IN
    upper      : (n,) float64     INOUT
    lower      : (n, k) float32   INOUT
    s_assigned : (n,) float64     OUT  (for the listed rows)

    Returns ``(todo, n_open)``: the rows still open (a subsequence of ``rows``) and the
    number of their (row, centroid) pairs the tight bounds leave open, ``a(i)`` included.
    """
    if parallel_rows(rows.shape[0]):
        block = block_rows(rows.shape[0])
        return _settle_blocks(X, rows, C, g, labels, upper, lower, s_assigned, block)
    return _settle_assigned(X, rows, C, g, labels, upper, lower, s_assigned)


@numba.njit(cache=True, nogil=True)
def _reassign_range(
    X, rows, lo, hi, C, g, labels, upper, lower, S, v, Q, w, s_assigned, known, prev, xx
):
    """:func:`reassign_rows` over ``rows[lo:hi]``; returns ``(n_changed, n_distances)``.

    ``prev``, ``xx`` (m,) int32, (m,) float64, or empty: when given, a row's old label
    goes to ``prev[t]`` (and, if it changed, ``||x||^2`` to ``xx[t]``) and its vote is
    left to :func:`~nmbatch.engine.kernels.parallel.apply_moves`; otherwise the vote
    moves here (``S``, ``v``, ``Q``; ``w`` (N,) float64 the rows' weights, or (0,): 1).
    """
    k = C.shape[0]
    g_lo, g_hi = bound_factors(g)
    defer = prev.shape[0] > 0
    cand = np.empty(k, dtype=np.int64)
    cand_s = np.empty(k, dtype=np.float64)
    open_j = np.empty(k, dtype=np.int64)
    n_changed = 0
    n_dist = 0
    for t in range(lo, hi):
        if t + PREFETCH_AHEAD < hi:
            prefetch_row(X, rows[t + PREFETCH_AHEAD])
        i = rows[t]
        li = lower[i]
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
        u32 = np.float32(u * UP32)
        # Branch-free gathering of the centroids whose bound does not exclude them.
        n_open = 0
        for j in range(k):
            open_j[n_open] = j
            n_open += np.int32(li[j] <= u32) & np.int32(j != a)
        cand[0] = a
        cand_s[0] = s_a
        nc = 1
        for q in range(n_open):
            j = open_j[q]
            if li[j] > u:  # excluded by a nearer centroid found meanwhile
                continue
            s_j = sqdist_safe(x, C[j])
            n_dist += 1
            li[j] = down32(math.sqrt(s_j * g_lo))
            nc, best, best_s = push_candidate(j, s_j, cand, cand_s, nc, best, best_s)
            if best == j:
                u = math.sqrt(best_s * g_hi)
        li[a] = down32(math.sqrt(s_a * g_lo))
        if nc > 1:
            best, s_new = exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s)
            upper[i] = math.sqrt(s_new * g_hi) * UP
        else:
            upper[i] = u * UP
        if defer:
            prev[t] = a
        if best != a:
            n_changed += 1
            labels[i] = best
            if defer:
                xx[t] = sqnorm(x)
            else:
                move_vote(x, sqnorm(x), weight_of(w, i), a, best, S, v, Q)
    return n_changed, n_dist


@numba.njit(cache=True, nogil=True)
def _reassign_rows(X, rows, C, g, labels, upper, lower, S, v, Q, w, s_assigned, known):
    """The kernel of :func:`reassign_rows` on one thread; ``known``: whether
    ``s_assigned`` is read."""
    no_prev = np.empty(0, dtype=np.int32)
    no_xx = np.empty(0, dtype=np.float64)
    return _reassign_range(
        X, rows, 0, rows.shape[0], C, g, labels, upper, lower, S, v, Q, w, s_assigned,
        known, no_prev, no_xx,
    )


@numba.njit(cache=True, nogil=True, parallel=True)
def _reassign_blocks(X, rows, C, g, labels, upper, lower, s_assigned, known, block):
    """Labels and bounds of :func:`reassign_rows`, one task per block of listed rows.

    Returns ``(prev, xx, n_distances)``: ``prev`` (m,) int32 the old labels, ``xx`` (m,)
    float64 ``||x||^2`` of the rows whose label changed; the votes are left to
    :func:`~nmbatch.engine.kernels.parallel.apply_moves`.
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
            X, rows, lo, hi, C, g, labels, upper, lower, no_S, no_v, no_Q, no_Q,
            s_assigned, known, prev, xx,
        )[1]
    return prev, xx, n_dist.sum()


def reassign_rows(
    X: np.ndarray,
    rows: np.ndarray,
    C: np.ndarray,
    *,
    labels: np.ndarray,
    upper_bounds: np.ndarray,
    lower_bounds: np.ndarray,
    S: np.ndarray,
    v: np.ndarray,
    Q: np.ndarray,
    assigned_sqdist: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> tuple[int, int]:
    """Pass 2 of a bounded revisit (nmbatch lines 14-21) on the listed rows, row by row.

    For each listed row: the exact distance to ``a(i)`` (from ``assigned_sqdist`` when
    given, after :func:`settle_assigned`; otherwise computed here, so the row is read
    once), a distance to every ``j`` whose bound does not exclude it (the bound tightened
    as nearer centroids are found), and the nearest decided exactly. ``S``, ``v`` and
    ``Q`` change only for samples whose label changed (one sample, one vote); ``sse``
    follows from them (``Q(j) - 2 c(j).S(j) + v(j) ||c(j)||^2``).

    X               : (n, d) float32   IN   samples (rows already in the batch)
    rows            : (m,) int64       IN   rows to revisit (bounds already updated)
    C               : (k, d) float32   IN   current centroids
    labels          : (n,) int32       INOUT  ``a(i)``
    upper_bounds    : (n,) float64     INOUT  ``u(i) >= ||x(i) - c(a(i))||``
    lower_bounds    : (n, k) float32   INOUT  ``l(i, j) <= ||x(i) - c(j)||``
    S, v, Q         : (k, d) float64, (k,) int64, (k,) float64   INOUT
    assigned_sqdist : (n,) float64 or None   IN   ``||x(i) - c(a(i))||^2`` of the listed
                      rows, as :func:`settle_assigned` leaves it
    weights         : (n,) float64 or None   IN   a row's vote counts its weight (None
                      or empty: 1)

    Returns ``(n_changed, n_distances)`` (distances computed here).
    """
    known = assigned_sqdist is not None
    s_a = assigned_sqdist if known else EMPTY_F64
    g = sqdist32_error(X.shape[1])
    w = EMPTY_F64 if weights is None else weights
    if not parallel_rows(rows.shape[0]):
        return _reassign_rows(
            X, rows, C, g, labels, upper_bounds, lower_bounds, S, v, Q, w, s_a, known
        )
    prev, xx, n_dist = _reassign_blocks(
        X, rows, C, g, labels, upper_bounds, lower_bounds, s_a, known, block_rows(rows.shape[0])
    )
    n_changed = apply_moves(X, rows, prev, labels[rows], S=S, v=v, Q=Q, sqnorms=xx,
                            weights=w)
    return n_changed, int(n_dist)
