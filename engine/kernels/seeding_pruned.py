"""Greedy k-means++'s rounds with the triangle inequality: rows no trial can move are skipped.

Round ``c`` of greedy k-means++ (:mod:`nmbatch.engine.seeding.greedy`) asks, for every
row ``i`` and trial ``p(j)``, ``min(D(i)^2, ||x(i) - p(j)||^2)`` and the trials' costs
``sum_i w(i) min(...)``. Every row remembers its owner ``a(i)``, the chosen centroid at
``D(i)``. If ``||p(j) - c(a(i))|| >= 2 D(i)``, the triangle inequality gives
``||x(i) - p(j)|| >= ||p(j) - c(a(i))|| - D(i) >= D(i)``: the trial cannot move the row,
and its term is ``D(i)^2`` without a distance (Raff, "Exact acceleration of k-means++
and k-means‖", IJCAI 2021, uses the same test).

Per centroid ``a`` and round, :func:`owner_bounds` gives ``L(a)``, a lower bound of
``min_j ||p(j) - c(a)||``: first from the distances between chosen centroids,
``||p(j) - c(a)|| >= ||c(q(j)) - c(a)|| - D(p(j))`` (``q(j)`` the trial's owner), and
where that is too weak to skip the whole cluster (``< 2 R(a)``, ``R(a)`` an upper bound
of its members' ``D``), the exact distance. A row is skipped when
``L(a(i)) >= 2 D(i) f`` (``f`` a margin above float32 rounding, :func:`margin`).

**The same numbers as without the test.** A skipped row's term is the ``D(i)^2`` the
full pass would have taken as the min (its float32 distance is at least ``D(i)^2``
with the margin), and every block's sums are taken in row order as in
:func:`~nmbatch.engine.kernels.seeding.trial_costs`; a block where every row is skipped
takes the sum it already holds, which is the same sum of the same terms in the same
order. So the costs, and the rows chosen, are bit-identical to the full pass (tested),
and do not depend on the thread count.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nmbatch.engine.kernels.common import FASTMATH
from nmbatch.engine.kernels.parallel import parallel_rows
from nmbatch.engine.kernels.seeding import SEED_BLOCK, _row_sqdist32

__all__ = ["adopt_best", "centroid_distances", "margin", "owner_bounds", "pruned_trial_costs"]


def margin(d: int) -> float:
    """The factor ``f`` by which a bound must clear ``2 D(i)``: float32 squared distances
    of ``d`` terms are within a relative ``d 2^-24`` of exact; ``f`` is far above it."""
    return 1.0 + 1e-3 + 4.0 * d * 2.0**-24


@numba.njit(cache=True, nogil=True, parallel=True, fastmath=FASTMATH)
def _centroid_row(C, c, CC):
    # CC[c, a] = CC[a, c] = ||C[c] - C[a]|| (float32 from the differences), a < c.
    d = C.shape[1]
    x = C[c]
    for a in numba.prange(c):
        p = C[a]
        acc = np.float32(0.0)
        for q in range(d):
            diff = x[q] - p[q]
            acc += diff * diff
        r = np.float32(math.sqrt(np.float64(acc)))
        CC[c, a] = r
        CC[a, c] = r
    CC[c, c] = 0.0


def centroid_distances(C: np.ndarray, c: int, CC: np.ndarray) -> None:
    """Fill row and column ``c`` of ``CC`` with the distances of chosen centroid ``c``
    to centroids ``0..c-1``.

    C  : (k, d) float32   IN      the chosen centroids (rows ``0..c`` filled)
    CC : (k, k) float32   IN/OUT  symmetric; ``CC[a, b]`` for ``a, b <= c`` after the call
    """
    _centroid_row(C, c, CC)


@numba.njit(cache=True, nogil=True, parallel=True, fastmath=FASTMATH)
def _owner_bounds(C, c, CC, use_cc, R, P, q, r, f, L, n_exact):
    t = P.shape[0]
    d = C.shape[1]
    for a in numba.prange(c):
        need = 2.0 * R[a] * f
        low = np.inf
        exact = 0
        for j in range(t):
            # ||p(j) - c(a)|| >= ||c(q(j)) - c(a)|| - ||p(j) - c(q(j))||, shrunk by f.
            lb = np.float64(CC[q[j], a]) / f - r[j] * f if use_cc else -np.inf
            if lb < need:
                x = C[a]
                p = P[j]
                acc = np.float32(0.0)
                for u in range(d):
                    diff = x[u] - p[u]
                    acc += diff * diff
                lb = math.sqrt(np.float64(acc)) / f
                exact += 1
            if lb < low:
                low = lb
        L[a] = low
        n_exact[a] = exact


def owner_bounds(
    C: np.ndarray,
    c: int,
    CC: np.ndarray,
    R: np.ndarray,
    P: np.ndarray,
    q: np.ndarray,
    r: np.ndarray,
    f: float,
    L: np.ndarray,
    n_exact: np.ndarray,
) -> None:
    """``L(a)``, a lower bound of every trial's distance to chosen centroid ``a < c``.

    C  : (k, d) float32   IN   chosen centroids (rows ``0..c-1``)
    CC : (k, k) float32   IN   their distances (:func:`centroid_distances`); (1, 1): none
         kept (large ``k``), every bound is then an exact distance
    R  : (k,) float64     IN   ``R(a) >= D(i)`` for every row ``i`` owned by ``a``
    P  : (t, d) float32   IN   the trials
    q  : (t,) int64       IN   each trial's owner;  r : (t,) float64  its ``D``
    L  : (k,) float64     OUT  ``L[a]`` for ``a < c``
    n_exact : (k,) int64  OUT  exact distances computed per centroid (for the profile)
    """
    _owner_bounds(C, c, CC, CC.shape[0] > 1, R, P, q, r, f, L, n_exact)


@numba.njit(cache=True, nogil=True)
def _pruned_block(
    X, w, weighted, closest, owner, L, f, P, out, partial, block_sums, comp, bi, block
):
    n = X.shape[0]
    t = P.shape[0]
    lo = bi * block
    hi = min(n, lo + block)
    any_row = False
    for i in range(lo, hi):
        # Skip when L(a(i)) >= 2 D(i) f (D(i) = sqrt(closest[i])).
        keep = not (L[owner[i]] >= 2.0 * math.sqrt(closest[i]) * f)
        comp[i] = keep
        any_row = any_row or keep
    if not any_row:  # the sum of the same terms in the same order, as last round left it
        for j in range(t):
            partial[bi, j] = block_sums[bi]
        return 0
    s32 = np.empty(t, dtype=np.float32)
    for j in range(t):
        partial[bi, j] = 0.0
    computed = 0
    for i in range(lo, hi):
        ci = closest[i]
        wi = w[i] if weighted else 1.0
        if comp[i]:
            _row_sqdist32(X[i], P, s32)
            computed += 1
            for j in range(t):
                s = np.float64(s32[j])
                m = s if s < ci else ci
                out[j, i] = m
                partial[bi, j] += wi * m
        else:
            for j in range(t):
                partial[bi, j] += wi * ci
    return computed


@numba.njit(cache=True, nogil=True, parallel=True)
def _pruned_parallel(
    X, w, weighted, closest, owner, L, f, P, out, partial, block_sums, comp, block
):
    nb = partial.shape[0]
    counts = np.zeros(nb, dtype=np.int64)
    for bi in numba.prange(nb):
        counts[bi] = _pruned_block(
            X, w, weighted, closest, owner, L, f, P, out, partial, block_sums, comp, bi, block
        )
    return counts.sum()


@numba.njit(cache=True, nogil=True)
def _pruned_serial(X, w, weighted, closest, owner, L, f, P, out, partial, block_sums, comp, block):
    total = 0
    for bi in range(partial.shape[0]):
        total += _pruned_block(
            X, w, weighted, closest, owner, L, f, P, out, partial, block_sums, comp, bi, block
        )
    return total


def pruned_trial_costs(
    X: np.ndarray,
    closest: np.ndarray,
    owner: np.ndarray,
    L: np.ndarray,
    f: float,
    P: np.ndarray,
    out: np.ndarray,
    partial: np.ndarray,
    block_sums: np.ndarray,
    comp: np.ndarray,
    weights: np.ndarray | None = None,
) -> int:
    """:func:`~nmbatch.engine.kernels.seeding.trial_costs` for the rows a trial may move.

    X, closest, P, partial, weights : as ``trial_costs``
    owner      : (n,) int64    IN   ``a(i)``
    L          : (k,) float64  IN   :func:`owner_bounds`
    out        : (t, n) float64 OUT ``min(closest[i], ||x(i) - P[j]||^2)``, rows with
                 ``comp[i]`` only
    block_sums : (nb,) float64 IN   ``sum_i w(i) closest[i]`` per block, in row order
    comp       : (n,) bool     OUT  the rows computed
    Returns the number of rows computed. ``partial`` is bit-identical to ``trial_costs``'s.
    """
    weighted = weights is not None
    w = weights if weighted else np.empty(0, dtype=np.float64)
    args = (X, w, weighted, closest, owner, L, f, P, out, partial, block_sums, comp, SEED_BLOCK)
    if parallel_rows(partial.shape[0], 2):
        return int(_pruned_parallel(*args))
    return int(_pruned_serial(*args))


@numba.njit(cache=True, nogil=True, parallel=True)
def _adopt(out, best, c, closest, owner, comp, block):
    n = closest.shape[0]
    nb = (n + block - 1) // block
    radius = np.zeros(nb, dtype=np.float64)
    for bi in numba.prange(nb):
        lo = bi * block
        hi = min(n, lo + block)
        rmax = 0.0
        for i in range(lo, hi):
            if comp[i]:
                m = out[best, i]
                if m < closest[i]:
                    closest[i] = m
                    owner[i] = c
                    rr = math.sqrt(m)
                    if rr > rmax:
                        rmax = rr
        radius[bi] = rmax
    return radius.max()


def adopt_best(
    out: np.ndarray, best: int, c: int, closest: np.ndarray, owner: np.ndarray, comp: np.ndarray
) -> float:
    """Rows the chosen trial ``best`` moved take it as their owner ``c``.

    out : (t, n) float64 IN  (rows with ``comp``)   closest, owner : (n,) IN/OUT
    Returns ``R(c)``: the largest ``D(i)`` of the rows it took (0.0 if none).
    """
    return float(_adopt(out, best, c, closest, owner, comp, SEED_BLOCK))
