"""The centroid update (nmbatch lines 31-35) and the per-cluster ``sse`` from the sums.

:func:`centroid_of` is the one place a centroid is derived from its sums: ``S(j)/v(j)``
(Euclidean), or ``S(j)/||S(j)||`` with unit centroids (``metric="cosine"``,
:mod:`nmbatch.engine.metric`). The update, the relocation of empty clusters and the
cluster swaps all call it.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from nmbatch.engine.kernels.parallel import parallel_rows

__all__ = ["centroid_of", "centroid_update"]

PARALLEL_UPDATE_VALUES = 1 << 15  # smaller S (k x d values) is updated on one thread


@numba.njit(cache=True, nogil=True)
def centroid_of(S, v, j, unit, out):
    """Write centroid ``j`` from its sums into ``out``; False (``out`` untouched) when the
    sums give none.

    ``c(j) = S(j)/v(j)`` (float64 division, rounded to float32) where ``v(j) > 0``; with
    ``unit``, ``c(j) = S(j)/||S(j)||`` (the norm summed sequentially in float64, each
    coordinate divided in float64 and rounded to float32) where ``v(j) > 0`` and
    ``S(j) != 0``: the direction of the sum, which is the direction of the mean.

    S   : (k, d) float64   IN
    v   : (k,) int64       IN
    j   : int              IN
    unit: bool             IN
    out : (d,) float32     OUT
    """
    if v[j] <= 0:
        return False
    d = S.shape[1]
    if unit:
        norm2 = 0.0
        for t in range(d):
            norm2 += S[j, t] * S[j, t]
        if norm2 == 0.0:  # the samples cancel out: no direction
            return False
        scale = math.sqrt(norm2)
    else:
        scale = np.float64(v[j])
    for t in range(d):
        out[t] = np.float32(S[j, t] / scale)
    return True


@numba.njit(cache=True, nogil=True)
def _update_cluster(j, S, v, Q, C_old, sse_from_sums, sse, C_new, p, unit):
    """Centroid ``j`` of :func:`centroid_update` (and its ``sse`` if ``sse_from_sums``)."""
    d = C_old.shape[1]
    cj = C_old[j]
    if sse_from_sums:
        cs = 0.0
        cc = 0.0
        for t in range(d):
            c64 = np.float64(cj[t])
            cs += c64 * S[j, t]
            cc += c64 * c64
        sse[j] = max(Q[j] - 2.0 * cs + v[j] * cc, 0.0)
    moved = 0.0
    if centroid_of(S, v, j, unit, C_new[j]):
        for t in range(d):
            diff = np.float64(C_new[j, t]) - np.float64(cj[t])
            moved += diff * diff
    else:
        for t in range(d):
            C_new[j, t] = cj[t]
    p[j] = math.sqrt(moved) * (1.0 + 1e-9)


@numba.njit(cache=True, nogil=True)
def _centroid_update(S, v, Q, C_old, sse_from_sums, sse, unit):
    """The kernel of :func:`centroid_update` on one thread; ``sse`` is written only if
    ``sse_from_sums``."""
    k, d = C_old.shape
    C_new = np.empty((k, d), dtype=np.float32)
    p = np.empty(k, dtype=np.float64)
    for j in range(k):
        _update_cluster(j, S, v, Q, C_old, sse_from_sums, sse, C_new, p, unit)
    return C_new, p


@numba.njit(cache=True, nogil=True, parallel=True)
def _centroid_update_clusters(S, v, Q, C_old, sse_from_sums, sse, unit):
    """:func:`centroid_update`, clusters shared between threads (each one's sums are its own)."""
    k, d = C_old.shape
    C_new = np.empty((k, d), dtype=np.float32)
    p = np.empty(k, dtype=np.float64)
    for j in numba.prange(k):
        _update_cluster(j, S, v, Q, C_old, sse_from_sums, sse, C_new, p, unit)
    return C_new, p


def centroid_update(
    S: np.ndarray,
    v: np.ndarray,
    Q: np.ndarray,
    C_old: np.ndarray,
    *,
    sse_out: np.ndarray | None = None,
    unit: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The centroid update in one pass over ``S``.

    ``c(j)`` from the sums by :func:`centroid_of` (``S(j)/v(j)``, or ``S(j)/||S(j)||``
    with ``unit``) where they give one, else ``c(j)`` stays; ``p(j) = ||c_new(j) -
    c_old(j)||`` between the float32 centroids (float64, times ``1 + 1e-9``). With
    ``sse_out``, ``sse(j) = max(Q(j) - 2 c_old(j).S(j) + v(j) ||c_old(j)||^2, 0)`` first:
    the sum of ``d(i)^2`` under the centroids in force during the iteration.

    S, v, Q : (k, d) float64, (k,) int64, (k,) float64   IN
    C_old   : (k, d) float32   IN
    sse_out : (k,) float64 or None   OUT  ``sse`` from the sums
    unit    : bool   IN  unit centroids (``metric="cosine"``)

    Returns ``(C_new (k, d) float32, p (k,) float64)``.
    """
    kernel = _centroid_update
    if parallel_rows(S.size, PARALLEL_UPDATE_VALUES):
        kernel = _centroid_update_clusters
    if sse_out is None:
        return kernel(S, v, Q, C_old, False, np.empty(0, dtype=np.float64), bool(unit))
    return kernel(S, v, Q, C_old, True, sse_out, bool(unit))
