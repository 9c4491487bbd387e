"""The metric of a model: Euclidean k-means, or spherical k-means (``metric="cosine"``).

Spherical k-means clusters directions: a sample ``x`` counts as ``x / ||x||``. Under
``"cosine"`` the store keeps unit rows (:func:`unit_rows`, on ingestion: a zero row is
refused, naming its index), every centroid is the direction of its cluster's sum,
``c(j) = S(j)/||S(j)||`` (:func:`~nmbatch.engine.kernels.update.centroid_of`), and the
objective is the sum of cosine dissimilarities ``1 - cos(x(i), c(a(i)))``. For unit
vectors ``||x - c||^2 = 2 - 2 cos(x, c)``: the engine keeps working on Euclidean distances
(the nearest centroid is the most similar one; the bounds and the doubling test stay
those of the Euclidean algorithm, docs/design.md, "Spherical k-means"), and the
dissimilarity and the similarity are read off the squared distance
(:func:`dissimilarity`, :func:`similarity`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = [
    "METRICS",
    "UNIT_TOLERANCE",
    "ZeroRowError",
    "check_metric",
    "dissimilarity",
    "metric_rows",
    "similarity",
    "unit_rows",
]

METRICS = ("euclidean", "cosine")

UNIT_TOLERANCE = 2.0**-21
"""A row whose squared norm (summed in float64) is within this of 1 is unit already and
is kept as it is. Rounding a normalised row to float32 moves each coordinate by at most
``2^-24`` of itself, so its squared norm stays within ``2^-23 (1 + 2^-25)`` of 1 (plus the
float64 sum's error, below ``1e-10`` up to ``d = 10^6``): normalising is idempotent, and
rows that travel (a pickle, a snapshot, a second ingestion) come back bit for bit."""


class ZeroRowError(ValueError):
    """A zero row under ``metric="cosine"``: it has no direction. ``row`` is its index (the
    first one) in the array given; the message names it too."""

    def __init__(self, name: str, row: int) -> None:
        super().__init__(
            f"{name} row {row} is a zero vector: it has no direction, and metric='cosine' "
            "clusters directions"
        )
        self.row = row


def check_metric(metric: object) -> str:
    """``metric`` if it is one of :data:`METRICS`, else ``ValueError``."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    return str(metric)


@numba.njit(cache=True, nogil=True)
def _unit_rows(X, out, tolerance):
    """Write ``X[i] / ||X[i]||`` into ``out[i]``, or ``X[i]`` itself when its squared norm
    is within ``tolerance`` of 1; returns the first zero row (nothing written from it
    on), or -1.

    X   : (n, d) float32, C-contiguous   IN
    out : (n, d) float32                 OUT
    """
    n, d = X.shape
    for i in range(n):
        norm2 = 0.0
        for t in range(d):
            x = np.float64(X[i, t])
            norm2 += x * x
        if norm2 == 0.0:
            return i
        if abs(norm2 - 1.0) <= tolerance:
            for t in range(d):
                out[i, t] = X[i, t]
        else:
            scale = math.sqrt(norm2)
            for t in range(d):
                out[i, t] = np.float32(np.float64(X[i, t]) / scale)
    return -1


def unit_rows(X: np.ndarray, *, name: str = "X") -> np.ndarray:
    """The rows of ``X`` as unit vectors: a new ``(n, d)`` float32 array.

    Each row is divided by its norm (summed sequentially in float64; the quotient in
    float64, rounded to float32), except a row unit already (:data:`UNIT_TOLERANCE`),
    which is copied. A zero row has no direction: :class:`ZeroRowError` (a ``ValueError``)
    naming its index (the first one), and nothing is returned.

    X : (n, d) float32, finite (``as_float32_matrix``'s output)   IN
    """
    X = np.ascontiguousarray(X, dtype=np.float32)
    out = np.empty_like(X)
    zero = int(_unit_rows(X, out, UNIT_TOLERANCE))
    if zero >= 0:
        raise ZeroRowError(name, zero)
    return out


def metric_rows(X: np.ndarray, metric: str, *, name: str = "X") -> np.ndarray:
    """``X`` ``(n, d)`` float32 as a model of ``metric`` stores and compares it: itself
    (``"euclidean"``) or :func:`unit_rows` (``"cosine"``)."""
    return unit_rows(X, name=name) if metric == "cosine" else X


def dissimilarity(sqdist: np.ndarray, metric: str) -> np.ndarray:
    """What a model of ``metric`` minimises, from the squared Euclidean distances
    ``sqdist`` (float64) between its rows and centroids: ``sqdist`` itself
    (``"euclidean"``), or the cosine dissimilarity ``1 - cos = sqdist / 2`` of unit
    vectors (``"cosine"``; never negative)."""
    return sqdist / 2.0 if metric == "cosine" else sqdist


def similarity(sqdist: np.ndarray) -> np.ndarray:
    """Cosine similarity ``1 - sqdist / 2`` of unit vectors whose squared Euclidean
    distance is ``sqdist`` (float64; rows and centroids unit to float32 precision, so
    within about ``2^-22`` of the cosine of the vectors as stored)."""
    return 1.0 - np.asarray(sqdist, dtype=np.float64) / 2.0
