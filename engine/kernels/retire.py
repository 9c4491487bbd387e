"""Exact forgetting: the votes of retired samples taken back, and the store's compaction.

``locate_ids`` finds the row of each of a set of stream ids and ``compact_rows`` removes
rows by moving whole rows into their slots (``NestedBatchStore.retire``). A retired
sample of the prefix gives back exactly what it added when it was assigned (``remove_votes``):
``w(i) x(i)`` leaves ``S(a(i))``, ``w(i)`` leaves ``v(a(i))``, ``w(i) ||x(i)||^2`` leaves
``Q(a(i))``, and (for the algorithms that accumulate it) ``w(i) d(i)^2`` leaves
``sse(a(i))``, ``w(i)`` its weight (1 unweighted). Per-row
state is then moved by the store's permutation in numpy (``KMeansAlgorithm.retire``).
"""

from __future__ import annotations

import numba
import numpy as np

from nmbatch.engine.kernels.common import sqnorm, weight_of

__all__ = ["compact_rows", "locate_ids", "remove_votes"]


@numba.njit(cache=True, nogil=True)
def remove_votes(X, rows, labels, xx, dist2, S, v, Q, sse, w):
    """Take back the votes of ``rows`` (rows without a vote, ``labels < 0``, are skipped).

    X      : (N, d) float32   IN   sample buffer
    rows   : (m,) int64       IN   the rows that leave
    labels : (N,) int32       INOUT  set to ``-1`` for ``rows``
    xx     : (N,) float64 or (0,)   IN   ``||X[i]||^2`` as added to ``Q`` (the nested
             algorithms' cache); empty: recomputed with the same kernel the vote used
    dist2  : (N,) float64 or (0,)   IN   ``d(i)^2`` as added to ``sse``; empty: ``sse``
             is left to the caller (nmbatch computes it from the sums)
    S, v, Q, sse                    INOUT
    w      : (N,) float64 or (0,)   IN   the weight of each row (empty: every weight 1)

    Returns the number of votes taken back.
    """
    has_xx = xx.shape[0] > 0
    has_dist2 = dist2.shape[0] > 0
    d = X.shape[1]
    n_votes = 0
    for q in range(rows.shape[0]):
        i = rows[q]
        a = labels[i]
        if a < 0:
            continue
        x = X[i]
        wi = weight_of(w, i)
        v[a] -= wi
        Q[a] -= wi * (xx[i] if has_xx else sqnorm(x))
        for t in range(d):
            S[a, t] -= wi * np.float64(x[t])
        if has_dist2:
            sse[a] -= wi * dist2[i]
        labels[i] = -1
        n_votes += 1
    return n_votes


@numba.njit(cache=True, nogil=True)
def compact_rows(data, ids, rows, b, n):
    """Remove the rows ``rows`` of ``data[:n]`` by moving whole rows into their slots.

    With ``r_p`` of them in the prefix ``[0, b)``, the new prefix is ``[0, b - r_p)``: each
    retired row below ``b - r_p`` takes a retained row of ``[b - r_p, b)``. The new tail is
    ``[b - r_p, n - m)``: its free slots (``[b - r_p, b)`` and the retired tail rows below
    ``n - m``) take the retained tail rows at or above ``n - m``. Pairs are made in
    ascending order of both sides, prefix moves first. O(m d).

    data : (cap, d) float32  INOUT
    ids  : (cap,) int64      INOUT
    rows : (m,) int64        IN   sorted, distinct, in ``[0, n)``
    b, n : int               IN   prefix size and number of rows before the call

    Returns ``(prefix_from, prefix_to, tail_from, tail_to)``, int64 arrays of the moves.
    """
    m = rows.shape[0]
    r_p = np.searchsorted(rows, b)
    b2 = b - r_p
    n2 = n - m
    holes = np.searchsorted(rows, b2)  # retired rows below b2
    prefix_from = np.empty(holes, dtype=np.int64)
    q = holes
    t = 0
    for pos in range(b2, b):  # retained rows of [b2, b), ascending
        if q < r_p and rows[q] == pos:
            q += 1
            continue
        prefix_from[t] = pos
        t += 1
    prefix_to = rows[:holes].copy()
    for t in range(holes):
        data[prefix_to[t]] = data[prefix_from[t]]
        ids[prefix_to[t]] = ids[prefix_from[t]]
    # Free slots below n2, ascending: [b2, min(b, n2)), then the retired tail rows < n2.
    top = min(b, n2)
    n_low = np.searchsorted(rows[r_p:], n2)
    n_free = max(top - b2, 0) + n_low
    tail_to = np.empty(n_free, dtype=np.int64)
    for t in range(max(top - b2, 0)):
        tail_to[t] = b2 + t
    for t in range(n_low):
        tail_to[max(top - b2, 0) + t] = rows[r_p + t]
    # Retained tail rows at or above max(b, n2), ascending.
    tail_from = np.empty(n_free, dtype=np.int64)
    q = r_p + n_low
    t = 0
    for pos in range(max(b, n2), n):
        if q < m and rows[q] == pos:
            q += 1
            continue
        tail_from[t] = pos
        t += 1
    for t in range(n_free):
        data[tail_to[t]] = data[tail_from[t]]
        ids[tail_to[t]] = ids[tail_from[t]]
    return prefix_from, prefix_to, tail_from, tail_to


@numba.njit(cache=True, nogil=True)
def _id_table(query):
    """An open-addressing hash set of ``query`` (``(m,)`` int64, distinct, >= 0): slot ->
    index into ``query`` (-1 empty); size a power of two, at least ``4 m``, multiplicative
    hashing. Returns ``(table, mask, shift)``."""
    m = query.shape[0]
    bits = 1
    while (1 << bits) < 4 * m:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    table = np.full(1 << bits, -1, dtype=np.int64)
    for t in range(m):
        s = _slot(query[t], shift, mask)
        while table[s] != -1:
            s = (s + 1) & mask
        table[s] = t
    return table, mask, shift


@numba.njit(cache=True, nogil=True, inline="always")
def _slot(x, shift, mask):
    return np.int64((np.uint64(x) * np.uint64(0x9E3779B97F4A7C15)) >> shift) & mask


@numba.njit(cache=True, nogil=True, inline="always")
def _find(table, query, x, shift, mask):
    """Index into ``query`` of the id ``x``, or -1."""
    s = _slot(x, shift, mask)
    while True:
        t = table[s]
        if t == -1 or query[t] == x:
            return t
        s = (s + 1) & mask


@numba.njit(cache=True, nogil=True)
def locate_ids(stored, query, rows):
    """The row of each id of ``query``: ``rows[t]`` = the row ``r`` with ``stored[r] ==
    query[t]``, or -1 if none; returns how many were found.

    One pass over the stored ids with an open-addressing hash set of ``query``
    (:func:`_id_table`): O(N + m) whatever the spread of the ids. An id outside
    ``[min(query), max(query)]`` is passed over before hashing (two compares), so a few
    ids close together cost a fraction of a hashed pass.

    stored : (N,) int64  IN   ids of the stored rows (>= 0, distinct)
    query  : (m,) int64  IN   distinct ids (>= 0)
    rows   : (m,) int64  OUT
    """
    rows[:] = -1
    if query.shape[0] == 0:
        return 0
    table, mask, shift = _id_table(query)
    lo = query.min()
    hi = query.max()
    found = 0
    for r in range(stored.shape[0]):
        x = stored[r]
        if x < lo or x > hi:
            continue
        t = _find(table, query, x, shift, mask)
        if t >= 0:
            rows[t] = r
            found += 1
    return found
