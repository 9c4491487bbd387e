"""The parallel drivers of the group-bound kernels (:mod:`.grouped`), one task per block.

Each driver runs a range kernel of :mod:`.grouped` on blocks of rows under numba's
``prange``, as the drivers of :mod:`.bounded` and :mod:`.dense` do (:mod:`.parallel`
explains why the results do not depend on the thread count): a row's label, bounds and
distances depend only on the row and the centroids; the rows a pass lists are gathered
block after block, in row order; the votes (``S``, ``v``, ``Q``, ``sse``) are not cast
here but recorded (old label, ``||x||^2``, old ``d(i)^2``) for
:func:`~nmbatch.engine.kernels.parallel.apply_moves`, which casts them in row order.

The dispatchers of :mod:`.grouped` (``group_sweep``, ``settle_assigned_grouped``,
``reassign_grouped_rows``, ``assign_dense_grouped``) call these drivers when
:func:`~nmbatch.engine.kernels.parallel.parallel_rows` holds, and import this module only
then (it imports the range kernels from :mod:`.grouped`).
"""

from __future__ import annotations

import numba
import numpy as np

from nmbatch.engine.kernels.bounded import _join_blocks, _rounded_moves
from nmbatch.engine.kernels.grouped import (
    _reassign_range,
    _settle_range,
    _sweep_range,
)
from nmbatch.engine.kernels.grouped_dense import _dense_range

__all__ = ["dense_blocks", "reassign_blocks", "settle_blocks", "sweep_blocks"]


@numba.njit(cache=True, nogil=True, parallel=True)
def sweep_blocks(p, pmax, group_of, sizes, labels, upper, lower, block):
    """:func:`.grouped.group_sweep`, one task per block of ``block`` rows.

    Arguments and return value as :func:`.grouped.group_sweep`; block : int > 0.
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


@numba.njit(cache=True, nogil=True, parallel=True)
def settle_blocks(X, rows, C, g, group_of, sizes, labels, upper, lower, s_assigned, block):
    """:func:`.grouped.settle_assigned_grouped`, one task per block of ``block`` listed rows.

    Arguments and return value as :func:`.grouped.settle_assigned_grouped`.
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


@numba.njit(cache=True, nogil=True, parallel=True)
def reassign_blocks(
    X, rows, C, g, group_of, members, starts, p, pmax, labels, upper, lower, s_assigned,
    known, block,
):  # fmt: skip
    """Labels and bounds of :func:`.grouped.reassign_grouped`, one task per block of
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
            no_S, no_v, no_Q, s_assigned, known, prev, xx,
        )[1]  # fmt: skip
    return prev, xx, n_dist.sum()


@numba.njit(cache=True, nogil=True, parallel=True)
def dense_blocks(
    X, rows, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower, upper,
    group_of, prev, old_d2, block,
):  # fmt: skip
    """Labels, distances and group bounds of :func:`.grouped_dense.assign_dense_grouped`, one
    task per block of ``block`` rows; returns ``n_changed``.

    The votes are left in ``prev`` (m,) int32 and ``old_d2`` (m,) float64 (OUT, as
    ``.grouped_dense._dense_range`` writes them); the other arguments as
    ``.grouped_dense._assign_dense_grouped``.
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
            lower, upper, group_of, no_S, no_v, no_f, no_f, prev, old_d2,
        )  # fmt: skip
    return changed.sum()
