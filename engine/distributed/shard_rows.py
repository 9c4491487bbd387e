"""A shard's rows as nmbatch reads them, and nmbatch's step on them (no Ray imported).

- :class:`RowsInPriorityOrder`: the store interface ``NestedMiniBatch`` reads, over a
  shard's rows already sorted by priority, with their sample weights (a weighted shard
  gives the kernels its ``weights_buffer``, as a weighted ``NestedBatchStore`` does: a
  row's vote is ``w x``, ``w``, ``w ||x||^2``).
- :class:`ShardNested`: nmbatch's revisit and assignment with the sums replaced by
  zeroed deltas (:mod:`.shard`).
- :data:`Votes` and :func:`votes`: a shard's change of the sums, the clusters it changed.
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine.algorithms.base import voting_clusters
from nmbatch.engine.algorithms.nested import NestedMiniBatch

__all__ = [
    "NO_WEIGHTS",
    "RowsInPriorityOrder",
    "ShardNested",
    "StepResult",
    "Votes",
    "kept_weights",
    "votes",
]

NO_WEIGHTS = np.empty(0, dtype=np.float64)
"""An unweighted shard's ``weights_buffer``: ``(0,)`` float64, every weight 1."""

#: A shard's change of the sums, only the clusters it changed: ``(j (m,) int64, dS
#: (m, d) float64, dv (m,) int64 (float64 from a weighted shard), dQ (m,) float64)``
#: (:func:`votes`). Late rounds move few samples, so the reply is mostly far below ``k d``
#: numbers (Ray inlines a reply under 100 KiB in the call's answer instead of going
#: through its object store).
Votes = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

#: ``(votes, n_changed, n_new, n_dist, b_s, seconds, held)``: ``seconds`` is the wall
#: time of the step inside the shard; ``held`` ``(k,)`` bool, the clusters the shard's
#: voting rows hold, from a weighted shard (None unweighted: its integer ledger says it).
StepResult = tuple[Votes, int, int, int, int, float, "np.ndarray | None"]


def kept_weights(w: np.ndarray | None, m: int) -> np.ndarray | None:
    """Sample weights ``(m,)`` float64 as a chunk keeps them: a copy, or None when every
    weight is 1 (an unweighted chunk costs nothing and leaves its shard unweighted)."""
    if w is None:
        return None
    w = np.asarray(w, dtype=np.float64).reshape(m)
    return w.copy() if np.any(w != 1.0) else None


def votes(dS: np.ndarray, dv: np.ndarray, dQ: np.ndarray) -> Votes:
    """The clusters with a non-zero change of ``dS`` ``(k, d)``, ``dv`` or ``dQ``, and
    their changes (:data:`Votes`)."""
    j = np.flatnonzero((dv != 0) | (dQ != 0) | (dS != 0).any(axis=1))
    return j, dS[j], dv[j], dQ[j]


class RowsInPriorityOrder:
    """The store interface ``NestedMiniBatch`` reads (``dim``, ``n_samples``,
    ``freeze``, ``batch_size``, ``nbytes``, ``metric``, ``weighted``,
    ``weights_buffer``), over rows ``data`` ``(n_s, d)`` float32 already in priority
    order, with ``weights`` ``(n_s,)`` float64 (:data:`NO_WEIGHTS`: unweighted, every
    weight 1): the prefix ``[0, b)`` is what ``tau`` selects, and nothing is shuffled.
    ``metric``: the model's; under ``"cosine"`` ``data`` holds unit rows (the shard
    normalises what it reads, :mod:`.shard`)."""

    def __init__(
        self, data: np.ndarray, weights: np.ndarray = NO_WEIGHTS, metric: str = "euclidean"
    ) -> None:
        self.metric = metric
        self.data = data
        self.weights_buffer = weights
        self.dim = int(data.shape[1])
        self.n_samples = int(data.shape[0])
        self.batch_size = 0
        self.nbytes = int(data.nbytes + weights.nbytes)

    @property
    def weighted(self) -> bool:
        """True when the rows carry weights (the kernels read ``weights_buffer``)."""
        return bool(self.weights_buffer.shape[0])

    def weights(self) -> np.ndarray:
        """The weight of each row, ``(n_s,)`` float64 (ones unweighted)."""
        if self.weighted:
            return self.weights_buffer
        return np.ones(self.n_samples, dtype=np.float64)

    def freeze(self, b: int) -> tuple[np.ndarray, int]:
        self.batch_size = max(self.batch_size, min(int(b), self.n_samples))
        return self.data, self.batch_size


class ShardNested(NestedMiniBatch):
    """nmbatch's revisit and assignment on a shard's rows, with given centroids."""

    def shard_step(
        self, C: np.ndarray, p: np.ndarray, b: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int]:
        """Revisit ``[0, b_old)`` and assign ``[b_old, b)`` under ``C`` (``(k, d)``
        float32) moved by ``p`` (``(k,)`` float64) since the bounds were set.

        Returns ``(dS, dv, dQ, n_changed, n_new, n_dist)`` (``dv`` float64 when the rows
        are weighted, else int64).
        """
        k, d = self.n_clusters, self.dim
        self.centroids, self.p, self.initialized = C, p, True
        self.S = np.zeros((k, d), dtype=np.float64)
        self.v = np.zeros(k, dtype=np.float64 if self.store.weighted else np.int64)
        self.Q = np.zeros(k, dtype=np.float64)
        self.sse = np.zeros(k, dtype=np.float64)  # scratch: sse is computed from the sums
        data, b = self.store.freeze(b)
        b_old = self.batch_size
        self._reserve(b)
        n_changed = n_dist = 0
        if b_old > 0:
            n_changed, n_dist = self._revisit_bounded(data, b_old)
        if b > b_old:
            self._assign_new(data, b_old, b)
            n_dist += (b - b_old) * k
        self.batch_size = b
        return self.S, self.v, self.Q, int(n_changed), b - b_old, int(n_dist)

    def held(self) -> np.ndarray | None:
        """The clusters the voting rows hold, ``(k,)`` bool, when weighted (None
        unweighted: the integer counts say it exactly)."""
        w = self.store.weights_buffer
        if not w.shape[0]:
            return None
        return voting_clusters(self._labels, w, self.batch_size, self.n_clusters)
