"""Cluster swaps: a starving cluster leaves its place to split the cluster that gains most.

When the distribution moves under a sliding window, clusters of the old distribution keep
their centroids as long as a few old samples remain, while the new samples crowd into too
few clusters (two or more components under one centroid). Lloyd steps cannot leave such a
local minimum: the starving centroid never wins the new samples, and it empties only when
its last old sample leaves the window. A swap (the local-search move of Kanungo et al.,
2004, made exact and greedy) removes one centroid and adds one elsewhere when that lowers
the batch's energy, taking each sample's vote with it.

After the update (and the relocation of empty clusters), with every non-empty centroid at
its cluster's mean ``mu(j) = S(j)/v(j)``:

- the **merge cost** of clusters ``j`` and ``l`` is Ward's ``v(j) v(l) / (v(j) + v(l))
  ||mu(j) - mu(l)||^2``: exactly the rise of the energy when ``j``'s samples join ``l``
  and ``l``'s centroid moves to their common mean. The cheapest pair is taken (among
  the ``MERGE_CANDIDATES`` clusters with the fewest samples, each against every
  centroid), and the smaller of the two (ties: the lower index) leaves;
- the **split gain** of cluster ``m`` (the largest ``sse`` other than ``j`` and ``l``) is
  ``v1 v2 / (v1 + v2) ||mu1 - mu2||^2`` for a 2-means partition of its samples (seeded
  deterministically, a few Lloyd iterations on at most ``SPLIT_ROWS`` of them, then one
  exact pass over all): exactly the fall of the energy when the two parts get centroids at
  their means.

When the gain exceeds the cost, ``j``'s samples join ``l`` and the second part of ``m``
becomes cluster ``j``: every moved vote leaves ``S``, ``v``, ``Q`` of its cluster and
enters those of its new one, and the batch's energy (at the means) falls by the difference.
A swap is taken only when it lowers the energy, so swaps cannot cycle.

Under ``metric="cosine"`` every centroid is the direction of its sum, ``S(j)/||S(j)||``,
and a cluster's energy at it is ``Q(j) + v(j) - 2 ||S(j)||`` (``sum ||x - c||^2`` with
``||c|| = 1``; twice its cosine dissimilarities): the merge cost and the split gain are
then ``2 (||S1|| + ||S2|| - ||S1 + S2||)`` (``unit=True`` throughout; the 2-means split
takes the directions of its parts as centres). Bounds stay sound
as for a relocation (:mod:`.relocation`): a moved sample's upper bound becomes its exact
distance to its new cluster's previous centroid, group bounds take in the cluster it left,
per-centroid bounds are unchanged, and ``p`` of the three clusters becomes their whole move
since ``C_prev``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from nmbatch.engine.algorithms.growth import sized_to_k
from nmbatch.engine.algorithms.relocation import _LOWER_SAFETY, _SAFETY, refresh_moved

__all__ = [
    "SPLIT_ROWS",
    "Swap",
    "merge_costs",
    "partition",
    "split_cluster",
    "swap_clusters",
    "swap_wanted",
    "ward",
]

SPLIT_ROWS = 256
"""Most rows of the split cluster the 2-means seeding and iterations look at."""
ESTIMATE_MARGIN = 1.0
"""The exact split is computed only when the gain estimated on ``SPLIT_ROWS`` rows is at
least this fraction of the merge cost."""
SPLIT_ITERATIONS = 5
"""Lloyd iterations of the 2-means split on the rows looked at."""
MAX_SWAPS = 8
"""Most swaps one step makes (each on clusters the step's earlier swaps left alone)."""
MERGE_CANDIDATES = 64
"""Clusters (the smallest ``v``) whose merge cost is computed, against every centroid."""
_CHUNK = 16_384


class Swap(NamedTuple):
    """Cluster ``merged`` joined ``into`` (all its rows), then took the second part of
    ``split``; ``rows`` (int64): every row moved, those of ``merged`` first."""

    merged: int
    into: int
    split: int
    rows: np.ndarray


def swap_wanted(
    swap_clusters: bool | str, retention: str, *, n_clusters: int, batch_size: int
) -> bool:
    """``swap_clusters`` resolved. ``"auto"`` is True for the retentions that follow a
    moving stream (``window`` and ``age``) and when the first batch is sized to ``k``
    (:func:`.growth.sized_to_k`: ``k > 250`` with the default ``batch_size``), where tens
    of samples per cluster leave clusters starving next to crowded ones and the exact
    peers stop at fixed points above the swaps' (docs/bench/large-k/); False otherwise,
    which keeps the paper's algorithm at ``k = 50``."""
    if swap_clusters == "auto":
        return retention in ("window", "age") or sized_to_k(batch_size, n_clusters)
    return bool(swap_clusters)


def merge_costs(
    S: np.ndarray, v: np.ndarray, candidates: int = MERGE_CANDIDATES, *, unit: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ward's merge cost of the non-empty clusters with the smallest ``v``.

    Returns ``(j, l, cost)``: ``(c,)`` int64 clusters, their cheapest partners, and the
    costs ``v(j) v(l) / (v(j) + v(l)) ||mu(j) - mu(l)||^2`` (with ``unit``:
    ``2 (||S(j)|| + ||S(l)|| - ||S(j) + S(l)||)``) (float64, from a BLAS product: exact
    enough to choose, not to decide; see :func:`ward`).
    """
    table = _MergeTable(S, v, candidates, unit)
    return table.cheapest(np.ones(v.shape[0], dtype=bool), candidates)


class _MergeTable:
    """Ward's merge costs of the ``rows`` non-empty clusters with the smallest ``v`` (ties:
    the lower index) against every non-empty cluster, computed once for a step's swaps.

    A swap changes the sums of its three clusters only, and they take no further part in
    the step, so the costs between the clusters still free stay those of the table, and
    the ``c`` smallest free clusters are among the first ``c + 3 s`` rows after ``s``
    swaps. ``cand``: ``(r,)`` int64 clusters of the rows; ``live``: ``(n,)`` int64 the
    non-empty clusters (ascending); ``cost``: ``(r, n)`` float64, inf where a row meets
    its own cluster.
    """

    def __init__(self, S: np.ndarray, v: np.ndarray, rows: int, unit: bool = False) -> None:
        live = np.flatnonzero(v > 0)
        self.live = live
        self.cand = live[np.lexsort((live, v[live]))][:rows]
        if live.shape[0] < 3:
            self.cost = np.empty((0, live.shape[0]))
            return
        if unit:
            sc, sl = S[self.cand], S[live]
            nc, nl = (sc * sc).sum(1)[:, None], (sl * sl).sum(1)[None, :]
            joint = np.sqrt(np.maximum(nc + 2.0 * sc @ sl.T + nl, 0.0))
            self.cost = np.maximum(2.0 * (np.sqrt(nc) + np.sqrt(nl) - joint), 0.0)
        else:
            mu = S[live] / v[live, None]
            mc = S[self.cand] / v[self.cand, None]
            d2 = (mc * mc).sum(1)[:, None] - 2.0 * mc @ mu.T + (mu * mu).sum(1)[None, :]
            vc = v[self.cand].astype(np.float64)[:, None]
            vl = v[live].astype(np.float64)[None, :]
            self.cost = np.maximum(d2, 0.0) * (vc * vl / (vc + vl))
        self.cost[live[None, :] == self.cand[:, None]] = np.inf

    def cheapest(
        self, free: np.ndarray, candidates: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`merge_costs` over the ``free`` clusters (``(k,)`` bool): the first
        ``candidates`` free rows, each against the free clusters."""
        cols = free[self.live]
        if self.cost.shape[0] == 0 or int(cols.sum()) < 3:
            return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
        rows = np.flatnonzero(free[self.cand])[:candidates]
        cost = self.cost[rows][:, cols]
        best = np.argmin(cost, axis=1)  # ties: the lowest cluster
        return self.cand[rows], self.live[cols][best], cost[np.arange(rows.shape[0]), best]


def ward(S1: np.ndarray, v1: int, S2: np.ndarray, v2: int, unit: bool = False) -> float:
    """The energy two clusters (sums ``S1``, ``S2``, counts ``v1``, ``v2``) lose apart,
    each at its centroid, against together: ``v1 v2 / (v1 + v2) ||S1/v1 - S2/v2||^2``
    from explicit differences (float64); with ``unit`` (centroids ``S/||S||``),
    ``2 (||S1|| + ||S2|| - ||S1 + S2||)``, also from explicit differences, those of the
    directions: ``2 ||S1|| ||S2|| ||u1 - u2||^2 / (||S1|| + ||S2|| + ||S1 + S2||)`` with
    ``u = S/||S||`` (0 when a sum is 0)."""
    if unit:
        n1, n2 = float(np.sqrt(S1 @ S1)), float(np.sqrt(S2 @ S2))
        if n1 == 0.0 or n2 == 0.0:
            return 0.0
        joint = S1 + S2
        turn = S1 / n1 - S2 / n2
        return 2.0 * n1 * n2 * float(turn @ turn) / (n1 + n2 + float(np.sqrt(joint @ joint)))
    gap = S1 / v1 - S2 / v2
    return float(v1 * v2 / (v1 + v2) * (gap @ gap))


def split_cluster(
    data: np.ndarray, rows: np.ndarray, norms: np.ndarray, mean: np.ndarray,
    unit: bool = False,
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """Two centres that split ``data[rows]`` (``norms``: ``||x(i)||^2`` by row, float64;
    ``mean``: the rows' mean, float64) and the split's gain estimated on the rows looked
    at, scaled to all of them; None when they do not split. ``unit``: the centres are
    the directions of the parts' sums, the gain the cosine one (:func:`ward`).

    Seeds: the row farthest from the mean, then the row farthest from it, among at most
    ``SPLIT_ROWS`` evenly spaced rows; then ``SPLIT_ITERATIONS`` Lloyd iterations on those
    (float32 products: a heuristic; :func:`partition` and :func:`ward` decide exactly).
    """
    step = max(1, rows.shape[0] // SPLIT_ROWS)
    picked = rows[::step]
    sub = data[picked]
    sq = norms[picked]
    c0 = sub[np.argmax(sq - 2.0 * (sub @ mean.astype(np.float32)))].astype(np.float64)
    c1 = sub[np.argmax(sq - 2.0 * (sub @ c0.astype(np.float32)))].astype(np.float64)
    n = sub.shape[0]
    total = (np.ones(n, dtype=np.float32) @ sub).astype(np.float64)
    gain = 0.0
    for _ in range(SPLIT_ITERATIONS):
        second = _closer_to_second(sub, c0, c1)
        n2 = int(np.count_nonzero(second))
        if n2 == 0 or n2 == n:
            return None
        s2 = (second.astype(np.float32) @ sub).astype(np.float64)
        gain = ward(total - s2, n - n2, s2, n2, unit)
        c1 = _centre(s2, n2, unit)
        c0 = _centre(total - s2, n - n2, unit)
    return c0, c1, gain * rows.shape[0] / n


def _centre(s: np.ndarray, n: int, unit: bool) -> np.ndarray:
    """The centre of ``n`` rows summing to ``s`` (float64): their mean, or with ``unit``
    its direction (the mean itself when the rows cancel out)."""
    norm = float(np.sqrt(s @ s))
    return s / norm if unit and norm > 0.0 else s / n


def partition(data: np.ndarray, rows: np.ndarray, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """``(len(rows),)`` bool: the rows of ``data`` nearer ``c1`` than ``c0``."""
    out = np.empty(rows.shape[0], dtype=bool)
    for lo in range(0, rows.shape[0], _CHUNK):
        out[lo : lo + _CHUNK] = _closer_to_second(data[rows[lo : lo + _CHUNK]], c0, c1)
    return out


def _closer_to_second(X: np.ndarray, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
    """``(n,)`` bool: rows of ``X`` (float32) nearer ``c1`` than ``c0`` (float64)."""
    w = (c1 - c0).astype(np.float32)
    return X @ w > 0.5 * (c1 @ c1 - c0 @ c0)


def _row_norms(data: np.ndarray, rows: np.ndarray, norms: np.ndarray | None) -> np.ndarray:
    """``||x(i)||^2`` (float64) by row, of every row when ``norms`` is given (the cache),
    else of ``rows`` only, placed at their indices."""
    if norms is not None:
        return norms
    out = np.zeros(int(rows.max()) + 1 if rows.shape[0] else 0, dtype=np.float64)
    X = data[rows].astype(np.float64)
    out[rows] = np.einsum("ij,ij->i", X, X)
    return out


def _bound_moved(
    data: np.ndarray,
    rows: np.ndarray,
    old: int,
    new: int,
    C_prev: np.ndarray,
    upper: np.ndarray | None,
    group_lower: tuple[np.ndarray, np.ndarray] | None,
) -> None:
    """Bounds of ``rows`` moved from cluster ``old`` to ``new`` (module docstring)."""
    X = data[rows].astype(np.float64)
    if upper is not None:
        gap = X - C_prev[new].astype(np.float64)
        upper[rows] = np.sqrt(np.einsum("ij,ij->i", gap, gap)) * _SAFETY
    if group_lower is not None:
        lower, group_of = group_lower
        gap = X - C_prev[old].astype(np.float64)
        bound = (np.sqrt(np.einsum("ij,ij->i", gap, gap)) * _LOWER_SAFETY).astype(np.float32)
        g = int(group_of[old])
        lower[rows, g] = np.minimum(lower[rows, g], bound)


def _move(
    data: np.ndarray,
    rows: np.ndarray,
    old: int,
    new: int,
    *,
    labels: np.ndarray,
    norms: np.ndarray | None,
    S: np.ndarray,
    v: np.ndarray,
    Q: np.ndarray,
) -> None:
    """Move the votes of ``rows`` from cluster ``old`` to ``new``, exactly."""
    X = data[rows].astype(np.float64)
    dS = X.sum(axis=0)
    dQ = float(norms[rows].sum()) if norms is not None else float(np.einsum("ij,ij->", X, X))
    S[old] -= dS
    S[new] += dS
    Q[old] -= dQ
    Q[new] += dQ
    v[old] -= rows.shape[0]
    v[new] += rows.shape[0]
    labels[rows] = new


def swap_clusters(
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
    max_swaps: int = MAX_SWAPS,
    frozen: np.ndarray | None = None,
    unit: bool = False,
) -> list[Swap]:
    """Swaps on the batch ``[0, b)`` (module docstring), each on clusters no earlier swap
    of the call touched, until none lowers the energy or ``max_swaps``; returns them.
    ``frozen`` (``(k,)`` bool or None): clusters left out (those the step's relocation
    just gave a sample).

    Arguments as :func:`.relocation.relocate_empty` (``C`` the updated centroids, the
    means of the non-empty clusters, or with ``unit`` their directions; ``sse`` with the
    centroids ``C_prev``).
    """
    done: list[Swap] = []
    if sse is None:
        return done
    free = np.ones(v.shape[0], dtype=bool) if frozen is None else ~frozen
    table = _MergeTable(S, np.where(free, v, 0), MERGE_CANDIDATES + 3 * max_swaps, unit)
    while len(done) < max_swaps:
        swap = _one_swap(data, b, free, table, labels=labels, norms=norms, S=S, v=v, Q=Q,
                         C_prev=C_prev, upper=upper, group_lower=group_lower,
                         unit=unit)  # fmt: skip
        if swap is None:
            break
        done.append(swap)
        free[list(swap[:3])] = False
        refresh_moved(swap[:3], S=S, v=v, Q=Q, sse=sse, C=C, C_prev=C_prev, p=p, unit=unit)
    return done


def _one_swap(
    data: np.ndarray,
    b: int,
    free: np.ndarray,
    table: _MergeTable,
    *,
    labels: np.ndarray,
    norms: np.ndarray | None,
    S: np.ndarray,
    v: np.ndarray,
    Q: np.ndarray,
    C_prev: np.ndarray,
    upper: np.ndarray | None,
    group_lower: tuple[np.ndarray, np.ndarray] | None,
    unit: bool = False,
) -> Swap | None:
    """The swap of the ``free`` clusters that the module docstring describes, made; or
    None when it would not lower the energy; ``table``: the step's merge costs."""
    cand, partner, cost = table.cheapest(free, MERGE_CANDIDATES)
    if cand.shape[0] == 0:
        return None
    first = int(np.lexsort((cand, cost))[0])
    j, into = int(cand[first]), int(partner[first])
    if (v[into], into) < (v[j], j):  # the smaller of the pair leaves
        j, into = into, j
    big = np.flatnonzero(free & (v >= 2))
    big = big[(big != j) & (big != into)]
    if big.shape[0] == 0:
        return None
    # sse at the centroids from the sums (chooses m and bounds the split's gain; float64
    # cancellation at worst makes a poorer choice, never an inexact swap)
    norm2 = np.einsum("ij,ij->i", S[big], S[big])
    if unit:
        at_mean = np.maximum(Q[big] + v[big] - 2.0 * np.sqrt(norm2), 0.0)
    else:
        at_mean = np.maximum(Q[big] - norm2 / v[big], 0.0)
    pick = int(np.lexsort((big, -at_mean))[0])
    m = int(big[pick])
    merge = ward(S[j], int(v[j]), S[into], int(v[into]), unit)
    if not merge < at_mean[pick]:  # no split can gain more than the cluster's sse
        return None
    in_m = np.flatnonzero(labels[:b] == m)
    split = split_cluster(data, in_m, _row_norms(data, in_m, norms), S[m] / v[m], unit)
    if split is None or split[2] < ESTIMATE_MARGIN * merge:
        return None
    part2 = in_m[partition(data, in_m, split[0], split[1])]
    n2 = part2.shape[0]
    if n2 == 0 or n2 == in_m.shape[0]:
        return None
    S2 = data[part2].astype(np.float64).sum(axis=0)
    if not ward(S[m] - S2, int(v[m]) - n2, S2, n2, unit) > merge * (1.0 + 1e-9):
        return None
    in_j = np.flatnonzero(labels[:b] == j)
    votes = {"labels": labels, "norms": norms, "S": S, "v": v, "Q": Q}
    _bound_moved(data, in_j, j, into, C_prev, upper, group_lower)
    _move(data, in_j, j, into, **votes)
    S[j] = 0.0  # empty now: clear the rounding the subtraction left
    Q[j] = 0.0
    _bound_moved(data, part2, m, j, C_prev, upper, group_lower)
    _move(data, part2, m, j, **votes)
    return Swap(j, into, m, np.concatenate([in_j, part2]))
