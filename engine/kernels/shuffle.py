"""The store's shuffles: rows inserted into the uniformly shuffled tail (inside-out
Fisher-Yates), and the order that insertion gives a whole array loaded at once."""

from __future__ import annotations

import numba

__all__ = ["shuffle_insert", "shuffle_order"]


@numba.njit(cache=True, nogil=True)
def shuffle_insert(X, swap, n, data, ids, new_ids):
    """Inside-out Fisher-Yates insertion of new rows into the shuffled tail.

    Row ``t`` of ``X`` goes to position ``swap[t]`` (uniform in ``[b, n + t]``), and the row
    that was there moves to the end, ``n + t``.

    X       : (m, d) float32   IN
    swap    : (m,) int64       IN
    n       : int              IN   number of rows stored before the call
    data    : (cap, d) float32 INOUT
    ids     : (cap,) int64     INOUT  stream id of each stored row
    new_ids : (m,) int64       IN   stream ids of the rows of ``X``
    """
    for t in range(X.shape[0]):
        end = n + t
        r = swap[t]
        if r != end:
            data[end] = data[r]
            ids[end] = ids[r]
        data[r] = X[t]
        ids[r] = new_ids[t]


@numba.njit(cache=True, nogil=True)
def shuffle_order(swap, order):
    """The order :func:`shuffle_insert` gives rows ``0 .. m-1`` appended to an empty store.

    swap  : (m,) int64  IN   ``swap[t]`` uniform in ``[0, t]``
    order : (m,) int64  OUT  position ``r`` holds row ``order[r]``
    """
    for t in range(swap.shape[0]):
        r = swap[t]
        if r != t:
            order[t] = order[r]
        order[r] = t
