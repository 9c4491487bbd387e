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
)

__all__ = ["bound_sweep", "reassign_rows", "settle_assigned"]


@numba.njit(cache=True, nogil=True)
def bound_sweep(p, labels, upper, lower):
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
    k = lower.shape[1]
    # p rounded up to float32, so that the float32 bound update stays below the truth:
    # fl(fl(l - p32) * (1 - 2^-23)) <= l - p for l - p > 0 (and a negative bound is valid).
    p32 = np.empty(k, dtype=np.float32)
    for j in range(k):
        p32[j] = np.float32(p[j] * UP32)
    down = np.float32(DOWN32)
    todo = np.empty(n, dtype=np.int64)
    n_todo = 0
    n_pairs = 0
    for i in range(n):
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
    return todo[:n_todo], n_pairs


@numba.njit(cache=True, nogil=True)
def settle_assigned(X, rows, C, g, labels, upper, lower, s_assigned):
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
    g_lo, g_hi = bound_factors(g)
    todo = np.empty(rows.shape[0], dtype=np.int64)
    n_todo = 0
    n_pairs = 0
    m = rows.shape[0]
    for t in range(m):
        if t + PREFETCH_AHEAD < m:
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
    return todo[:n_todo], n_pairs


@numba.njit(cache=True, nogil=True)
def _reassign_rows(X, rows, C, g, labels, upper, lower, S, v, Q, s_assigned, known):
    """The kernel of :func:`reassign_rows`; ``known``: whether ``s_assigned`` is read."""
    k = C.shape[0]
    g_lo, g_hi = bound_factors(g)
    cand = np.empty(k, dtype=np.int64)
    cand_s = np.empty(k, dtype=np.float64)
    open_j = np.empty(k, dtype=np.int64)
    n_changed = 0
    n_dist = 0
    m = rows.shape[0]
    for t in range(m):
        if t + PREFETCH_AHEAD < m:
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
        if best != a:
            n_changed += 1
            labels[i] = best
            move_vote(x, sqnorm(x), a, best, S, v, Q)
    return n_changed, n_dist


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

    Returns ``(n_changed, n_distances)`` (distances computed here).
    """
    known = assigned_sqdist is not None
    return _reassign_rows(
        X, rows, C, sqdist32_error(X.shape[1]), labels, upper_bounds, lower_bounds,
        S, v, Q, assigned_sqdist if known else EMPTY_F64, known,
    )
