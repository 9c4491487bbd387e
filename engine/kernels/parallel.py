"""Threads for the kernels, with results that do not depend on how many there are.

Every parallel kernel splits its rows into blocks (a block is one task of numba's
``prange``; :func:`block_rows` sizes them to the thread count, several per thread so that
threads finish together) and keeps each row's work independent of every other row's: a
row's label, bounds and distance depend only on the row and the centroids, so no result
depends on the split. Rows a kernel lists (the bound sweep's open rows) are gathered
block after block: in row order, however the rows were split. What
is shared, the per-cluster sums ``S``, ``v``, ``Q`` and ``sse``, is never accumulated by
the row tasks. They record each row's old and new label, and :func:`apply_moves` then
adds the votes in row order, exactly as the single-thread kernels add them as they go.
``S`` is split into one span of columns per thread (each of its entries still takes the
rows' values in row order) and ``v``, ``Q``, ``sse`` are summed by one thread: the same float64
additions in the same order, so labels, sums, bounds and centroids are bit-identical with
1, 2 or 64 threads, and to the single-thread kernels.

The single-thread kernels stay the path for one thread and for work too small to share
(:func:`parallel_rows`): a parallel launch costs some microseconds, a thread's wake-up
tens of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np

from nmbatch.engine.kernels.common import sqnorm

__all__ = [
    "BLOCKS_PER_THREAD",
    "MIN_PARALLEL_ROWS",
    "MIN_SWEEP_ROWS",
    "apply_moves",
    "big_enough",
    "block_rows",
    "every_parallel_path",
    "n_threads",
    "parallel_rows",
]

BLOCKS_PER_THREAD = 16  # tasks per thread of a parallel kernel (balance: rows differ in cost)
MIN_PARALLEL_ROWS = 64  # fewer rows run on one thread (a row: tens of distances)
MIN_SWEEP_ROWS = 4096  # rows of a bound sweep (a row: k bound updates) worth sharing
MIN_BLOCK_ROWS = 16
COLUMN_ALIGN = 16  # apply_moves splits S's columns at multiples of this (128 bytes)
MIN_PARALLEL_VALUES = 1 << 16  # fewer moved values (rows x d) are added by one thread


def n_threads() -> int:
    """numba's thread count for the calling thread (``numba.set_num_threads``)."""
    return numba.get_num_threads()


def parallel_rows(m: int, minimum: int = MIN_PARALLEL_ROWS) -> bool:
    """Whether ``m`` rows are worth a parallel kernel: more than one thread, ``minimum``
    rows (any number inside :func:`every_parallel_path`)."""
    return numba.get_num_threads() > 1 and big_enough(m, minimum)


def big_enough(size: int, minimum: int) -> bool:
    """``size >= minimum``, or True inside :func:`every_parallel_path`."""
    return _every_path or size >= minimum


_every_path = False


@contextmanager
def every_parallel_path() -> Iterator[None]:
    """Take every parallel path whatever the size of the work (with more than one thread).

    For the warm-up (``engine.warmup``): a small problem then compiles, or loads from
    numba's cache, the parallel kernels as well as the single-thread ones.
    """
    global _every_path
    before, _every_path = _every_path, True
    try:
        yield
    finally:
        _every_path = before




def block_rows(m: int, minimum: int = MIN_BLOCK_ROWS) -> int:
    """Rows per task for ``m`` rows: :data:`BLOCKS_PER_THREAD` tasks per thread, at least
    ``minimum`` rows each."""
    per = -(-m // (BLOCKS_PER_THREAD * numba.get_num_threads()))
    return max(minimum, per)


@numba.njit(cache=True, nogil=True)
def _scalar_votes(X, rows, prev, new, xx, fill_xx, old_d2, new_d2, with_sse, sse, v, Q, w):
    """The per-cluster scalars of :func:`apply_moves`, in row order; returns the moves.
    ``w``: (N,) float64 weight by row, or (0,): every weight 1.

    Returns ``moved`` (n_moved,) int64: the positions ``t`` whose row casts a vote for
    another cluster than before (or a first vote, ``prev[t] < 0``).
    """
    m = rows.shape[0]
    moved = np.empty(m, dtype=np.int64)
    n_moved = 0
    for t in range(m):
        a = prev[t]
        b = new[t]
        wi = w[rows[t]] if w.shape[0] > 0 else 1.0
        if with_sse:
            if a >= 0:
                sse[a] -= wi * old_d2[t]
            sse[b] += wi * new_d2[t]
        if a == b:
            continue
        if fill_xx:
            xx[t] = sqnorm(X[rows[t]])
        if a >= 0:
            v[a] -= wi
            Q[a] -= wi * xx[t]
        v[b] += wi
        Q[b] += wi * xx[t]
        moved[n_moved] = t
        n_moved += 1
    return moved[:n_moved]


@numba.njit(cache=True, nogil=True, parallel=True)
def _sum_moves_by_columns(X, rows, prev, new, moved, S, span, w):
    """``S`` of :func:`apply_moves`: one task per ``span`` columns, rows in order (each
    task reads its part of every moved row, a contiguous run of ``span`` values)."""
    d = S.shape[1]
    n_spans = (d + span - 1) // span
    for cb in numba.prange(n_spans):
        lo = cb * span
        hi = min(d, lo + span)
        for q in range(moved.shape[0]):
            t = moved[q]
            x = X[rows[t]]
            a = prev[t]
            b = new[t]
            wi = w[rows[t]] if w.shape[0] > 0 else 1.0
            if a >= 0:
                for c in range(lo, hi):
                    xt = wi * np.float64(x[c])
                    S[a, c] -= xt
                    S[b, c] += xt
            else:
                for c in range(lo, hi):
                    S[b, c] += wi * np.float64(x[c])


@numba.njit(cache=True, nogil=True)
def _sum_moves_serial(X, rows, prev, new, moved, S, w):
    """``S`` of :func:`apply_moves` on one thread (rows in order)."""
    d = S.shape[1]
    for q in range(moved.shape[0]):
        t = moved[q]
        x = X[rows[t]]
        a = prev[t]
        b = new[t]
        wi = w[rows[t]] if w.shape[0] > 0 else 1.0
        if a >= 0:
            for c in range(d):
                xt = wi * np.float64(x[c])
                S[a, c] -= xt
                S[b, c] += xt
        else:
            for c in range(d):
                S[b, c] += wi * np.float64(x[c])


def apply_moves(
    X: np.ndarray,
    rows: np.ndarray,
    prev: np.ndarray,
    new: np.ndarray,
    *,
    S: np.ndarray,
    v: np.ndarray,
    Q: np.ndarray,
    sqnorms: np.ndarray | None = None,
    sse: np.ndarray | None = None,
    old_dist2: np.ndarray | None = None,
    new_dist2: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> int:
    """Cast the votes a parallel kernel recorded, in row order (one sample, one vote).

    For each position ``t`` with ``prev[t] != new[t]``: row ``rows[t]`` leaves cluster
    ``prev[t]`` (unless ``prev[t] < 0``: a first vote) and joins ``new[t]``: ``S``, ``v``
    and ``Q`` change as :func:`~nmbatch.engine.kernels.common.move_vote` and
    :func:`~nmbatch.engine.kernels.common.add_vote` change them. With ``sse``: for every
    ``t``, ``sse[prev[t]] -= old_dist2[t]`` (when ``prev[t] >= 0``) and ``sse[new[t]] +=
    new_dist2[t]``, interleaved in row order as the dense kernel does.

    X        : (N, d) float32   IN
    rows     : (m,) int64       IN   the rows, in the order the single-thread kernel reads them
    prev     : (m,) int32       IN   old labels (``-1``: none)
    new      : (m,) int32       IN   new labels
    S, v, Q  : (k, d) float64, (k,) int64, (k,) float64   INOUT
    sqnorms  : (m,) float64 or None   ``||X[rows[t]]||^2`` (read where the label changed);
               None: computed for the moves
    sse, old_dist2, new_dist2 : (k,), (m,), (m,) float64 or None   INOUT, IN, IN
    weights  : (N,) float64 or None   the weight of each row of ``X``: its vote, and its
               ``d^2`` in ``sse``, count that many times (None or empty: weight 1)

    Returns the number of positions whose label changed from one cluster to another.
    """
    fill = sqnorms is None
    xx = np.empty(rows.shape[0], dtype=np.float64) if fill else sqnorms
    with_sse = sse is not None
    empty = np.empty(0, dtype=np.float64)
    w = empty if weights is None else weights
    moved = _scalar_votes(
        X, rows, prev, new, xx, fill, old_dist2 if with_sse else empty,
        new_dist2 if with_sse else empty, with_sse, sse if with_sse else empty, v, Q, w,
    )  # fmt: skip
    d = S.shape[1]
    threads = n_threads()
    wide = d >= 2 * COLUMN_ALIGN and moved.shape[0] * d >= MIN_PARALLEL_VALUES
    if parallel_rows(2) and (wide or _every_path):
        span = -(-d // threads)
        span = -(-span // COLUMN_ALIGN) * COLUMN_ALIGN
        _sum_moves_by_columns(X, rows, prev, new, moved, S, span, w)
    else:
        _sum_moves_serial(X, rows, prev, new, moved, S, w)
    return int(np.count_nonzero(prev[moved] >= 0))
