"""Exact float64 squared distances for relocation and swaps, without temporaries.

Relocation (:mod:`nmbatch.engine.algorithms.relocation`) takes the batch's samples
farthest from their centroids; it needs ``||x(i) - c(a(i))||^2`` of every batch row and,
for each sample it moves, ``||x(i) - x||^2`` against the moved sample. Both are computed
here row by row in float64 (the differences in float64, summed over the coordinates in
order), one pass over the rows and no ``(b, d)`` float64 copy. Each row's value depends
only on the row, so the result is the same whatever the batch's size or split.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["closer_to", "own_sqdist"]


@numba.njit(cache=True, nogil=True)
def _own_sqdist(data, b, labels, C64, out):
    d = data.shape[1]
    for i in range(b):
        c = C64[labels[i]]
        s = 0.0
        for t in range(d):
            diff = np.float64(data[i, t]) - c[t]
            s += diff * diff
        out[i] = s


@numba.njit(cache=True, nogil=True)
def _closer_to(dist2, data, b, x):
    d = data.shape[1]
    for i in range(b):
        s = 0.0
        for t in range(d):
            diff = np.float64(data[i, t]) - x[t]
            s += diff * diff
        if s < dist2[i]:
            dist2[i] = s


def own_sqdist(data: np.ndarray, b: int, labels: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``||x(i) - c(a(i))||^2`` of the rows ``[0, b)``.

    data : (>= b, d) float32; labels : (>= b,) int32; C : (k, d) float32 or float64.
    Returns ``(b,)`` float64.
    """
    out = np.empty(b, dtype=np.float64)
    _own_sqdist(data, b, labels, np.ascontiguousarray(C, dtype=np.float64), out)
    return out


def closer_to(dist2: np.ndarray, data: np.ndarray, b: int, x: np.ndarray) -> None:
    """``dist2[i] = min(dist2[i], ||x(i) - x||^2)`` over the rows ``[0, b)``, in place.

    dist2 : (>= b,) float64 INOUT; data : (>= b, d) float32; x : (d,) float32 or float64.
    """
    _closer_to(dist2, data, b, np.ascontiguousarray(x, dtype=np.float64))
