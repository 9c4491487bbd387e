"""Initial centroids: greedy k-means++ (Arthur & Vassilvitskii 2007) on the first batch."""

from __future__ import annotations

import numpy as np

__all__ = ["initial_centroids", "kmeans_plusplus"]


def kmeans_plusplus(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Choose ``k`` rows of ``X`` by greedy k-means++ (``2 + ln k`` trials per centroid).

    X : (n, d) float32, n >= k.  Returns (k, d) float32, rows copied from ``X``.
    """
    n = X.shape[0]
    if n < k:
        raise ValueError(f"k-means++ needs at least k={k} samples, got {n}")
    X64 = np.asarray(X, dtype=np.float64)
    n_trials = 2 + int(np.log(k))
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(n)
    # Direct differences, not the expanded form: that cancels and can make a distinct
    # row look like a chosen one.
    closest = ((X64 - X64[chosen[0]]) ** 2).sum(axis=1)
    for c in range(1, k):
        total = closest.sum()
        if total <= 0.0:  # every row equals a chosen centroid: duplicates are unavoidable
            unused = np.setdiff1d(np.arange(n), chosen[:c])
            chosen[c] = unused[rng.integers(unused.shape[0])]
            continue
        cumulative = np.cumsum(closest)
        picks = np.searchsorted(cumulative, rng.random(n_trials) * cumulative[-1], side="right")
        picks = np.minimum(picks, n - 1)
        dist = np.stack([((X64 - X64[p]) ** 2).sum(axis=1) for p in picks], axis=1)
        candidate = np.minimum(closest[:, None], dist)
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
