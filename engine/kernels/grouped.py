"""Group bounds (Yinyang-style; Hamerly's single bound is one group): the kernels.

The centroids are split into ``G`` groups (``group_of[j]``, fixed for a run). Each sample
keeps one float32 lower bound per group instead of one per centroid:

``lower[i, g] <= min { ||x(i) - c(j)|| : group_of[j] == g, j != a(i) }``

(``+inf``, stored as ``FLT_MAX``, for a group whose only member is ``a(i)``). A bound
excludes the sample's own centroid, as Hamerly's does: with ``G = 1`` it is Hamerly's
bound on the distance to the second-nearest centroid. Memory per sample: ``4 G`` bytes
instead of ``4 k``.

The passes mirror :mod:`.bounded`: :func:`group_sweep` subtracts from each group bound
the largest move in the group, ``pmax(g) = max p(j)``, adds ``p(a(i))`` to ``u(i)`` and
lists the rows some group leaves open (``lower[i, g] <= u(i)``);
:func:`settle_assigned_grouped` tightens ``u(i)`` to the exact distance to ``a(i)``;
:func:`reassign_grouped` measures the members of the open groups and moves the vote. In
an open group, member ``j`` is skipped when ``lower[i, g] + pmax(g) - p(j) > u(i)``
(Yinyang's local filter: before the sweep the bound was at least that plus ``p(j)``).
:func:`assign_dense_grouped` is ``assign_dense`` writing group bounds: new rows and
revisits that the bounds leave mostly open.

Threads as in :mod:`.parallel`: each pass is a range kernel here, run once over all rows
on one thread, or block by block by the parallel drivers of :mod:`.grouped_parallel`
(votes recorded, then cast in row order by ``apply_moves``): the same results, bit for
bit, at any thread count.

Arrays: ``group_of`` ``(k,)`` int32 in ``[0, G)``; ``members`` ``(k,)`` int32, the
centroids ordered by group; ``starts`` ``(G + 1,)`` int64, group ``g`` is
``members[starts[g]:starts[g + 1]]``; ``sizes`` ``(G,)`` int64; ``lower`` ``(n, G)``
float32; the rest as in :mod:`.bounded`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nmbatch.engine.kernels.bounded import _rounded_moves
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
    prefetch_row,
    push_candidate,
    sqdist32_error,
    sqdist_safe,
    sqnorm,
)
from nmbatch.engine.kernels.parallel import (
    MIN_SWEEP_ROWS,
    apply_moves,
    block_rows,
    parallel_rows,
)

__all__ = [
    "LOCAL_DOWN",
    "group_drift",
    "group_open_pairs",
    "group_sweep",
    "reassign_grouped",
    "settle_assigned_grouped",
]

LOCAL_DOWN = 1.0 - 2.0**-50
"""Factor that keeps ``lower + (pmax - p(j))``, two float64 additions of non-negative
terms, below its exact value."""


def group_drift(p: np.ndarray, group_of: np.ndarray, n_groups: int) -> np.ndarray:
    """``pmax(g) = max { p(j) : group_of[j] == g }`` (0 for an empty group): ``(G,)`` float64.

    p : (k,) float64, group_of : (k,) int32.
    """
    pmax = np.zeros(n_groups, dtype=np.float64)
    np.maximum.at(pmax, group_of, p)
    return pmax


@numba.njit(inline="always")
def group_open_pairs(lg, ga, u32, sizes):
    """The (row, centroid) pairs a row's group bounds leave open, ``a`` included.

    lg : (G,) float32 group bounds of the row; ``ga`` the group of its label; ``u32`` its
    upper bound rounded up to float32; sizes : (G,) int64. A group is open when
    ``lg[g] <= u32``; its members other than ``a`` are open. With no group open the label
    is settled (0).
    """
    n_groups = 0
    n_open = 0
    for g in range(lg.shape[0]):  # branch-free, vectorised
        is_open = np.int64(lg[g] <= u32)
        n_groups += is_open
        n_open += sizes[g] * is_open
    if n_groups == 0:
        return 0
    if lg[ga] <= u32:
        n_open -= 1  # a(i) is in its group but not bounded by it
    return n_open + 1


@numba.njit(cache=True, nogil=True)
def _sweep_range(p, p32, group_of, sizes, labels, upper, lower, lo, hi, todo, start):
    """:func:`group_sweep` over the rows ``[lo, hi)``, listing them from ``todo[start]``.

    p32 : (G,) float32   ``pmax`` rounded up (``bounded._rounded_moves``)

    Returns ``(listed, n_open)``: rows listed (in ``todo[start : start + listed]``) and
    their open pairs.
    """
    G = lower.shape[1]
    down = np.float32(DOWN32)
    n_todo = start
    n_pairs = 0
    for i in range(lo, hi):
        lg = lower[i]
        a = labels[i]
        ub = (upper[i] + p[a]) * UP
        ub32 = np.float32(ub * UP32)
        for g in range(G):  # branch-free, vectorised
            lg[g] = (lg[g] - p32[g]) * down
        upper[i] = ub
        pairs = group_open_pairs(lg, group_of[a], ub32, sizes)
        n_todo = list_row(todo, n_todo, i, pairs > 0)
        n_pairs += pairs
    return n_todo - start, n_pairs


@numba.njit(cache=True, nogil=True)
def _group_sweep(p, pmax, group_of, sizes, labels, upper, lower):
    """:func:`group_sweep` on one thread."""
    n = labels.shape[0]
    todo = np.empty(n, dtype=np.int64)
    n_todo, n_pairs = _sweep_range(
        p, _rounded_moves(pmax), group_of, sizes, labels, upper, lower, 0, n, todo, 0
    )
    return todo[:n_todo], n_pairs


def group_sweep(
    p: np.ndarray,
    pmax: np.ndarray,
    group_of: np.ndarray,
    sizes: np.ndarray,
    labels: np.ndarray,
    upper: np.ndarray,
    lower: np.ndarray,
) -> tuple[np.ndarray, int]:
    """Pass 1 of a grouped revisit: update every bound, list the rows left open.

    ``lower[i, g] -= pmax(g)`` (rounded safely, as :func:`.bounded.bound_sweep`) and
    ``u(i) += p(a(i))``; row ``i`` is listed unless ``u(i) < lower[i, g]`` for every
    ``g`` (then ``a(i)`` is still the unique nearest centroid).

    p        : (k,) float64    IN
    pmax     : (G,) float64    IN   :func:`group_drift` of ``p``
    group_of : (k,) int32      IN
    sizes    : (G,) int64      IN   members per group
    labels   : (n,) int32      IN
    upper    : (n,) float64    INOUT
    lower    : (n, G) float32  INOUT

    Returns ``(todo, n_open)``: the listed rows (increasing, int64) and the number of
    their (row, centroid) pairs the bounds leave open, ``a(i)`` included.
    """
    n = labels.shape[0]
    if parallel_rows(n, MIN_SWEEP_ROWS):
        from nmbatch.engine.kernels.grouped_parallel import sweep_blocks

        block = block_rows(n, MIN_SWEEP_ROWS // 4)
        return sweep_blocks(p, pmax, group_of, sizes, labels, upper, lower, block)
    return _group_sweep(p, pmax, group_of, sizes, labels, upper, lower)


@numba.njit(cache=True, nogil=True)
def _settle_range(
    X, rows, lo, hi, C, g, group_of, sizes, labels, upper, lower, s_assigned, todo, start
):
    """:func:`settle_assigned_grouped` over ``rows[lo:hi]``, listing from ``todo[start]``;
    returns ``(listed, n_open)``."""
    _, g_hi = bound_factors(g)
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
        pairs = group_open_pairs(lower[i], group_of[a], np.float32(u * UP32), sizes)
        n_todo = list_row(todo, n_todo, i, pairs > 0)
        n_pairs += pairs
    return n_todo - start, n_pairs


@numba.njit(cache=True, nogil=True)
def _settle_assigned_grouped(X, rows, C, g, group_of, sizes, labels, upper, lower, s_assigned):
    """:func:`settle_assigned_grouped` on one thread."""
    m = rows.shape[0]
    todo = np.empty(m, dtype=np.int64)
    n_todo, n_pairs = _settle_range(
        X, rows, 0, m, C, g, group_of, sizes, labels, upper, lower, s_assigned, todo, 0
    )
    return todo[:n_todo], n_pairs


def settle_assigned_grouped(
    X: np.ndarray,
    rows: np.ndarray,
    C: np.ndarray,
    g: float,
    group_of: np.ndarray,
    sizes: np.ndarray,
    labels: np.ndarray,
    upper: np.ndarray,
    lower: np.ndarray,
    s_assigned: np.ndarray,
) -> tuple[np.ndarray, int]:
    """Pass 2a of a grouped revisit: the exact distance to ``a(i)`` of the listed rows.

    ``s_assigned[i] = ||x(i) - c(a(i))||^2`` (float32-grade) and ``u(i)`` becomes tight;
    a row whose tight ``u(i)`` is below every group bound keeps its label and leaves the
    list. Arguments as :func:`group_sweep`, plus X : (n, d) float32, rows : (m,) int64,
    C : (k, d) float32, g = ``sqdist32_error(d)``, s_assigned : (n,) float64 OUT.

    Returns ``(todo, n_open)`` of the rows still open (a subsequence of ``rows``).
    """
    args = (X, rows, C, g, group_of, sizes, labels, upper, lower, s_assigned)
    if parallel_rows(rows.shape[0]):
        from nmbatch.engine.kernels.grouped_parallel import settle_blocks

        return settle_blocks(*args, block_rows(rows.shape[0]))
    return _settle_assigned_grouped(*args)


@numba.njit(cache=True, nogil=True)
def _reassign_range(
    X, rows, lo, hi, C, g, group_of, members, starts, p, pmax, labels, upper, lower, S, v,
    Q, s_assigned, known, prev, xx,
):  # fmt: skip
    """:func:`reassign_grouped` over ``rows[lo:hi]``; returns ``(n_changed, n_distances)``.

    ``prev``, ``xx`` (m,) int32, (m,) float64, or empty: when given, a row's old label
    goes to ``prev[t]`` (and, if it changed, ``||x||^2`` to ``xx[t]``) and its vote is
    left to :func:`~nmbatch.engine.kernels.parallel.apply_moves`; otherwise the vote
    moves here (``S``, ``v``, ``Q``).
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
                move_vote(x, sqnorm(x), a, best, S, v, Q)
    return n_changed, n_dist


@numba.njit(cache=True, nogil=True)
def reassign_grouped(
    X, rows, C, g, group_of, members, starts, p, pmax, labels, upper, lower, S, v, Q,
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
    p : (k,) float64, pmax : (G,) float64   IN   (as given to :func:`group_sweep`)
    s_assigned : (n,) float64 IN (``known``), known : bool; the rest as
    :func:`.bounded.reassign_rows`.

    Returns ``(n_changed, n_distances)``. :func:`reassign_grouped_rows` runs it, or its
    parallel driver on enough rows.
    """
    no_prev = np.empty(0, dtype=np.int32)
    no_xx = np.empty(0, dtype=np.float64)
    return _reassign_range(
        X, rows, 0, rows.shape[0], C, g, group_of, members, starts, p, pmax, labels, upper,
        lower, S, v, Q, s_assigned, known, no_prev, no_xx,
    )  # fmt: skip


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
) -> tuple[int, int]:
    """Keyword wrapper of :func:`reassign_grouped` (on one thread, or block by block with
    the votes cast afterwards in row order); returns ``(n_changed, n_distances)``."""
    known = assigned_sqdist is not None
    s_a = assigned_sqdist if known else EMPTY_F64
    args = (X, rows, C, sqdist32_error(X.shape[1]), group_of, members, starts, p, pmax,
            labels, upper_bounds, lower_bounds)  # fmt: skip
    if not parallel_rows(rows.shape[0]):
        n_changed, n_dist = reassign_grouped(*args, S, v, Q, s_a, known)
        return int(n_changed), int(n_dist)
    from nmbatch.engine.kernels.grouped_parallel import reassign_blocks

    prev, xx, n_dist = reassign_blocks(*args, s_a, known, block_rows(rows.shape[0]))
    n_changed = apply_moves(X, rows, prev, labels[rows], S=S, v=v, Q=Q, sqnorms=xx)
    return n_changed, int(n_dist)
