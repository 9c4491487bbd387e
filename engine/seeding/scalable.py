"""Seedings whose cost grows more slowly than greedy k-means++: k-means‖, AFK-MC², random.

- :func:`kmeans_parallel`: k-means‖ (Bahmani, Moseley, Vattani, Kumar & Vassilvitskii,
  VLDB 2012). From one uniform row, ``rounds`` rounds each keep every row ``i``
  independently with probability ``min(1, l D(i)^2 / phi)`` (``D(i)^2``: its squared
  distance to the candidates so far, ``phi`` their sum); each candidate is then weighted
  by the rows nearest to it, and weighted greedy k-means++ picks ``k`` of them. Cost:
  ``n (1 + rounds l) d`` distances by the engine's exact lookup (BLAS products), plus
  k-means++ on about ``rounds l`` candidates.
- :func:`afkmc2`: AFK-MC² (Bachem, Lucic, Hassani & Krause, NIPS 2016). One pass for the
  proposal ``q(x) = D(x, c_1)^2 / (2 sum) + 1 / (2n)``, then per centroid a Markov chain
  of length ``m`` on proposals from ``q``, accepted with probability
  ``min(1, D(y)^2 q(x) / (D(x)^2 q(y)))``. Cost: ``m k^2 d / 2`` distances, none over
  all rows after the first pass.
- :func:`random_rows`: ``k`` distinct rows drawn uniformly. Cost: a copy of ``k`` rows.

Distances are the engine's exact ones (:func:`nmbatch.engine.assign.nearest`: float64
sums where it matters, the same result with any thread count).
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine.assign import nearest
from nmbatch.engine.seeding.greedy import kmeans_plusplus

__all__ = ["AFKMC2_CHAIN", "KMEANS_PARALLEL_OVERSAMPLING", "KMEANS_PARALLEL_ROUNDS",
           "afkmc2", "kmeans_parallel", "random_rows"]

KMEANS_PARALLEL_OVERSAMPLING = 2.0  # l = 2 k
KMEANS_PARALLEL_ROUNDS = 5
AFKMC2_CHAIN = 200  # m, the paper's chain length


def random_rows(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (k,) int64 of ``k`` distinct rows of ``X`` (n, d), drawn uniformly."""
    n = X.shape[0]
    if n < k:
        raise ValueError(f"random seeding needs at least k={k} samples, got {n}")
    return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


def kmeans_parallel(
    X: np.ndarray,
    k: int,
    rng: np.random.Generator,
    *,
    oversampling: float = KMEANS_PARALLEL_OVERSAMPLING,
    rounds: int = KMEANS_PARALLEL_ROUNDS,
) -> np.ndarray:
    """Indices (k,) int64 of ``k`` rows of ``X`` (n, d) float32 chosen by k-means‖ with
    ``l = oversampling k`` and ``rounds`` rounds, the candidates reduced to ``k`` by
    weighted greedy k-means++. Fewer than ``k`` candidates (data with few distinct rows):
    the rest are uniform rows not yet chosen."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    n = X.shape[0]
    if n < k:
        raise ValueError(f"k-means|| needs at least k={k} samples, got {n}")
    ell = oversampling * k
    first = int(rng.integers(n))
    cand = [np.array([first], dtype=np.int64)]
    label, closest = nearest(X, X[first : first + 1])
    owner = np.full(n, first, dtype=np.int64)  # the candidate nearest to each row
    for _ in range(int(rounds)):
        phi = float(closest.sum())
        if not phi > 0.0:
            break
        keep = np.flatnonzero(rng.random(n) < ell * closest / phi)
        keep = keep[closest[keep] > 0.0]
        if keep.shape[0] == 0:
            continue
        label, dist = nearest(X, X[keep])
        closer = dist < closest
        closest = np.where(closer, dist, closest)
        owner = np.where(closer, keep[label], owner)
        cand.append(keep)
    candidates = np.unique(np.concatenate(cand))
    if candidates.shape[0] <= k:
        rest = np.setdiff1d(np.arange(n), candidates)
        extra = rng.choice(rest, size=k - candidates.shape[0], replace=False)
        return np.concatenate([candidates, np.sort(extra)]).astype(np.int64)
    weights = np.bincount(np.searchsorted(candidates, owner), minlength=candidates.shape[0])
    chosen = kmeans_plusplus(X[candidates], k, rng, weights=np.maximum(weights, 1).astype(
        np.float64))
    return candidates[chosen]


def afkmc2(
    X: np.ndarray, k: int, rng: np.random.Generator, *, chain: int = AFKMC2_CHAIN
) -> np.ndarray:
    """Indices (k,) int64 of ``k`` rows of ``X`` (n, d) float32 chosen by AFK-MC² with
    chains of length ``chain``. A chain that finds only rows on chosen centroids takes a
    uniform unused row."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    n = X.shape[0]
    if n < k:
        raise ValueError(f"AFK-MC2 needs at least k={k} samples, got {n}")
    m = int(chain)
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(n)
    d1 = nearest(X, X[chosen[:1]])[1]
    total = float(d1.sum())
    q = (0.5 * d1 / total + 0.5 / n) if total > 0.0 else np.full(n, 1.0 / n)
    cq = np.cumsum(q)
    for c in range(1, k):
        ys = np.minimum(np.searchsorted(cq, rng.random(m) * cq[-1], side="right"), n - 1)
        dy = nearest(X[ys], X[chosen[:c]])[1]
        u = rng.random(m)
        x, dx, qx = ys[0], dy[0], q[ys[0]]
        for j in range(1, m):
            y = ys[j]
            if dx == 0.0 or dy[j] * qx > u[j] * dx * q[y]:
                x, dx, qx = y, dy[j], q[y]
        if dx == 0.0:  # the chain saw only chosen rows
            unused = np.setdiff1d(np.arange(n), chosen[:c])
            x = unused[rng.integers(unused.shape[0])]
        chosen[c] = x
    return chosen
