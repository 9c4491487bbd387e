"""Empty clusters relocated: a centroid with no sample takes a sample far from every centroid.

A cluster that loses all its samples keeps its centroid where it was (``c(j) = S(j)/v(j)``
is undefined), and an old centroid far from the data may never win a sample again: with
many clusters (``k`` in the thousands, a first batch of a few samples per cluster) or
after a stream moves (a window whose old samples all left), the model then keeps dead
clusters and stops above what Lloyd reaches from a good start. After the update, each
empty cluster takes, in turn, the batch sample farthest from every centroid (its own,
and the samples relocated before it: farthest-point order, as k-means++'s greedy maximin
spreads its seeds) whose cluster keeps at least one other sample; ties to the lowest
row. With the distance to its own centroid alone (scikit-learn's rule for Lloyd)
several empty clusters land in one region: after a stream's abrupt change, pairs of new
clusters then stay merged under one centroid.

The sample's vote moves exactly, as in a reassignment: out of ``S``, ``v``, ``Q`` of
its cluster, into those of the empty one, whose centroid becomes the sample itself (under
``metric="cosine"``, the sample normalised: ``S(j)/||S(j)||`` as every centroid, by
:func:`~nmbatch.engine.kernels.update.centroid_of`);
``p`` of both clusters becomes their whole move since the centroids the bounds refer to
(``C_prev``), and their ``sse`` is recomputed from the sums under those centroids, as
the update computes it. Bounds stay sound: the moved sample's upper bound becomes its
distance to its new cluster's previous centroid (as every upper bound refers to the
centroids before the update), and every bound is corrected by ``p`` at the next bound
sweep, as for any centroid move. Group bounds (:mod:`.bounds`) exclude the sample's own
centroid: the group of the cluster it leaves takes in its distance to that cluster's
previous centroid (rounded down).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from nmbatch.engine.kernels.exact import closer_to, own_sqdist
from nmbatch.engine.kernels.update import centroid_of

__all__ = ["farthest_first", "refresh_moved", "relocate_empty"]

MAXIMIN_WORK = 2e9
"""Most coordinate differences the farthest-point choice may compute (empty clusters x
batch rows x d); beyond it the samples are taken in one order of farthest first."""
_SAFETY = 1.0 + 1e-9  # p rounded up, as the centroid update rounds it
# A float64 distance times this, rounded to float32, is below the true distance.
_LOWER_SAFETY = (1.0 - 1e-9) * (1.0 - 2.0**-22)


def _next_row(
    dist2: np.ndarray, labels: np.ndarray, v: np.ndarray, order, maximin: bool,
    weights: np.ndarray,
) -> int:
    """The next sample to move: the largest ``dist2`` (ties: lowest row) with a vote
    (weight > 0) whose cluster keeps some (``v(a) - w > 0``; unweighted, ``v(a) >= 2``);
    -1 when none is off its centroid."""
    while True:
        row = int(np.argmax(dist2)) if maximin else next(order, -1)
        if row < 0 or dist2[row] <= 0.0:
            return -1
        w = weights[row] if weights.shape[0] else 1
        if w > 0 and v[labels[row]] - w > 0:
            return row
        if maximin:
            dist2[row] = -1.0  # its cluster cannot spare it, now or later in this call


def farthest_first(dist2: np.ndarray, wanted: int) -> np.ndarray:
    """Rows by decreasing ``dist2`` (ties: lowest row first), at least the ``wanted``
    largest (all of them when that is most)."""
    n = dist2.shape[0]
    if 4 * wanted + 64 < n:
        top = np.argpartition(-dist2, 4 * wanted + 64)[: 4 * wanted + 64]
    else:
        top = np.arange(n)
    return top[np.lexsort((top, -dist2[top]))]


def relocate_empty(
    data: np.ndarray,
    b: int,
    *,
    labels: np.ndarray,
    norms: np.ndarray | None,
    S: np.ndarray,
    v: np.ndarray,
    Q: np.ndarray,
    sse: np.ndarray | None,
    C: np.ndarray,
    C_prev: np.ndarray,
    p: np.ndarray,
    upper: np.ndarray | None = None,
    group_lower: tuple[np.ndarray, np.ndarray] | None = None,
    unit: bool = False,
    weights: np.ndarray | None = None,
) -> int:
    """Give each empty cluster the farthest sample of the batch ``[0, b)``; returns how
    many clusters got one (fewer than the empty ones when too few clusters can spare a
    sample, or every sample sits on its centroid).

    data   : (>= b, d) float32  IN     the store's rows
    labels : (>= b,) int32      INOUT  ``a(i)``
    norms  : (>= b,) float64 or None   IN  ``||x(i)||^2`` as the votes added them to ``Q``
             (None: computed from the row, for an algorithm that rebuilds ``Q`` each step)
    S, v, Q: (k, d) float64, (k,) int64, (k,) float64   INOUT
    sse    : (k,) float64 or None   INOUT  recomputed for the clusters that changed
    C      : (k, d) float32     INOUT  the updated centroids
    C_prev : (k, d) float32     IN     the centroids before the update
    p      : (k,) float64       INOUT  distance each centroid moved from ``C_prev``
    upper  : (>= b,) float64 or None   INOUT  ``u(i)``
    group_lower : ``(lower (>= b, G) float32 INOUT, group_of (k,) int32)`` or None: group
             bounds, which bound the distances to every centroid of a group but ``a(i)``
    unit   : bool   centroids ``S(j)/||S(j)||`` (``metric="cosine"``), else ``S(j)/v(j)``
    weights: (>= b,) float64 or None   the rows' weights (None or empty: 1): a sample's
             whole vote moves, ``w x``, ``w`` and ``w ||x||^2``; a weight-0 sample is
             never taken (it would leave the cluster empty)
    """
    weights = np.empty(0) if weights is None else weights
    empty = np.flatnonzero(v == 0)
    if not empty.shape[0] or b == 0:
        return 0
    dist2 = own_sqdist(data, b, labels, C)
    maximin = empty.shape[0] * b * data.shape[1] <= MAXIMIN_WORK
    order = iter(()) if maximin else iter(farthest_first(dist2, b))
    moved = 0
    changed: set[int] = set()
    while moved < empty.shape[0]:
        row = _next_row(dist2, labels, v, order, maximin, weights)
        if row < 0:
            break
        a = int(labels[row])
        j = int(empty[moved])
        x = data[row].astype(np.float64)
        xx = float(x @ x) if norms is None else norms[row]
        if weights.shape[0]:
            w = float(weights[row])
            S[a] -= w * x
            v[a] -= w
            Q[a] -= w * xx
            S[j] += w * x
            v[j] += w
            Q[j] += w * xx
        else:
            S[a] -= x
            v[a] -= 1
            Q[a] -= xx
            S[j] += x
            v[j] += 1
            Q[j] += xx
        labels[row] = j
        if upper is not None:  # as every u(i): a bound on the distance to C_prev(a(i))
            gap = x - C_prev[j].astype(np.float64)
            upper[row] = float(np.sqrt(gap @ gap)) * _SAFETY
        if group_lower is not None:  # the group of a now bounds c(a) too
            lower, group_of = group_lower
            gap = x - C_prev[a].astype(np.float64)
            ga = int(group_of[a])
            bound = np.float32(float(np.sqrt(gap @ gap)) * _LOWER_SAFETY)
            lower[row, ga] = min(lower[row, ga], bound)
        changed |= {a, j}
        moved += 1
        dist2[row] = 0.0
        if maximin:  # the next choice sees the sample as a centroid already
            closer_to(dist2, data, b, x)
    refresh_moved(sorted(changed), S=S, v=v, Q=Q, sse=sse, C=C, C_prev=C_prev, p=p,
                  unit=unit)
    return moved


def refresh_moved(clusters: Iterable[int], *, S: np.ndarray, v: np.ndarray, Q: np.ndarray,
                  sse: np.ndarray | None, C: np.ndarray, C_prev: np.ndarray,
                  p: np.ndarray, unit: bool = False) -> None:  # fmt: skip
    """After votes moved between ``clusters`` (iterable of ints): each one's centroid is
    derived from its sums again where they give one (:func:`~nmbatch.engine.kernels.
    update.centroid_of`: its mean, or with ``unit`` its sum's direction), ``p`` its whole
    move since ``C_prev`` (rounded up), and ``sse`` (if given) its sum under ``C_prev``,
    from the sums."""
    for c in clusters:
        centroid_of(S, v, c, unit, C[c])
        step = C[c].astype(np.float64) - C_prev[c].astype(np.float64)
        p[c] = float(np.sqrt(step @ step)) * _SAFETY
        if sse is not None:
            old = C_prev[c].astype(np.float64)
            sse[c] = max(Q[c] - 2.0 * (old @ S[c]) + v[c] * (old @ old), 0.0)
