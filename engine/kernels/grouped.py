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

The reassignment (pass 2b: :func:`reassign_grouped`, :func:`reassign_grouped_rows`,
:data:`LOCAL_DOWN`) lives in :mod:`.grouped_reassign`, the dense pass in
:mod:`.grouped_dense`; this module re-exports the former, so that the revisit's three
passes are imported from here.

Threads as in :mod:`.parallel`: each pass is a range kernel, run once over all rows on
one thread, or block by block by its parallel driver beside it (``sweep_blocks``,
``settle_blocks``, ``reassign_blocks``, ``dense_blocks``: votes recorded, then cast in
row order by ``apply_moves``): the same results, bit for bit, at any thread count.

Arrays: ``group_of`` ``(k,)`` int32 in ``[0, G)``; ``members`` ``(k,)`` int32, the
centroids ordered by group; ``starts`` ``(G + 1,)`` int64, group ``g`` is
``members[starts[g]:starts[g + 1]]``; ``sizes`` ``(G,)`` int64; ``lower`` ``(n, G)``
float32; the rest as in :mod:`.bounded`.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nmbatch.engine.kernels.bounded import _join_blocks, _rounded_moves
from nmbatch.engine.kernels.common import (
    DOWN32,
    PREFETCH_AHEAD,
    UP,
    UP32,
    bound_factors,
    list_row,
    prefetch_row,
    sqdist_safe,
)
from nmbatch.engine.kernels.grouped_reassign import (
    LOCAL_DOWN,
    reassign_grouped,
    reassign_grouped_rows,
)
from nmbatch.engine.kernels.parallel import (
    MIN_SWEEP_ROWS,
    block_rows,
    parallel_rows,
)

__all__ = [
    "LOCAL_DOWN",
    "group_drift",
    "group_open_pairs",
    "group_sweep",
    "reassign_grouped",
    "reassign_grouped_rows",
    "settle_assigned_grouped",
    "settle_blocks",
    "sweep_blocks",
]


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


@numba.njit(cache=True, nogil=True, parallel=True)
def sweep_blocks(p, pmax, group_of, sizes, labels, upper, lower, block):
    """:func:`group_sweep`, one task per block of ``block`` rows.

    Arguments and return value as :func:`group_sweep`; block : int > 0.
    """
    n = labels.shape[0]
    p32 = _rounded_moves(pmax)
    n_blocks = (n + block - 1) // block
    todo = np.empty(n, dtype=np.int64)
    listed = np.zeros(n_blocks, dtype=np.int64)
    pairs = np.zeros(n_blocks, dtype=np.int64)
    for bi in numba.prange(n_blocks):
        lo = bi * block
        hi = min(n, lo + block)
        listed[bi], pairs[bi] = _sweep_range(
            p, p32, group_of, sizes, labels, upper, lower, lo, hi, todo, lo
        )
    return todo[: _join_blocks(todo, listed, block)], pairs.sum()


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


@numba.njit(cache=True, nogil=True, parallel=True)
def settle_blocks(X, rows, C, g, group_of, sizes, labels, upper, lower, s_assigned, block):
    """:func:`settle_assigned_grouped`, one task per block of ``block`` listed rows.

    Arguments and return value as :func:`settle_assigned_grouped`.
    """
    m = rows.shape[0]
    n_blocks = (m + block - 1) // block
    todo = np.empty(m, dtype=np.int64)
    listed = np.zeros(n_blocks, dtype=np.int64)
    pairs = np.zeros(n_blocks, dtype=np.int64)
    for bi in numba.prange(n_blocks):
        lo = bi * block
        hi = min(m, lo + block)
        listed[bi], pairs[bi] = _settle_range(
            X, rows, lo, hi, C, g, group_of, sizes, labels, upper, lower, s_assigned, todo, lo
        )
    return todo[: _join_blocks(todo, listed, block)], pairs.sum()


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
        return settle_blocks(*args, block_rows(rows.shape[0]))
    return _settle_assigned_grouped(*args)
