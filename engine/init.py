"""Initial centroids: greedy k-means++ (Arthur & Vassilvitskii 2007) on the first batch."""

from __future__ import annotations

import numpy as np

__all__ = ["kmeans_plusplus"]


def kmeans_plusplus(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Choose ``k`` rows of ``X`` by greedy k-means++ (``2 + ln k`` trials per centroid).

    X : (n, d) float32, n >= k.  Returns (k, d) float32, rows copied from ``X``.
    """
    n = X.shape[0]
    if n < k:
        raise ValueError(f"k-means++ needs at least k={k} samples, got {n}")
    X64 = np.asarray(X, dtype=np.float64)
    xx = np.einsum("ij,ij->i", X64, X64)
    n_trials = 2 + int(np.log(k))
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(n)
    closest = np.maximum(xx - 2.0 * X64 @ X64[chosen[0]] + xx[chosen[0]], 0.0)
    for c in range(1, k):
        total = closest.sum()
        if total <= 0.0:  # every sample sits on a chosen centroid: take any unused row
            chosen[c] = rng.integers(n)
            continue
        cumulative = np.cumsum(closest)
        picks = np.searchsorted(cumulative, rng.random(n_trials) * cumulative[-1], side="right")
        picks = np.minimum(picks, n - 1)
        dist = np.maximum(xx[:, None] - 2.0 * X64 @ X64[picks].T + xx[picks][None, :], 0.0)
        candidate = np.minimum(closest[:, None], dist)
        best = int(np.argmin(candidate.sum(axis=0)))
        chosen[c] = picks[best]
        closest = candidate[:, best]
    return np.array(X[chosen], dtype=np.float32)
