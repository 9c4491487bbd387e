"""Exact nearest-centroid lookup for arbitrary samples (prediction, ``/assign``, energies)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np

from nmbatch.engine.kernels import (
    gemm_error,
    nearest_dense,
    nearest_direct,
    sqdist32_error,
    sqnorms32,
)
from nmbatch.engine.metric import dissimilarity
from nmbatch.engine.state import SampleLookup

if TYPE_CHECKING:
    from nmbatch.engine.projection import Projection

__all__ = [
    "CHUNK_ROWS", "drift_ratio", "energy", "nearest", "nearest_one", "row_energies",
    "sample_lookup", "sqnorms",
]  # fmt: skip

CHUNK_ROWS = 4096


def sqnorms(A: np.ndarray) -> np.ndarray:
    """Row squared norms of ``A`` (``(n, d)``, any float dtype) accumulated in float64: ``(n,)``."""
    if A.dtype == np.float32 and A.ndim == 2:
        out = np.empty(A.shape[0], dtype=np.float64)
        sqnorms32(np.ascontiguousarray(A), out)
        return out
    A64 = np.asarray(A, dtype=np.float64)
    return np.einsum("ij,ij->i", A64, A64)


def nearest(
    X: np.ndarray,
    centroids: np.ndarray,
    *,
    n_threads: int | None = None,
    projection: Projection | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid of each row of ``X``, exactly (ties go to the lowest index).

    Parameters
    ----------
    X : (n, d) float32 array (other real dtypes are cast)
    centroids : (k, d) float32 array
    n_threads : int or None
        numba threads of the search for this call (the BLAS product keeps the process's
        setting); None: the calling thread's ``numba.get_num_threads()``. The answer does
        not depend on it.
    projection : a fitted model's :class:`~nmbatch.engine.projection.Projection`, or None
        Candidates from products in its subspace (at large ``k``, several times fewer
        multiply-adds); the same answer.

    Returns
    -------
    labels : (n,) int64
    sqdist : (n,) float64, ``||X[i] - centroids[labels[i]]||^2`` summed in float64
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    C = np.ascontiguousarray(centroids, dtype=np.float32)
    if X.ndim != 2 or C.ndim != 2 or X.shape[1] != C.shape[1]:
        raise ValueError(f"shape mismatch: X {X.shape}, centroids {C.shape}")
    if n_threads is not None:
        before = numba.get_num_threads()
        numba.set_num_threads(max(1, min(int(n_threads), numba.config.NUMBA_NUM_THREADS)))
        try:
            return nearest(X, C, projection=projection)
        finally:
            numba.set_num_threads(before)
    n = X.shape[0]
    labels = np.empty(n, dtype=np.int64)
    sqdist = np.empty(n, dtype=np.float64)
    cc = sqnorms(C)
    g = gemm_error(X.shape[1])
    Ct = np.ascontiguousarray(C.T)
    sub = None if projection is None else projection.centroids(C)
    for start in range(0, n, CHUNK_ROWS):
        Xc = X[start : start + CHUNK_ROWS]
        projected = None
        if sub is not None:
            dots = np.empty((Xc.shape[0], C.shape[0]), dtype=np.float32)
            rx = projection.products(Xc, np.arange(Xc.shape[0]), sub[0], dots)
            projected = (rx, sub[1], projection.slack)
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # huge: see gemm_estimate
                dots = Xc @ Ct
        nearest_dense(
            Xc, sqnorms(Xc), dots, C, cc, g,
            labels[start : start + CHUNK_ROWS], sqdist[start : start + CHUNK_ROWS],
            projected,
        )
    return labels, sqdist


def energy(X: np.ndarray, centroids: np.ndarray) -> float:
    """Mean squared distance of the rows of ``X`` to their nearest centroid (``E`` of the paper)."""
    return float(nearest(X, centroids)[1].mean())


def row_energies(X: np.ndarray, centroids: np.ndarray, metric: str = "euclidean") -> np.ndarray:
    """Each row's energy under ``centroids`` (``(k, d)`` float32): its dissimilarity to
    the nearest centroid, what a model of ``metric`` minimises (the squared distance, or
    ``1 - cos`` under ``"cosine"``, the rows then unit as the model stores them).
    ``X``: ``(n, d)`` float32; returns ``(n,)`` float64."""
    return dissimilarity(nearest(X, centroids)[1].astype(np.float64), metric)


def drift_ratio(energies: np.ndarray, reference: float | None) -> float | None:
    """The drift figure: the mean of ``energies`` (``(n,)`` float64, rows' energies from
    :func:`row_energies`) over ``reference``, the model's energy per retained sample
    (``ModelState.energy``). About 1 while the rows come from the distribution the model
    was fitted on (somewhat above when the clusters hold few samples each: the energy
    of the fitted samples is optimistic), well above when they come from elsewhere.
    None when there is no row or ``reference`` is not a positive number."""
    if energies.shape[0] == 0 or reference is None or not np.isfinite(reference):
        return None
    return float(energies.mean() / reference) if reference > 0 else None


def nearest_one(x: np.ndarray, centroids: np.ndarray) -> tuple[int, float]:
    """Nearest centroid of one sample, with the answer of :func:`nearest`, minus its overhead.

    For a single vector ``nearest`` pays for a BLAS call, a transposed copy of the
    centroids and several temporary arrays; this is one small kernel,
    :func:`~nmbatch.engine.kernels.lookup.nearest_direct` (``/assign`` of one vector).

    Parameters
    ----------
    x : (d,) or (1, d) float32 array (other real dtypes are cast)
    centroids : (k, d) float32 array, k >= 1

    Returns
    -------
    label : int
        Index of the nearest centroid; exact ties go to the lowest index.
    sqdist : float
        ``||x - centroids[label]||^2`` summed in float64 (the value ``nearest`` returns).
    """
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    C = np.ascontiguousarray(centroids, dtype=np.float32)
    if C.ndim != 2 or C.shape[0] == 0 or x.shape[0] != C.shape[1]:
        raise ValueError(f"shape mismatch: x {x.shape}, centroids {C.shape}")
    label, sqdist = nearest_direct(x, C, sqdist32_error(C.shape[1]))
    return int(label), float(sqdist)


def sample_lookup(
    found: np.ndarray, rows: np.ndarray, centroids: np.ndarray | None
) -> SampleLookup:
    """The :class:`~nmbatch.engine.state.SampleLookup` of stored samples: ``found`` ``(m,)``
    bool (which ids are stored), ``rows`` ``(found.sum(), d)`` float32 (theirs, in that
    order), ``centroids`` ``(k, d)`` float32 (None: the model has none yet). Labels and
    squared distances by :func:`nearest`, exactly; -1 and NaN where not found."""
    m = found.shape[0]
    labels = np.full(m, -1, dtype=np.int64)
    sqdist = np.full(m, np.nan, dtype=np.float64)
    if rows.shape[0] and centroids is not None:
        labels[found], sqdist[found] = nearest(rows, centroids)
    return SampleLookup(found, labels, sqdist)
