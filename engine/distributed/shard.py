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
(:class:`~.shard_rows.ShardNested` subclasses ``NestedMiniBatch`` and calls its revisit and
assignment methods, hence the same kernels and the same bound modes), with the sums
``S``, ``v``, ``Q`` replaced by zeroed delta arrays, so one round yields
``(dS, dv, dQ)``: the shard's change of the global sums. The shard adds them to its
ledger ``(S_s, v_s, Q_s)``, the votes its rows hold; the coordinator keeps a copy of
every ledger, so a lost shard's votes can be subtracted exactly. ``sse`` is not sent:
as on one machine it is computed from the sums, ``sse(j) = Q(j) - 2 c(j).S(j) +
v(j) ||c(j)||^2`` (``Q`` is the ledger's ``sse`` term).

Streaming (:meth:`ShardState.append`, used by :mod:`.stream`): appended rows come with
priorities at or above the coordinator's ``tau`` at the time (so above every voted row's),
and wait in a queue; before any read (counts, prefix, step, rows) the queue is merged:
the voted rows ``[0, b_s)`` stay where they are (their per-row state is indexed by
position), the unvoted rows and the queued ones are sorted by priority after them. A
priority that repeats one already held is raised by ``stride`` (the number of shards,
keeping it in the shard's residue class) until it is unique. Rows may also come by
reference (:meth:`ShardState.append_ref`, :mod:`nmbatch.engine.rows`): the shard reads them from its
source, all those queued in one call, at the next merge. :meth:`ShardState.respread`
maps the priorities down when the coordinator asks (see :mod:`.stream`).

Under ``metric="cosine"`` a shard holds unit rows: arrays come normalised by the driver
(which refuses a zero row before sending anything), rows by reference are normalised as
they are read (:meth:`_read`); the step is the Euclidean one on unit rows.

This module does not import Ray: the coordinator wraps :class:`ShardState` in an actor.
"""

from __future__ import annotations

import time

import numpy as np

from nmbatch.engine.kernels.exact import closer_to, own_sqdist
from nmbatch.engine.kernels.retire import remove_votes
from nmbatch.engine.metric import check_metric, metric_rows
from nmbatch.engine.rows import RowSource, SourceRows
from nmbatch.engine.threads import kernel_threads
from nmbatch.engine.warmup import warm_up

from .priorities import distinct, respread
from .shard_rows import (
    NO_WEIGHTS,
    RowsInPriorityOrder,
    ShardNested,
    StepResult,
    Votes,
    kept_weights,
    votes,
)

__all__ = ["ShardState", "StepResult", "Votes", "votes"]

_SAFETY = 1.0 + 1e-9  # as relocation.py: an upper bound rounded up
_LOWER_SAFETY = (1.0 - 1e-9) * (1.0 - 2.0**-22)  # as relocation.py: a lower bound down

#: A queued chunk: ``(rows, ids, priority, weights (m,) float64 or None: 1, stride)``.
_Chunk = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", int]


class ShardState:
    """A shard: rows ``(n_s, d)`` float32 sorted by priority, their stream ``ids``
    ``(n_s,)`` int64, priorities ``(n_s,)`` int64 and sample weights, the per-row state
    of nmbatch (labels, norms, bounds) and the ledger ``S_s (k, d)`` float64, ``v_s (k,)``
    int64 (float64 once weighted), ``Q_s (k,)`` float64. A new shard holds no votes: its
    prefix rows join as new rows at its first step (a rebuilt partition after a fault,
    too).

    Sample weights: a row's vote is its weight (``S += w x``, ``v += w``, ``Q += w
    ||x||^2``), by the single-machine kernels, which read the weights from the shard's
    store (:class:`~.shard_rows.RowsInPriorityOrder`) as from a weighted
    ``NestedBatchStore``. The shard is weighted from the first row of weight other than
    1 it is given (its ``v_s`` float64 from then on), unweighted before.

    Parameters
    ----------
    rows : (n_s, d) float32, ids : (n_s,) int64, priority : (n_s,) int64 (distinct)
    n_clusters : int
        ``k``.
    bound_mode : {"auto", "full", "group", "hamerly"}
        The lower bounds kept (:mod:`nmbatch.engine.algorithms.bounds`).
    n_threads : int or None
        Threads of the shard's kernels in a step (BLAS on one,
        :func:`~nmbatch.engine.threads.kernel_threads`); None: every core of its node.
    source : RowSource or None
        Where :meth:`append_ref` reads the rows it is given by reference.
    weights : (n_s,) float64 or None
        The rows' sample weights (each ``>= 0``; None: 1).
    metric : {"euclidean", "cosine"}
        ``"cosine"``: unit rows (``rows``, :meth:`append`'s as given; the module's).
    """

    def __init__(
        self,
        rows: np.ndarray,
        ids: np.ndarray,
        priority: np.ndarray,
        n_clusters: int,
        bound_mode: str = "full",
        n_threads: int | None = None,
        source: RowSource | None = None,
        weights: np.ndarray | None = None,
        metric: str = "euclidean",
    ) -> None:
        self.metric = check_metric(metric)
        order = np.argsort(np.asarray(priority, dtype=np.int64), kind="stable")
        # Copies: arrays from Ray's object store are read-only, and the kernels are
        # compiled (and cached) for writable arrays.
        data = np.ascontiguousarray(np.asarray(rows, dtype=np.float32)[order])
        self.ids = np.asarray(ids, dtype=np.int64)[order]
        self.priority = np.asarray(priority, dtype=np.int64)[order]
        self.n_clusters, self.bound_mode = int(n_clusters), bound_mode
        self.n_threads = n_threads
        # Appended chunks not merged yet (:data:`_Chunk`), and those given by reference,
        # not read yet: (SourceRows, ids, priority, weights or None, stride).
        self._queue: list[_Chunk] = []
        self._unread: list[tuple[SourceRows, np.ndarray, np.ndarray, np.ndarray | None, int]] = []
        self.source = source
        w = kept_weights(weights, self.ids.shape[0])
        self._start(data, NO_WEIGHTS if w is None else np.ascontiguousarray(w[order]))

    def _start(self, data: np.ndarray, weights: np.ndarray) -> None:
        """Fresh per-row state over ``data`` (rows in priority order) weighing ``weights``
        (``(n_s,)`` float64, or :data:`~.shard_rows.NO_WEIGHTS`): no row voted, the
        ledger zero."""
        store = RowsInPriorityOrder(data, weights, self.metric)
        self._algo = ShardNested(store, self.n_clusters, init="first", bound_mode=self.bound_mode,
                                 metric=self.metric)  # fmt: skip
        k, d = self.n_clusters, data.shape[1]
        self.S_s = np.zeros((k, d), dtype=np.float64)
        self.v_s = np.zeros(k, dtype=np.float64 if store.weighted else np.int64)
        self.Q_s = np.zeros(k, dtype=np.float64)
        self._dist2 = np.empty(0, dtype=np.float64)  # relocation: maximin distances

    # -- streaming appends ----------------------------------------------------------------
    def append(
        self, rows: np.ndarray, ids: np.ndarray, priority: np.ndarray, stride: int,
        weights: np.ndarray | None = None,
    ) -> int:
        """Queue rows ``(m, d)`` float32 with stream ``ids`` ``(m,)`` int64 and
        ``priority`` ``(m,)`` int64 (each ``>= tau`` when drawn: above every voted row);
        ``stride``: the step that keeps a raised priority in its residue class;
        ``weights``: ``(m,)`` float64 sample weights (None: 1). Returns ``n_s`` including
        the queue."""
        rows = np.asarray(rows, dtype=np.float32).reshape(-1, self.data.shape[1])
        ids = np.asarray(ids, np.int64)
        w = kept_weights(weights, ids.shape[0])
        self._queue.append((rows, ids, np.asarray(priority, np.int64), w, int(stride)))
        return self._held()

    def append_ref(
        self, rows: SourceRows, ids: np.ndarray, priority: np.ndarray, stride: int,
        weights: np.ndarray | None = None,
    ) -> int:
        """:meth:`append` of rows named by reference
        (:class:`~nmbatch.engine.rows.SourceRows`), read from :attr:`source` at the next
        merge, with those of other calls. Returns ``n_s`` including the queue."""
        if self.source is None:
            raise ValueError("rows given by reference to a shard without a source")
        ids = np.asarray(ids, np.int64)
        w = kept_weights(weights, ids.shape[0])
        self._unread.append((rows, ids, np.asarray(priority, np.int64), w, int(stride)))
        return self._held()

    def _held(self) -> int:
        queued = sum(c[1].shape[0] for c in self._queue) + sum(c[1].shape[0] for c in self._unread)
        return int(self.ids.shape[0] + queued)

    def _read(self) -> None:
        """Read the rows given by reference into the queue, in one call of the source (if
        it raises, nothing is taken from the references: the next merge reads again);
        under ``metric="cosine"`` as unit rows (a zero row: ``ValueError``, naming the
        reference and the row)."""
        if not self._unread:
            return
        assert self.source is not None
        arrays = self.source.read([rows.ref for rows, *_ in self._unread])
        read = []
        for (rows, ids, priority, w, stride), X in zip(self._unread, arrays, strict=True):
            X = np.asarray(X, dtype=np.float32)
            if X.ndim != 2 or X.shape[1] != rows.dim or rows.offsets.max(initial=-1) >= X.shape[0]:
                raise ValueError(f"{rows.ref!r} holds {X.shape}, not rows {rows.shape} of it")
            read.append((metric_rows(X[rows.offsets], self.metric, name=repr(rows.ref)),
                         ids, priority, w, stride))  # fmt: skip
        self._queue.extend(read)
        self._unread = []

    def _merge(self) -> None:
        """Merge the queue: voted rows ``[0, b_s)`` unmoved, the rest sorted by priority."""
        self._read()
        if not self._queue:
            return
        queue, self._queue = self._queue, []
        b = self.batch_size
        stride = queue[-1][4]
        # Queued priorities are >= tau > every voted row's: repeats only within the tail.
        tail_pri = distinct(np.concatenate([self.priority[b:], *(c[2] for c in queue)]), stride)
        order = np.argsort(tail_pri, kind="stable")
        tail_rows = np.concatenate([self.data[b:], *(c[0] for c in queue)])[order]
        tail_ids = np.concatenate([self.ids[b:], *(c[1] for c in queue)])[order]
        data = np.ascontiguousarray(np.concatenate([self.data[:b], tail_rows]))
        self.priority = np.concatenate([self.priority[:b], tail_pri[order]])
        self.ids = np.concatenate([self.ids[:b], tail_ids])
        old = self._algo.store
        weights = NO_WEIGHTS
        if old.weighted or any(c[3] is not None for c in queue):
            queued = [c[3] if c[3] is not None else np.ones(c[1].shape[0]) for c in queue]
            held = old.weights()
            tail_w = np.concatenate([held[b:], *queued])[order]
            weights = np.ascontiguousarray(np.concatenate([held[:b], tail_w]))
        self._restore_store(data, weights, old.batch_size)

    def _restore_store(self, data: np.ndarray, weights: np.ndarray, batch_size: int) -> None:
        """The shard's rows are now ``data`` weighing ``weights`` (the voted ones first);
        a shard that becomes weighted turns its ledger's ``v_s`` into float64."""
        store = RowsInPriorityOrder(data, weights, self.metric)
        store.batch_size = batch_size
        self._algo.store = store
        if store.weighted and self.v_s.dtype != np.float64:
            self.v_s = self.v_s.astype(np.float64)

    def respread(self, tau: int, tau_new: int, levels: int, stride: int) -> None:
        """Map every priority by :func:`~.priorities.respread` (order kept, weakly, residue
        kept): the prefix ``{pi < tau}`` becomes ``{pi < tau_new}``, with the room above
        it restored."""
        self._merge()
        self.priority = respread(self.priority, tau, tau_new, levels, stride)

    def reset(self) -> None:
        """Drop every vote (per-row state and ledger), keep the rows: a restore follows."""
        self._merge()
        self._start(self.data, self._algo.store.weights_buffer)

    def rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of this shard among stream ids ``ids`` ``(m,)`` int64: ``(found ids
        (f,) int64, rows (f, d) float32, weights (f,) float64)``."""
        self._merge()
        at = np.flatnonzero(np.isin(self.ids, np.asarray(ids, np.int64)))
        return self.ids[at].copy(), self.data[at].copy(), self._algo.store.weights()[at].copy()

    # -- retention ------------------------------------------------------------------------
    def retire(self, ids: np.ndarray, before: int) -> tuple[Votes, int, int, np.ndarray | None]:
        """Forget the rows with a stream id in ``ids`` ``(m,)`` int64 or below ``before``.

        Exact, as the single-machine ``KMeansAlgorithm.retire``: a voted row's vote (its
        weight) is taken back (:func:`~nmbatch.engine.kernels.retire.remove_votes` on
        zeroed deltas, added to the ledger), then the rows leave, the others keeping
        their order and their per-row state (labels, norms, bounds), so ``[0, b_s - r)``
        is still the voted part, in priority order. Returns ``(votes, r, n_gone, held)``
        (:data:`Votes`): ``r`` voted rows of the ``n_gone`` retired; ``held`` as in
        :data:`~.shard_rows.StepResult`.
        """
        self._merge()
        gone = self.ids < int(before)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.shape[0]:
            gone |= np.isin(self.ids, ids)
        k, d = self.n_clusters, self.data.shape[1]
        algo, b = self._algo, self.batch_size
        dS, dv, dQ = np.zeros((k, d)), np.zeros(k, dtype=self.v_s.dtype), np.zeros(k)
        rows = np.flatnonzero(gone)
        if not rows.shape[0]:
            return votes(dS, dv, dQ), 0, 0, algo.held()
        voted = rows[rows < b]
        w = algo.store.weights_buffer
        if voted.shape[0]:
            labels, xx, dist2 = algo._vote_arrays()
            remove_votes(self.data, voted, labels, xx, dist2, dS, dv, dQ, np.zeros(k), w)
            self.S_s += dS
            self.v_s += dv
            self.Q_s += dQ
            kept = np.flatnonzero(~gone[:b])
            for per_row in algo._row_arrays():
                per_row[: kept.shape[0]] = per_row[kept]
            labels[kept.shape[0] : b] = -1
        keep = ~gone
        data = np.ascontiguousarray(self.data[keep])
        self._restore_store(data, w[keep] if w.shape[0] else w, b - voted.shape[0])
        algo.batch_size = b - voted.shape[0]
        self.ids, self.priority = self.ids[keep], self.priority[keep]
        return votes(dS, dv, dQ), int(voted.shape[0]), int(rows.shape[0]), self._clear_emptied()

    def _clear_emptied(self) -> np.ndarray | None:
        """A weighted shard's clusters its voting rows hold, ``(k,)`` bool (None
        unweighted), its ledger zeroed for the others (the residue of fractional weights
        added and taken back: ``KMeansAlgorithm._clear_emptied``)."""
        held = self._algo.held()
        if held is not None:
            self.S_s[~held], self.v_s[~held], self.Q_s[~held] = 0.0, 0.0, 0.0
        return held

    def holdings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Every row held, in priority order: ``(rows (n_s, d) float32, ids (n_s,) int64,
        priority (n_s,) int64, weights (n_s,) float64 or None unweighted)`` (copies)."""
        self._merge()
        store = self._algo.store
        weights = store.weights_buffer.copy() if store.weighted else None
        return self.data.copy(), self.ids.copy(), self.priority.copy(), weights

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
        self._merge()
        return np.searchsorted(self.priority, np.asarray(thresholds, np.int64)).astype(np.int64)

    def prefix_rows(self, tau: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows with ``pi(i) < tau``, their priorities and weights: ``((m, d) float32,
        (m,) int64, (m,) float64)``."""
        self._merge()
        m = int(np.searchsorted(self.priority, tau))
        weights = self._algo.store.weights()[:m].copy()
        return self.data[:m].copy(), self.priority[:m].copy(), weights

    # -- one round ------------------------------------------------------------------------
    def step(self, centroids_and_moves: tuple[np.ndarray, np.ndarray], tau: int) -> StepResult:
        """nmbatch's step on this shard's part ``{pi(i) < tau}`` of the prefix.

        ``centroids_and_moves``: ``(C (k, d) float32, p (k,) float64)``, the centroids in
        force and how far each moved at the last update (one ``ray.put`` for all shards).
        Returns ``(votes, n_changed, n_new, n_dist, b_s, seconds, held)``
        (:data:`StepResult`) and adds the deltas to the ledger (a weighted shard then
        zeroes the clusters it holds no vote of: :meth:`_clear_emptied`).
        """
        t0 = time.perf_counter()
        C, p = centroids_and_moves
        self._merge()
        b = int(np.searchsorted(self.priority, tau))
        C = np.array(C, dtype=np.float32, order="C")
        p = np.array(p, dtype=np.float64)
        with kernel_threads(self.n_threads):
            dS, dv, dQ, n_changed, n_new, n_dist = self._algo.shard_step(C, p, b)
        self.S_s += dS
        self.v_s += dv
        self.Q_s += dQ
        held = self._clear_emptied()
        return votes(dS, dv, dQ), n_changed, n_new, n_dist, b, time.perf_counter() - t0, held

    def warm_up(self) -> float:
        """Load every kernel a step runs in this process (:func:`~nmbatch.engine.warmup.
        warm_up`), so the first round does not wait for numba; returns the seconds."""
        return warm_up()

    def ledger(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(S_s, v_s, Q_s)``: the votes this shard's rows hold (copies)."""
        return self.S_s.copy(), self.v_s.copy(), self.Q_s.copy()

    def assignments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids (n_s,) int64, priority (n_s,) int64, labels (n_s,) int32)`` of every row
        (``-1``: not in the prefix or not voted yet), in priority order."""
        self._merge()
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
        self._merge()
        b = self.batch_size
        labels = self._algo._labels
        self._dist2 = own_sqdist(self.data, b, labels, np.asarray(C)) if b else self._dist2[:0]
        return self.relocation_best(v)

    def relocation_best(self, v: np.ndarray) -> tuple[float, int, int] | None:
        """``(dist2, priority, row)`` of this shard's farthest row with a vote (weight > 0)
        whose cluster keeps some under the global counts ``v`` (``(k,)``: ``v(a) - w > 0``;
        unweighted ``v(a) >= 2``), ties to the lowest priority; None when no row is off
        its centroid. A row refused for its cluster stays refused (within a relocation
        no such count grows back)."""
        dist2, labels = self._dist2, self._algo._labels
        weights = self._algo.store.weights_buffer
        while dist2.shape[0]:
            row = int(np.argmax(dist2))
            if dist2[row] <= 0.0:
                return None
            w = weights[row] if weights.shape[0] else 1
            if w > 0 and v[labels[row]] - w > 0:
                return float(dist2[row]), int(self.priority[row]), row
            dist2[row] = -1.0
        return None

    def relocation_take(
        self, row: int, j: int, C_prev: np.ndarray
    ) -> tuple[int, np.ndarray, float, int, float]:
        """Move the vote of ``row`` (``w x``, ``w``, ``w ||x||^2``) to the empty cluster
        ``j`` (ledger, label, bounds, as
        :func:`~nmbatch.engine.algorithms.relocation.relocate_empty`); ``C_prev``: the
        centroids before the update, ``(k, d)`` float32. Returns ``(a, x (d,) float64,
        ||x||^2, id, w)``, ``a`` the cluster it left, ``id`` the sample's stream id, ``w``
        its weight."""
        algo = self._algo
        a = int(algo._labels[row])
        x = self.data[row].astype(np.float64)
        xx = float(algo._xx[row])
        weights = algo.store.weights_buffer
        w = float(weights[row]) if weights.shape[0] else 1.0
        vote = 1 if self.v_s.dtype == np.int64 else w
        self.S_s[a] -= w * x
        self.v_s[a] -= vote
        self.Q_s[a] -= w * xx
        self.S_s[j] += w * x
        self.v_s[j] += vote
        self.Q_s[j] += w * xx
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
        return a, x, xx, int(self.ids[row]), w

    def relocation_next(self, x: np.ndarray, v: np.ndarray) -> tuple[float, int, int] | None:
        """After a sample ``x`` (``(d,)`` float64) was relocated: ``d(i)^2 = min(d(i)^2,
        ||x(i) - x||^2)``, then :meth:`relocation_best` under ``v``."""
        if self._dist2.shape[0]:
            closer_to(self._dist2, self.data, self._dist2.shape[0], x)
        return self.relocation_best(v)

