"""The coordinator of distributed nmbatch: ``C``, ``S``, ``v``, ``Q``/``sse``, ``tau``, rounds.

One round (:meth:`Coordinator.step`), the single-machine ``NestedMiniBatch.step`` spread
over ``P`` shard actors (:mod:`.shard`):

1. **Batch size**: ``b`` by the same rule (``b_0`` at the first round, ``min(2b, N)``
   after a passed doubling test, else ``b``); ``tau`` is raised until exactly ``b``
   priorities of the whole store are below it (:meth:`_select_tau`: a 64-way search on
   the shards' counts, a few tiny round trips per doubling; no row moves).
2. ``(C, p)`` goes to the object store once (``ray.put``); every shard runs nmbatch's
   revisit and new-row assignment on its part of the prefix and returns
   ``(dS, dv, dQ)`` and its counts.
3. The deltas are added in a fixed shard order (float64); the centroid update, the
   relocation of empty clusters and the doubling test are the single-machine ones
   (the same kernel ``centroid_update``, the same ``_doubling_test``; relocation by the
   same farthest-point rule, each shard proposing its farthest row, one round trip per
   empty cluster).

``metric="cosine"`` is the local engine's spherical k-means (docs/design.md): unit rows
on the shards (:mod:`.shard`), ``c(j) = S(j)/||S(j)||`` by the same kernel, the doubling
test on the direction (``_unit``), the energy ``1 - cos``.

Traffic per round: ``P`` copies of ``C`` and ``p`` in (``4kd + 8k`` bytes each) and ``P``
deltas out, each naming only the clusters the shard changed (at most ``8kd + 24k``
bytes, :data:`~.shard.Votes`): O(P k d), whatever ``b`` (``round_bytes``).

Faults: a call that raises Ray's ``RayActorError`` (the actor was killed, its process
died, or its node left the cluster) marks the shard lost. The coordinator subtracts the
shard's ledger (its copy of the sums of every delta the shard returned) from ``S``,
``v`` and ``Q``, starts a new actor on the same partition (the rows are in the object
store: ``ray.put`` by the driver, owned by it), which holds no votes: its prefix rows
join at the next round as new rows, and the iterations go on.

Ray mechanisms used: actors (one per shard, ``num_cpus=0`` so a replacement fits on any
surviving node; shard ``s`` is placed with a soft ``NodeAffinitySchedulingStrategy`` on
the ``s``-th alive node in node-id order, round robin, so the shards are spread over
the nodes, which Ray's ``"SPREAD"`` hint did not do for actors taking no CPU (soft: Ray
may still place a shard elsewhere while its node is unavailable, and a replacement whose
node has just gone lands on any surviving one),
named actors (``nmbatch-shard-<run>-<s>``: a test or an operator can find them), the
object store (rows put once, ``(C, p)`` once per round), and actor-death errors for
failure detection. Not used: ``max_restarts`` (a restarted actor would come back
empty and the coordinator must subtract its ledger anyway; one explicit replacement path
covers ``ray.kill``, which never restarts by default, and a lost node alike) and
placement groups (nothing to reserve: shards take no CPU slot).
"""

from __future__ import annotations

import contextlib
import pickle
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.algorithms.base import KMeansAlgorithm
from nmbatch.engine.algorithms.growth import (
    B0_PER_CLUSTER,
    doubling_allowance,
    doubling_rho,
    first_batch_size,
)
from nmbatch.engine.kernels import centroid_update
from nmbatch.engine.metric import check_metric, metric_rows
from nmbatch.engine.rows import RowSource
from nmbatch.engine.seeding import initial_centroids
from nmbatch.engine.state import IterationStats, ModelState

from .relocation import relocate_on_shards
from .shard import ShardState, Votes

__all__ = ["MAX_LOSSES_IN_A_ROW", "PRIORITY_LIMIT", "Coordinator", "Partition", "shard_options"]

_SEARCH_WAYS = 64  # thresholds per round trip of the tau search
MAX_LOSSES_IN_A_ROW = 5
"""A shard lost more often than this without answering once between (an actor that dies
as it starts: its node cannot import or unpickle it) stops the run with RuntimeError."""
PRIORITY_LIMIT = 1 << 62
"""Priorities are distinct int64 in ``[0, PRIORITY_LIMIT)``."""

#: One shard's data: ``(rows ObjectRef of (n_s, d) float32, ids (n_s,) int64,
#: priority (n_s,) int64)``, and optionally ``weights (n_s,) float64 or None`` (every
#: weight 1) as a fourth member.
Partition = tuple[Any, ...]

ShardActor = ray.remote(ShardState)


def shard_options(s: int, name: str) -> dict[str, Any]:
    """Ray actor options for shard ``s`` named ``name``: no CPU slot, placed (softly) on
    the ``s``-th alive node in node-id order, round robin."""
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    options: dict[str, Any] = {"name": name, "num_cpus": 0}
    if nodes:
        node = nodes[s % len(nodes)]
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
    return options


class Coordinator:
    """Distributed nmbatch over ``P`` shard actors (the driver process holds this).

    Parameters
    ----------
    partitions : sequence of :data:`Partition`
        One per shard, in the fixed shard order.
    n_clusters : int
        ``k``.
    dim : int
        ``d``.
    init : "first", "k-means++" or (k, d) float32
        As ``NestedMiniBatch``: from the rows of the first batch, in priority order (given
        centroids are normalised under ``metric="cosine"``).
    rho, batch_size, relocate_empty, bound_mode :
        As the single-machine ``NestedMiniBatch``.
    random_state : int or None
        Seeds k-means++.
    n_threads : int or None
        Threads of each shard's kernels (:class:`~.shard.ShardState`); None: all its
        node's cores.
    source : RowSource or None
        Given to every shard actor: where it reads rows appended by reference
        (:mod:`nmbatch.engine.rows`, :meth:`~.stream.StreamCoordinator.append`).
    metric : {"euclidean", "cosine"}
        ``"cosine"``: spherical k-means; the partitions' rows must be unit rows already
        (:func:`~.fit.fit_distributed` gives them so).
    """

    name = "nmbatch"

    def __init__(
        self,
        partitions: Sequence[Partition],
        n_clusters: int,
        dim: int,
        *,
        init: str | np.ndarray = "k-means++",
        rho: float = 100.0,
        batch_size: int = 5000,
        relocate_empty: bool = True,
        bound_mode: str = "auto",
        random_state: int | None = None,
        n_threads: int | None = None,
        source: RowSource | None = None,
        metric: str = "euclidean",
    ) -> None:
        self.metric = check_metric(metric)
        self._unit = self.metric == "cosine"  # unit centroids; _doubling_test reads it
        if not isinstance(init, str):
            init = metric_rows(as_float32_matrix(init, dim=int(dim), name="init"),
                               self.metric, name="init")  # fmt: skip
        self.partitions = list(partitions)
        self.source = source
        self.n_threads = n_threads
        self.n_clusters, self.dim = int(n_clusters), int(dim)
        self.n_samples = int(sum(len(part[1]) for part in self.partitions))
        self.rho, self.initial_batch_size = float(rho), int(batch_size)
        self.relocate_empty, self.bound_mode = bool(relocate_empty), bound_mode
        self._init, self._rng = init, np.random.default_rng(random_state)
        k, d, P = self.n_clusters, self.dim, len(self.partitions)
        self.centroids = np.zeros((k, d), dtype=np.float32)
        self.S = np.zeros((k, d), dtype=np.float64)
        self.v = np.zeros(k, dtype=np.int64)
        self.Q = np.zeros(k, dtype=np.float64)
        self.sse = np.zeros(k, dtype=np.float64)
        self.p = np.zeros(k, dtype=np.float64)
        # The coordinator's copy of every shard's ledger (S_s, v_s, Q_s).
        self.ledgers = [
            [np.zeros((k, d)), np.zeros(k, dtype=np.int64), np.zeros(k)] for _ in range(P)
        ]
        self.iteration = self.batch_size = self.tau = 0
        self.initialized = self.converged = self._grow = self._covered_all = False
        self.n_relocated = 0
        self._regrow_to = 0  # the batch before a retirement, refilled by the next round
        self.relocated_ids: list[int] = []  # stream ids relocated by the last round
        self.round_bytes: list[tuple[int, int]] = []  # (sent, received) per round
        # Per round: the slowest shard's own time in its step (the rest is Ray and us).
        self.round_shard_seconds: list[float] = []
        self.n_lost = 0  # shards replaced since the start
        self._replaced = False  # a shard replaced since the last round: unvoted rows < tau
        self.n_retired = 0  # rows retired since the start
        self.run_id = uuid.uuid4().hex[:12]
        self.generation = [0] * P
        self._losses = [0] * P  # per shard: losses since its last answer
        self.shards = [self._start_shard(s) for s in range(P)]

    # -- shards ----------------------------------------------------------------------------
    def _start_shard(self, s: int) -> Any:
        rows, ids, priority, *weights = self.partitions[s]
        name = f"nmbatch-shard-{self.run_id}-{s}-{self.generation[s]}"
        return ShardActor.options(**shard_options(s, name)).remote(
            rows, ids, priority, self.n_clusters, self.bound_mode, self.n_threads, self.source,
            weights[0] if weights else None, self.metric,
        )  # fmt: skip

    def shard_name(self, s: int) -> str:
        """The Ray actor name of shard ``s`` now."""
        return f"nmbatch-shard-{self.run_id}-{s}-{self.generation[s]}"

    def _lose(self, s: int) -> None:
        """Shard ``s`` is gone: subtract its ledger exactly, start a new actor, unvoted."""
        S_s, v_s, Q_s = self.ledgers[s]
        self.S -= S_s
        self.v -= v_s
        self.Q -= Q_s
        self.ledgers[s] = [np.zeros_like(S_s), np.zeros_like(v_s), np.zeros_like(Q_s)]
        # An actor only unreachable (ActorUnavailableError) may still live: end it, so
        # each partition has one actor.
        with contextlib.suppress(Exception):
            ray.kill(self.shards[s])
        self.n_lost += 1
        self._replaced = True
        self.generation[s] += 1
        self.shards[s] = self._start_shard(s)
        self.converged = False

    def _gather(self, refs: Sequence[Any]) -> list[Any]:
        """``ray.get`` of one call per shard, in shard order; ``None`` (and the shard
        replaced) where the actor died."""
        out: list[Any] = []
        for s, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
                self._losses[s] = 0
            except RayActorError as exc:
                self._losses[s] += 1
                if self._losses[s] > MAX_LOSSES_IN_A_ROW:  # it cannot even start: give up
                    raise RuntimeError(f"shard {s} was lost {self._losses[s]} times in a row "
                                       f"without answering: {exc}") from exc  # fmt: skip
                out.append(None)
                self._lose(s)
        return out

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every shard, results in shard order (None: shard lost)."""
        return self._gather([getattr(a, method).remote(*args) for a in self.shards])

    # -- the prefix threshold -------------------------------------------------------------
    def _select_tau(self, b: int) -> int:
        """The ``tau`` with exactly ``b`` priorities of the store below it (priorities are
        distinct, so the count grows by at most one per integer and the search ends)."""
        lo, hi = self.tau, PRIORITY_LIMIT  # count(lo) <= b <= count(hi) = N
        while True:
            W = _SEARCH_WAYS
            ts = np.unique(np.array([lo + (hi - lo) * t // W for t in range(W + 1)], np.int64))
            counts = self._counts(ts)
            exact = np.flatnonzero(counts == b)
            if exact.shape[0]:
                return int(ts[exact[0]])
            above = int(np.searchsorted(counts, b))  # first threshold with count > b
            lo, hi = int(ts[above - 1]), int(ts[above])

    def _counts(self, thresholds: np.ndarray) -> np.ndarray:
        while True:  # a shard lost meanwhile is replaced and counted again
            parts = self.call_all("count_below", thresholds)
            if all(c is not None for c in parts):
                return np.sum(parts, axis=0)

    def _first_rows(self, tau: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows with priority below ``tau`` in priority order and their weights:
        ``((b, d) float32, (b,) float64)``."""
        while True:
            parts = self.call_all("prefix_rows", tau)
            if all(part is not None for part in parts):
                break
        order = np.argsort(np.concatenate([pr for _, pr, _ in parts]), kind="stable")
        rows = np.concatenate([r for r, _, _ in parts])[order]
        return rows, np.concatenate([w for _, _, w in parts])[order]

    def _target_batch(self, n: int) -> int:
        """``NestedMiniBatch._target_batch``: the doubling rule, a batch that held every
        row takes in every new one, and retired prefix rows are replaced by the next
        priorities up to the batch before the retirement."""
        if not self.initialized:
            return first_batch_size(self.initial_batch_size, self.n_clusters, n, B0_PER_CLUSTER)
        if self._covered_all:
            return n
        target = min(2 * self.batch_size, n) if self._grow else self.batch_size
        return max(target, min(self._regrow_to, n))

    def _add_votes(self, s: int, votes: Votes) -> None:
        """Add shard ``s``'s change of the sums (:data:`~.shard.Votes`) to ``S``, ``v``,
        ``Q`` and to its ledger (float64, the clusters it names are distinct). The first
        weighted change (``dv`` float64) turns ``v`` and the ledgers' counts into float64
        sums of weights, as ``KMeansAlgorithm._weigh_sums`` does on one machine."""
        j, dS, dv, dQ = votes
        if dv.dtype == np.float64 and self.v.dtype != np.float64:
            self.v = self.v.astype(np.float64)
            for ledger in self.ledgers:
                ledger[1] = ledger[1].astype(np.float64)
        for sums in ((self.S, self.v, self.Q), self.ledgers[s]):
            sums[0][j] += dS
            sums[1][j] += dv
            sums[2][j] += dQ

    def _take_back(self, results: Sequence[Any]) -> None:
        """Add the shards' retirement deltas (:meth:`~.shard.ShardState.retire` results, in
        shard order; None: lost) to the sums and the ledgers, shrink ``b`` to the rows
        left below ``tau`` and recompute ``sse`` under the centroids in force (as one
        machine does: the next round moves them). ``b`` is the voted rows retired taken
        off, or, when a shard was lost since the last round (its replacement's rows below
        ``tau`` hold no vote yet, or this call lost one), counted again on the shards."""
        b_old = self.batch_size
        if self._replaced or any(res is None for res in results):
            for s, res in enumerate(results):
                if res is not None:
                    self._add_votes(s, res[0])
            self.batch_size = int(self._counts(np.array([self.tau], np.int64))[0])
        else:
            for s, res in enumerate(results):
                self._add_votes(s, res[0])
            self.batch_size -= sum(res[1] for res in results)
        self._clear_emptied([res[3] if res is not None else None for res in results])
        if self.batch_size < b_old:
            self._regrow_to = max(self._regrow_to, b_old)
        if self.initialized:
            centroid_update(self.S, self.v, self.Q, self.centroids, sse_out=self.sse)
        self.converged = False

    def _clear_emptied(self, held: Sequence[np.ndarray | None]) -> None:
        """Zero the sums of every cluster no shard holds a vote of, and each weighted
        shard's ledger copy where that shard holds none (``KMeansAlgorithm.
        _clear_emptied``: the residue of fractional weights added and taken back).
        ``held[s]``: shard ``s``'s ``(k,)`` bool from its step or retirement; None from an
        unweighted or lost shard, whose integer ledger says it."""
        if all(h is None for h in held):
            return
        anywhere = np.zeros(self.n_clusters, dtype=bool)
        for s, h in enumerate(held):
            if h is None:
                anywhere |= self.ledgers[s][1] != 0
                continue
            for part in self.ledgers[s]:
                part[~h] = 0
            anywhere |= h
        for sums in (self.S, self.v, self.Q, self.sse):
            sums[~anywhere] = 0

    def _initialise(self, first: tuple[np.ndarray, np.ndarray]) -> None:
        """Seed the centroids from the first rows ``(b, d)`` float32 and their weights
        ``(b,)`` float64 (drawn by weight, as one machine does)."""
        X, w = first
        weights = w if np.any(w != 1.0) else None
        self.centroids = initial_centroids(self._init, X, self.n_clusters, self._rng, weights)
        self.initialized = True

    # -- one round ----------------------------------------------------------------------
    def step(self) -> IterationStats:
        """One iteration of nmbatch over all shards; returns what it did."""
        t0 = time.perf_counter()
        n_now = self.n_samples
        b = min(max(self._target_batch(n_now), self.n_clusters), n_now)
        if b != self.batch_size or not self.iteration:
            self.tau = self._select_tau(b)
        if not self.initialized:
            self._initialise(self._first_rows(self.tau))
        message = (self.centroids, self.p)
        ref = ray.put(message)
        results = self.call_all("step", ref, self.tau)
        sent = len(self.shards) * _pickled_size((message, self.tau))
        received = 0
        n_changed = n_new = n_dist = 0
        shard_seconds = 0.0
        for s, res in enumerate(results):  # fixed shard order, float64
            if res is None:
                continue
            votes, changed, new, dist, _, seconds, _ = res
            shard_seconds = max(shard_seconds, seconds)
            received += _pickled_size(res)
            self._add_votes(s, votes)
            n_changed, n_new, n_dist = n_changed + changed, n_new + new, n_dist + dist
        self._clear_emptied([res[6] if res is not None else None for res in results])
        self.round_bytes.append((sent, received))
        self._replaced = any(res is None for res in results)
        self.round_shard_seconds.append(shard_seconds)
        self.batch_size = b
        C_prev = self.centroids
        self.centroids, self.p = centroid_update(self.S, self.v, self.Q, C_prev, sse_out=self.sse,
                                                 unit=self._unit)  # fmt: skip
        empty = np.flatnonzero(self.v == 0)  # _relocate fills them in this order
        self.n_relocated = self._relocate(C_prev) if self.relocate_empty else 0
        n_changed += self.n_relocated
        self.iteration += 1
        lost = any(r is None for r in results)
        self.converged = (
            b == n_now and n_new == 0 and not lost and n_changed == 0 and not self.p.any()
        )
        allowed = doubling_allowance(self.initial_batch_size, self.n_clusters)
        rho = doubling_rho(self.rho, self.initial_batch_size, self.n_clusters)
        self._grow = KMeansAlgorithm._doubling_test(self, rho, allowed)  # the same rule
        self._covered_all = b == n_now
        self._regrow_to = 0
        n_possible = b * self.n_clusters
        return IterationStats(
            iteration=self.iteration, batch_size=b,
            next_batch_size=min(2 * b, n_now) if self._grow else b, n_samples=n_now,
            n_changed=n_changed, n_new=n_new, doubled=self._grow, converged=self.converged,
            n_distances=n_dist, n_skipped=n_possible - n_dist,
            seconds=time.perf_counter() - t0, n_relocated=self.n_relocated,
            relocated=tuple(int(j) for j in empty[: self.n_relocated]),
        )  # fmt: skip

    def _relocate(self, C_prev: np.ndarray) -> int:
        """Empty clusters take the farthest samples of the prefix
        (:func:`~.relocation.relocate_on_shards`); returns how many got one."""
        return relocate_on_shards(self, C_prev)

    # -- reporting --------------------------------------------------------------------------
    def energy_estimate(self) -> float:
        """Mean ``d(i)^2`` over the voted prefix samples (``sse.sum() / v.sum()``, ``v``
        the weight of the samples held: their number, unweighted); under
        ``metric="cosine"`` the mean cosine dissimilarity ``1 - cos = d(i)^2 / 2``
        (``KMeansAlgorithm.energy_estimate``)."""
        b = float(self.v.sum())
        if b <= 0:
            return float("nan")
        return float(max(self.sse.sum(), 0.0) / b) / (2.0 if self._unit else 1.0)

    def state(self, stats: IterationStats | None = None) -> ModelState:
        """The model as it stands, as one record."""
        energy = self.energy_estimate() if self.iteration > 0 else None
        return ModelState(
            centroids=self.centroids.copy(), counts=self.v.copy(),
            batch_size=int(self.batch_size), n_samples=self.n_samples,
            iteration=int(self.iteration), converged=bool(self.converged),
            initialized=bool(self.initialized), energy=energy, stats=stats,
            n_retired=self.n_retired, n_ingested=self.n_samples + self.n_retired,
        )  # fmt: skip

    def close(self) -> None:
        """End every shard actor."""
        for actor in self.shards:
            ray.kill(actor)


def _pickled_size(obj: object) -> int:
    """Bytes of ``obj`` as Ray serialises it: pickle protocol 5 with the arrays' buffers
    out of band (counted, not copied)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(head) + sum(b.raw().nbytes for b in buffers)
