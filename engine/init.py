"""Initial centroids: greedy k-means++ (Arthur & Vassilvitskii 2007) on the first batch."""

from __future__ import annotations

import numpy as np

__all__ = ["EXPANDED_MIN", "initial_centroids", "kmeans_plusplus"]


# Below this fraction of ``||x||^2 + ||p||^2``, a squared distance from the expanded form
# is recomputed from the differences: there the expansion's float64 rounding (about
# ``d * 1.1e-16`` of that sum) could hide a distinct row behind a chosen one, or make a
# duplicate of a chosen row look distinct. Above it, its relative error is below
# ``d * 1.1e-10``.
EXPANDED_MIN = 1e-6


def _sqdist_to(X64: np.ndarray, xx: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """Squared distances of every row of ``X64`` to the rows ``picks``.

    X64   : (n, d) float64  IN
    xx    : (n,) float64    IN   ``||X64[i]||^2``
    picks : (t,) int64      IN
    Returns (n, t) float64: ``xx + pp - 2 X64 X64[picks]^T`` (one BLAS product), those
    below ``EXPANDED_MIN (xx + pp)`` recomputed as ``sum((x - p)^2)``; a row's distance
    to itself is 0.
    """
    P = X64[picks]
    pp = xx[picks]
    scale = xx[:, None] + pp[None, :]
    dist = scale - 2.0 * (X64 @ P.T)
    rows, cols = np.nonzero(dist <= scale * EXPANDED_MIN)
    if rows.size:
        dist[rows, cols] = ((X64[rows] - P[cols]) ** 2).sum(axis=1)
    return dist


def kmeans_plusplus(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Choose ``k`` rows of ``X`` by greedy k-means++ (``2 + ln k`` trials per centroid).

    X : (n, d) float32, n >= k.  Returns (k, d) float32, rows copied from ``X``.

    Each round's trials are one BLAS product with the rows (:func:`_sqdist_to`), so the
    cost is ``k (2 + ln k)`` passes over ``X`` at BLAS speed.
    """
    n = X.shape[0]
    if n < k:
        raise ValueError(f"k-means++ needs at least k={k} samples, got {n}")
    X64 = np.ascontiguousarray(X, dtype=np.float64)
    xx = np.einsum("ij,ij->i", X64, X64)
    n_trials = 2 + int(np.log(k))
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(n)
    closest = _sqdist_to(X64, xx, chosen[:1])[:, 0]
    for c in range(1, k):
        total = closest.sum()
        if total <= 0.0:  # every row equals a chosen centroid: duplicates are unavoidable
            unused = np.setdiff1d(np.arange(n), chosen[:c])
            chosen[c] = unused[rng.integers(unused.shape[0])]
            continue
        cumulative = np.cumsum(closest)
        picks = np.searchsorted(cumulative, rng.random(n_trials) * cumulative[-1], side="right")
        picks = np.minimum(picks, n - 1)
        candidate = np.minimum(closest[:, None], _sqdist_to(X64, xx, picks))
        best = int(np.argmin(candidate.sum(axis=0)))
        chosen[c] = picks[best]
        closest = candidate[:, best]
    return np.array(X[chosen], dtype=np.float32)


def initial_centroids(
    init: str | np.ndarray, X: np.ndarray, k: int, rng: np.random.Generator
) -> np.ndarray:
    """The starting centroids ``(k, d)`` float32 (C-contiguous, a new array) from the
    first batch ``X`` ``(b, d)`` float32: ``init`` itself if an array, the first ``k``
    rows (``"first"``), or k-means++ seeding on ``X`` with ``rng`` (``"k-means++"``)."""
    if isinstance(init, np.ndarray):
        C = init
    elif init == "first":
        C = X[:k]
    else:
        C = kmeans_plusplus(X, k, rng)
    return np.array(C, dtype=np.float32, order="C")
