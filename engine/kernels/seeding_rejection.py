"""The kernels of k-means++ by rejection: draws against pending centroids, one update.

:mod:`nmbatch.engine.seeding.rejection` keeps ``D_a(i)^2``, each row's squared distance
to the centroids chosen up to the last update ("applied"), and a short list of centroids
chosen since ("pending"). :func:`propose` draws rows with probability
``w(i) D_a(i)^2 / phi_a`` and accepts a draw with probability ``D(i)^2 / D_a(i)^2``,
``D(i)^2`` the distance to every chosen centroid (the pending ones computed here, from
the differences, in float64). :func:`apply_pending` then lowers ``D_a`` to the pending
centroids from one BLAS product, row by row (rows are independent: the result does not
depend on the thread count).

Every row is centred (the caller subtracts the rows' mean), so the product's
``||x||^2 - 2 x.c + ||c||^2`` loses little to cancellation; where it is small next to
``||x||^2 + ||c||^2`` (a row at or near a centroid, a duplicate of one) the distance is
taken again from the differences, so a chosen row and its duplicates get exactly 0 and
are never drawn again.
"""

from __future__ import annotations

import numba
import numpy as np

from nmbatch.engine.kernels.parallel import parallel_rows

__all__ = ["RECOMPUTE_BELOW", "apply_pending", "propose", "row_sqdist64"]

# A product distance below this share of ||x||^2 + ||c||^2 is taken from the differences.
RECOMPUTE_BELOW = 1e-3


@numba.njit(cache=True, nogil=True)
def row_sqdist64(X, i, p, bound):
    """``sum((X[i] - X[p])**2)`` in float64, in column order; stops early once it
    reaches ``bound`` (then returns a value ``>= bound``)."""
    s = 0.0
    for c in range(X.shape[1]):
        diff = np.float64(X[i, c]) - np.float64(X[p, c])
        s += diff * diff
        if s >= bound:
            return s
    return s


@numba.njit(cache=True, nogil=True)
def _propose(X, cum, Da, pending, n_pending, max_pending, u):
    m = cum.shape[0]
    total = cum[m - 1]
    rejected = 0
    t = 0
    while t < u.shape[0] and n_pending < max_pending and rejected <= 4 + n_pending:
        target = u[t, 0] * total
        i = np.searchsorted(cum, target, side="right")
        if i >= m:  # rounding at the top: the last row of mass
            i = m - 1
            while i > 0 and not Da[i] > 0.0:
                i -= 1
        d_a = Da[i]
        dn = d_a
        for j in range(n_pending):
            s = row_sqdist64(X, i, pending[j], dn)
            if s < dn:
                dn = s
        if u[t, 1] * d_a < dn:
            pending[n_pending] = i
            n_pending += 1
        else:
            rejected += 1
        t += 1
    return n_pending, t


def propose(
    X: np.ndarray,
    cum: np.ndarray,
    Da: np.ndarray,
    pending: np.ndarray,
    n_pending: int,
    max_pending: int,
    u: np.ndarray,
) -> tuple[int, int]:
    """Draw and accept rows until ``max_pending`` are pending or the rejections pass
    ``4 + n_pending`` (``D_a`` is then stale: time to apply).

    X         : (m, d) float32, centred   IN
    cum       : (m,) float64   IN   running sum of ``w(i) D_a(i)^2`` in row order
    Da        : (m,) float64   IN   ``D_a(i)^2``
    pending   : (>= max_pending,) int64  IN/OUT  rows chosen since the last update
    n_pending : int            how many of ``pending`` are set
    u         : (L, 2) float64 uniforms in [0, 1): ``u[t, 0]`` draws the row (inverse
                transform on ``cum``), ``u[t, 1]`` decides it; ``L >= 2 max_pending + 6``
                is always enough
    Returns ``(n_pending, draws used)``.
    """
    return _propose(X, cum, Da, pending, n_pending, max_pending, u)


@numba.njit(cache=True, nogil=True)
def _apply_row(X, P, xx, cc, rows, Da, i):
    best = Da[i]
    for j in range(rows.shape[0]):
        v = xx[i] - 2.0 * np.float64(P[i, j]) + cc[j]
        if v < RECOMPUTE_BELOW * (xx[i] + cc[j]):
            v = row_sqdist64(X, i, rows[j], best)
        if v < best:
            best = v if v > 0.0 else 0.0
    Da[i] = best


@numba.njit(cache=True, nogil=True)
def _apply_serial(X, P, xx, cc, rows, Da):
    for i in range(X.shape[0]):
        _apply_row(X, P, xx, cc, rows, Da, i)


@numba.njit(cache=True, nogil=True, parallel=True)
def _apply_parallel(X, P, xx, cc, rows, Da):
    for i in numba.prange(X.shape[0]):
        _apply_row(X, P, xx, cc, rows, Da, i)


def apply_pending(
    X: np.ndarray,
    P: np.ndarray,
    xx: np.ndarray,
    cc: np.ndarray,
    rows: np.ndarray,
    Da: np.ndarray,
) -> None:
    """``D_a(i)^2 = min(D_a(i)^2, ||x(i) - x(rows[j])||^2)`` over the pending rows.

    X    : (m, d) float32, centred   IN
    P    : (m, B) float32   IN   ``X @ X[rows].T`` (BLAS)
    xx   : (m,) float64     IN   ``||x(i)||^2``
    cc   : (B,) float64     IN   ``xx[rows]``
    rows : (B,) int64       IN   the pending rows
    Da   : (m,) float64     IN/OUT
    A distance is ``xx - 2 P + cc`` in float64, taken from the differences below
    :data:`RECOMPUTE_BELOW` of ``xx + cc``; rows are independent (any thread count, the
    same result).
    """
    if parallel_rows(X.shape[0]):
        _apply_parallel(X, P, xx, cc, rows, Da)
    else:
        _apply_serial(X, P, xx, cc, rows, Da)
