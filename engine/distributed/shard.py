"""One shard of the distributed store: its rows, their priorities, per-row state, ledger.

A shard holds the rows ``x(i)`` that reached it (round robin: independent of their
values), each with a random priority ``pi(i)`` (int64, distinct over the whole store).
The nested prefix ``M_t`` of the whole store is ``{i : pi(i) < tau}``, the ``b`` samples
of lowest priority; a shard keeps its rows sorted by priority, so its part of the prefix
is its rows ``[0, b_s)`` with ``b_s = #{i in shard : pi(i) < tau}``. Raising ``tau``
(a doubling) makes ``b_s`` grow; no row ever moves between shards.

The step of a shard is nmbatch's step (:class:`~nmbatch.engine.algorithms.NestedMiniBatch`)
without the centroid update: the revisit of ``[0, b_s_old)`` (bound sweep with the
centroid moves ``p``, old votes removed, new votes cast) and the dense assignment of the
rows ``[b_s_old, b_s)`` that join. It runs the single-machine code itself
(:class:`_ShardNested` subclasses ``NestedMiniBatch`` and calls its revisit and
assignment methods, hence the same kernels and the same bound modes), with the sums
``S``, ``v``, ``Q`` replaced by zeroed delta arrays, so one round yields
``(dS, dv, dQ)``: the shard's change of the global sums. The shard adds them to its
ledger ``(S_s, v_s, Q_s)``, the votes its rows hold; the coordinator keeps a copy of
every ledger, so a lost shard's votes can be subtracted exactly. ``sse`` is not sent:
as on one machine it is computed from the sums, ``sse(j) = Q(j) - 2 c(j).S(j) +
v(j) ||c(j)||^2`` (``Q`` is the ledger's ``sse`` term).

This module does not import Ray: the coordinator wraps :class:`ShardState` in an actor.
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine.algorithms.nested import NestedMiniBatch
from nmbatch.engine.algorithms.relocation import _closer_to, _own_sqdist

__all__ = ["ShardState", "StepResult"]

_SAFETY = 1.0 + 1e-9  # as relocation.py: an upper bound rounded up
_LOWER_SAFETY = (1.0 - 1e-9) * (1.0 - 2.0**-22)  # as relocation.py: a lower bound down

#: ``(dS (k, d) float64, dv (k,) int64, dQ (k,) float64, n_changed, n_new, n_dist, b_s)``.
StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int, int]


class _RowsInPriorityOrder:
    """The store interface ``NestedMiniBatch`` reads (``dim``, ``n_samples``,
    ``freeze``, ``batch_size``, ``nbytes``), over rows already in priority order: the
    prefix ``[0, b)`` is what ``tau`` selects, and nothing is shuffled."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.dim = int(data.shape[1])
        self.n_samples = int(data.shape[0])
        self.batch_size = 0
        self.nbytes = int(data.nbytes)

    def freeze(self, b: int) -> tuple[np.ndarray, int]:
        self.batch_size = max(self.batch_size, min(int(b), self.n_samples))
        return self.data, self.batch_size


class _ShardNested(NestedMiniBatch):
    """nmbatch's revisit and assignment on a shard's rows, with given centroids."""

    def shard_step(
        self, C: np.ndarray, p: np.ndarray, b: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int]:
        """Revisit ``[0, b_old)`` and assign ``[b_old, b)`` under ``C`` (``(k, d)``
        float32) moved by ``p`` (``(k,)`` float64) since the bounds were set.

        Returns ``(dS, dv, dQ, n_changed, n_new, n_dist)``.
        """
        k, d = self.n_clusters, self.dim
        self.centroids, self.p, self.initialized = C, p, True
        self.S = np.zeros((k, d), dtype=np.float64)
        self.v = np.zeros(k, dtype=np.int64)
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


class ShardState:
    """A shard: rows ``(n_s, d)`` float32 sorted by priority, their stream ``ids``
    ``(n_s,)`` int64 and priorities ``(n_s,)`` int64, the per-row state of nmbatch
    (labels, norms, bounds) and the ledger ``S_s (k, d)`` float64, ``v_s (k,)`` int64,
    ``Q_s (k,)`` float64. A new shard holds no votes: its prefix rows join as new rows
    at its first step (a rebuilt partition after a fault, too).

    Parameters
    ----------
    rows : (n_s, d) float32, ids : (n_s,) int64, priority : (n_s,) int64 (distinct)
    n_clusters : int
        ``k``.
    bound_mode : {"auto", "full", "group", "hamerly"}
        The lower bounds kept (:mod:`nmbatch.engine.algorithms.bounds`).
    """

    def __init__(
        self,
        rows: np.ndarray,
        ids: np.ndarray,
        priority: np.ndarray,
        n_clusters: int,
        bound_mode: str = "full",
    ) -> None:
        order = np.argsort(np.asarray(priority, dtype=np.int64), kind="stable")
        # Copies: arrays from Ray's object store are read-only, and the kernels are
        # compiled (and cached) for writable arrays.
        data = np.ascontiguousarray(np.asarray(rows, dtype=np.float32)[order])
        self.ids = np.asarray(ids, dtype=np.int64)[order]
        self.priority = np.asarray(priority, dtype=np.int64)[order]
        self.n_clusters = int(n_clusters)
        self._algo = _ShardNested(
            _RowsInPriorityOrder(data), self.n_clusters, init="first", bound_mode=bound_mode
        )
        k, d = self.n_clusters, data.shape[1]
        self.S_s = np.zeros((k, d), dtype=np.float64)
        self.v_s = np.zeros(k, dtype=np.int64)
        self.Q_s = np.zeros(k, dtype=np.float64)
        self._dist2 = np.empty(0, dtype=np.float64)  # relocation: maximin distances

    # -- the prefix ---------------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        """The rows in priority order, ``(n_s, d)`` float32."""
        return self._algo.store.data

    @property
    def batch_size(self) -> int:
        """``b_s``: rows of this shard in the prefix that hold a vote."""
        return int(self._algo.batch_size)

    def count_below(self, thresholds: np.ndarray) -> np.ndarray:
        """``#{i : pi(i) < t}`` for each ``t`` of ``thresholds`` ``(m,)`` int64: ``(m,)`` int64."""
        return np.searchsorted(self.priority, np.asarray(thresholds, np.int64)).astype(np.int64)

    def prefix_rows(self, tau: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows with ``pi(i) < tau`` and their priorities: ``((m, d) float32, (m,) int64)``."""
        m = int(np.searchsorted(self.priority, tau))
        return self.data[:m].copy(), self.priority[:m].copy()

    # -- one round ------------------------------------------------------------------------
    def step(self, centroids_and_moves: tuple[np.ndarray, np.ndarray], tau: int) -> StepResult:
        """nmbatch's step on this shard's part ``{pi(i) < tau}`` of the prefix.

        ``centroids_and_moves``: ``(C (k, d) float32, p (k,) float64)``, the centroids in
        force and how far each moved at the last update (one ``ray.put`` for all shards).
        Returns ``(dS, dv, dQ, n_changed, n_new, n_dist, b_s)`` (:data:`StepResult`) and
        adds the deltas to the ledger.
        """
        C, p = centroids_and_moves
        b = int(np.searchsorted(self.priority, tau))
        C = np.array(C, dtype=np.float32, order="C")
        p = np.array(p, dtype=np.float64)
        dS, dv, dQ, n_changed, n_new, n_dist = self._algo.shard_step(C, p, b)
        self.S_s += dS
        self.v_s += dv
        self.Q_s += dQ
        return dS, dv, dQ, n_changed, n_new, n_dist, b

    def ledger(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(S_s, v_s, Q_s)``: the votes this shard's rows hold (copies)."""
        return self.S_s.copy(), self.v_s.copy(), self.Q_s.copy()

    def assignments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids (n_s,) int64, priority (n_s,) int64, labels (n_s,) int32)`` of every row
        (``-1``: not in the prefix or not voted yet), in priority order."""
        labels = np.full(self.ids.shape[0], -1, dtype=np.int32)
        b = self.batch_size
        labels[:b] = self._algo._labels[:b]
        return self.ids.copy(), self.priority.copy(), labels

    def node_id(self) -> str:
        """The Ray node this shard runs on ("" outside Ray)."""
        try:
            import ray

            return ray.get_runtime_context().get_node_id()
        except Exception:  # not in a Ray worker
            return ""

    # -- relocation of empty clusters (relocation.py, one shard's part) ----------------------
    def relocation_begin(self, C: np.ndarray, v: np.ndarray) -> tuple[float, int, int] | None:
        """Start the farthest-point search: ``d(i)^2`` of every voted row to its updated
        centroid ``C`` (``(k, d)`` float32); returns :meth:`relocation_best`."""
        b = self.batch_size
        labels = self._algo._labels
        self._dist2 = _own_sqdist(self.data, b, labels, np.asarray(C)) if b else self._dist2[:0]
        return self.relocation_best(v)

    def relocation_best(self, v: np.ndarray) -> tuple[float, int, int] | None:
        """``(dist2, priority, row)`` of this shard's farthest row whose cluster keeps
        another sample under the global counts ``v`` (``(k,)`` int64), ties to the lowest
        priority; None when no row is off its centroid. A row refused for its cluster
        stays refused (within a relocation no count ``< 2`` grows back to 2)."""
        dist2, labels = self._dist2, self._algo._labels
        while dist2.shape[0]:
            row = int(np.argmax(dist2))
            if dist2[row] <= 0.0:
                return None
            if v[labels[row]] >= 2:
                return float(dist2[row]), int(self.priority[row]), row
            dist2[row] = -1.0
        return None

    def relocation_take(
        self, row: int, j: int, C_prev: np.ndarray
    ) -> tuple[int, np.ndarray, float, int]:
        """Move the vote of ``row`` to the empty cluster ``j`` (ledger, label, bounds, as
        :func:`~nmbatch.engine.algorithms.relocation.relocate_empty`); ``C_prev``: the
        centroids before the update, ``(k, d)`` float32. Returns ``(a, x (d,) float64,
        ||x||^2, id)``, ``a`` the cluster it left, ``id`` the sample's stream id."""
        algo = self._algo
        a = int(algo._labels[row])
        x = self.data[row].astype(np.float64)
        xx = float(algo._xx[row])
        self.S_s[a] -= x
        self.v_s[a] -= 1
        self.Q_s[a] -= xx
        self.S_s[j] += x
        self.v_s[j] += 1
        self.Q_s[j] += xx
        algo._labels[row] = j
        if algo.bounds:
            gap = x - np.asarray(C_prev[j], dtype=np.float64)
            algo._upper[row] = float(np.sqrt(gap @ gap)) * _SAFETY
            group_lower = algo._bk.relocation_bounds(algo._lower)
            if group_lower is not None:  # the group of a now bounds c(a) too
                lower, group_of = group_lower
                gap = x - np.asarray(C_prev[a], dtype=np.float64)
                ga = int(group_of[a])
                bound = np.float32(float(np.sqrt(gap @ gap)) * _LOWER_SAFETY)
                lower[row, ga] = min(lower[row, ga], bound)
        self._dist2[row] = 0.0
        return a, x, xx, int(self.ids[row])

    def relocation_next(self, x: np.ndarray, v: np.ndarray) -> tuple[float, int, int] | None:
        """After a sample ``x`` (``(d,)`` float64) was relocated: ``d(i)^2 = min(d(i)^2,
        ||x(i) - x||^2)``, then :meth:`relocation_best` under ``v``."""
        if self._dist2.shape[0]:
            _closer_to(self._dist2, self.data, self._dist2.shape[0], x)
        return self.relocation_best(v)
