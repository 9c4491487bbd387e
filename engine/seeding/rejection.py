"""k-means++ with one trial per centroid, exactly, with a BLAS product per batch of centroids.

Plain k-means++ (Arthur & Vassilvitskii 2007) draws centroid ``c + 1`` with probability
``w(i) D_c(i)^2 / phi_c``, ``D_c`` the distance to the nearest of the first ``c``.
Updating ``D`` after every draw is a pass over every row per centroid: ``m d`` bytes
read for ``m d`` multiply-adds, bound by memory (MNIST, ``k = 4,096`` on 16,384 rows:
10 s of one core, where one BLAS product does the same multiply-adds in 1.6 s).

By rejection the draws stay exact and the updates come in batches. ``D_a >= D`` is the
distance to the centroids chosen up to the last update; draw ``i`` with probability
``w(i) D_a(i)^2 / phi_a`` and accept it with probability ``D(i)^2 / D_a(i)^2``, where
``D(i)^2 = min(D_a(i)^2, ||x(i) - p||^2 over the pending centroids p)``. An accepted row
has probability ``w(i) D_a(i)^2 / phi_a * D(i)^2 / D_a(i)^2``, proportional to
``w(i) D(i)^2``: k-means++'s law (a rejected one changes nothing; the next draw starts
again). The pending centroids lower ``D_a`` in one BLAS product when there are
:data:`MAX_PENDING` of them or when rejections pass their number
(:mod:`nmbatch.engine.kernels.seeding_rejection`). At large ``k`` a new centroid
changes ``D`` on few rows, so most draws are accepted and the products are large.

The rows drawn differ from :func:`~nmbatch.engine.seeding.greedy.kmeans_plusplus` with
``trials=1`` (another use of the random numbers), not their law; they depend only on
``rng`` (the products come in fixed chunks, :func:`~nmbatch.engine.products.products`,
and rows are independent), not on the thread count.
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine.kernels.seeding_rejection import apply_pending, propose
from nmbatch.engine.products import products

__all__ = ["MAX_PENDING", "kmeans_plusplus_rejection"]

MAX_PENDING = 256  # centroids per update of D_a (one (m, 256) product)


def _centred(X: np.ndarray) -> np.ndarray:
    """``X - mean(X)`` (m, d) float32, C-contiguous: distances are unchanged and the
    product form ``||x||^2 - 2 x.c + ||c||^2`` loses less to cancellation."""
    mean = X.mean(axis=0, dtype=np.float64).astype(np.float32)
    return np.ascontiguousarray(X - mean, dtype=np.float32)


def kmeans_plusplus_rejection(
    X: np.ndarray,
    k: int,
    rng: np.random.Generator,
    *,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """Indices ``(k,)`` int64 of ``k`` rows of ``X`` chosen by k-means++ (one trial per
    centroid), by rejection against the pending centroids.

    X       : (m, d) float32, m >= k
    weights : (m,) float64 >= 0 or None   ``w(i)``; None: all 1
    Distinct while ``X`` has distinct rows of positive weight left (then random unused
    rows, as greedy k-means++). The first row is drawn with probability ``w(i) / sum(w)``.
    """
    m = X.shape[0]
    if m < k:
        raise ValueError(f"k-means++ needs at least k={k} samples, got {m}")
    Xc = _centred(np.asarray(X, dtype=np.float32))
    w = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    xx = np.einsum("ij,ij->i", Xc, Xc, dtype=np.float64)
    chosen = np.empty(k, dtype=np.int64)
    if w is None:
        chosen[0] = rng.integers(m)
    else:
        chosen[0] = min(int(np.searchsorted(np.cumsum(w), rng.random() * w.sum(), "right")),
                        m - 1)  # fmt: skip
    Da = np.full(m, np.inf)
    rows_all = np.arange(m, dtype=np.int64)
    buffer = np.empty(m * MAX_PENDING, dtype=np.float32)  # the products, (m, B) C-order
    pending = np.empty(MAX_PENDING, dtype=np.int64)
    pending[0], n_pending, n_chosen = chosen[0], 1, 1
    while True:
        # Lower D_a to the pending centroids: one product (fixed row chunks).
        rows = pending[:n_pending].copy()
        out = buffer[: m * n_pending].reshape(m, n_pending)
        P = products(Xc, rows_all, np.ascontiguousarray(Xc[rows].T), out)
        apply_pending(Xc, P, xx, xx[rows], rows, Da)
        n_pending = 0
        if n_chosen == k:
            return chosen
        mass = Da if w is None else Da * w
        cum = np.cumsum(mass)
        if not cum[-1] > 0.0:  # every row sits on a chosen one: duplicates are unavoidable
            unused = np.setdiff1d(rows_all, chosen[:n_chosen])
            extra = rng.choice(unused, size=k - n_chosen, replace=False)
            chosen[n_chosen:] = extra
            return chosen
        room = min(MAX_PENDING, k - n_chosen)
        u = rng.random((2 * room + 6, 2))
        n_pending, _ = propose(Xc, cum, Da, pending, 0, room, u)
        chosen[n_chosen : n_chosen + n_pending] = pending[:n_pending]
        n_chosen += n_pending

