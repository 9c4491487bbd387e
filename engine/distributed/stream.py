"""Streaming distributed nmbatch: rows appended between rounds, restore from centroids.

:class:`StreamCoordinator` is the phase-1 :class:`~.coordinator.Coordinator` started on
empty shards and fed by :meth:`StreamCoordinator.append`, one call per log entry: the
entry's rows go to one shard, the next entry to the next shard (round robin by entry,
independent of the values, so each shard's part of the prefix is a uniform sample of
its part of the store and the parts are balanced up to the entries' sizes).

Priorities of appended rows: **uniform at random in** ``[tau, PRIORITY_LIMIT)``, ``tau``
the prefix threshold in force. Of the two choices the issue leaves (above all existing
priorities, or random), this one keeps the single-machine store's semantics: there a new
row is shuffled into a uniformly random place of the *tail* (the rows not in the prefix;
``NestedBatchStore.append``), never into the prefix. Here too:

- the prefix ``{pi < tau}`` does not change when rows arrive (the new priorities are
  ``>= tau``), so the votes and the ledgers stay exact, and the prefix is still the set of
  the lowest-priority samples;
- the rows waiting above ``tau`` are in a uniformly random priority order whatever the
  order of arrival, so every later doubling (raising ``tau``) takes a uniform random
  subset of the waiting rows, old and new alike. Priorities above all existing ones
  would instead make a doubling take the oldest waiting rows first: under drift the
  prefix would lag behind the stream.

Priorities are distinct over the whole store: shard ``s`` of ``P`` draws only values
``= s (mod P)`` (no two shards share one), and a shard raises a value repeating one it
holds by ``P`` (:func:`~.priorities.distinct`; a repeat has a chance of about ``n^2 / 2^63``).

The room for new priorities, ``[tau, PRIORITY_LIMIT)``, shrinks as ``tau`` rises; once
``tau`` has used half of it in a round whose prefix holds every row (a converged stream,
where every round takes in all new rows), :meth:`StreamCoordinator.respread` maps all
priorities down in order, the prefix to the bottom, and the room is whole again.

Rows come in one of two ways (:meth:`StreamCoordinator.append`): as an array, put in
Ray's object store by this driver, or **by reference**
(:class:`~nmbatch.engine.rows.SourceRows`: with a ``source`` the shards read from, the
service's Redis log). By reference, the rows never pass through the driver: the shard
reads them itself, from its own node.

Faults: each shard's appended chunks ``(rows, ids, priority, weights)`` are kept by the
coordinator in order (``rows`` an ObjectRef owned by this driver, or the
:class:`~nmbatch.engine.rows.SourceRows` naming them; ids, priorities and retired flags,
17 bytes a row, and the weights of weighted chunks, 8 more, in the driver's memory), so
a lost shard is replaced as the estimator's is (its ledger subtracted, a new actor given
the same chunks in the same order, unvoted): by reference, the new actor reads its
partition from the source again, and no copy of the rows is kept anywhere but there.
When the source moves rows (the service compacts a reservoir into a new base),
:meth:`StreamCoordinator.rebase` points the records at their new place. A lost driver
(the service restarts) rebuilds everything from the Redis log.

Retention (:meth:`StreamCoordinator.retire`): the worker's policy hands over ids below a
threshold (window, age: global in acceptance order) and single ids (reservoir); every
shard retires its own and takes back their votes (:meth:`~.shard.ShardState.retire`);
the chunk records forget what was retired (see the method), so a replacement shard
holds exactly the retained rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

from nmbatch.engine.algorithms.base import move_changed_centroids
from nmbatch.engine.kernels import centroid_update
from nmbatch.engine.metric import metric_rows
from nmbatch.engine.rows import SourceRows
from nmbatch.engine.state import IterationStats

from .coordinator import PRIORITY_LIMIT, Coordinator
from .priorities import respread
from .shard_rows import kept_weights

__all__ = ["Chunk", "StreamCoordinator"]

#: A chunk record: ``(rows ObjectRef or SourceRows, ids (m,) int64, priority (m,) int64,
#: weights (m,) float64 or None: every weight 1)`` (a :data:`~.coordinator.Partition`).
Chunk = tuple[Any, np.ndarray, np.ndarray, "np.ndarray | None"]

_HEADROOM = 1 << 40  # room above the drawn priorities for the raises of repeats
_LEVELS = 1 << 40  # respread: the prefix's priorities in [0, _LEVELS * P)
_RESPREAD_AT = PRIORITY_LIMIT // 2  # respread once tau has used half the room
_NONE = np.empty(0, dtype=np.int64)
_COMPACT_MIN = 4096
"""A shard's chunk records are compacted (:meth:`StreamCoordinator._compact_records`)
once they carry more retired rows than this and than stored ones (the object store keeps
a record's rows while any of them is stored)."""


class StreamCoordinator(Coordinator):
    """A :class:`~.coordinator.Coordinator` over ``n_shards`` shards that start empty.

    Parameters
    ----------
    n_shards : int
        ``P >= 1``.
    n_clusters, dim :
        ``k`` and ``d``.
    seed : int or None
        Seeds the priorities and k-means++ (two independent streams).
    **kwargs :
        ``init``, ``rho``, ``batch_size``, ``relocate_empty``, ``bound_mode``,
        ``source``, ``metric``, as the :class:`~.coordinator.Coordinator` (under
        ``metric="cosine"`` :meth:`append` normalises the arrays it is given).
    """

    def __init__(
        self, n_shards: int, n_clusters: int, dim: int, *, seed: int | None = None, **kwargs: Any
    ) -> None:
        if int(n_shards) < 1:
            raise ValueError(f"n_shards must be >= 1, got {n_shards}")
        priority_seq, init_seq = np.random.SeedSequence(seed).spawn(2)
        self._priority_rng = np.random.default_rng(priority_seq)
        init_seed = int(init_seq.generate_state(1, np.uint64)[0] >> np.uint64(1))
        P, d = int(n_shards), int(dim)
        # Chunks appended to each shard, in order: (rows ObjectRef, ids, priority), and
        # which of each chunk's rows are still stored (retention).
        self.chunks: list[list[Chunk]] = [[] for _ in range(P)]
        self.alive: list[list[np.ndarray]] = [[] for _ in range(P)]
        self.next_id = 0  # above every stream id appended
        self._next_shard = 0
        empty = (
            ray.put(np.empty((0, d), np.float32)),
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            None,
        )
        super().__init__([empty] * P, n_clusters, d, random_state=init_seed, **kwargs)

    def _start_shard(self, s: int) -> Any:
        """A new (or replacement) actor for shard ``s``, given its chunks in order, then
        told which of their rows were retired."""
        actor = super()._start_shard(s)
        if not hasattr(self, "alive"):  # the first actors, from Coordinator.__init__
            return actor
        for chunk in self.chunks[s]:
            _send(actor, chunk, len(self.partitions))  # calls run in this order
        dead = [c[1][~alive] for c, alive in zip(self.chunks[s], self.alive[s], strict=True)]
        if dead and sum(d.shape[0] for d in dead):
            actor.retire.remote(np.concatenate(dead), 0)
        return actor

    # -- appends --------------------------------------------------------------------------
    def priorities(self, m: int, s: int) -> np.ndarray:
        """``m`` priorities for shard ``s``: uniform in ``[tau, PRIORITY_LIMIT)`` among the
        values ``= s (mod P)``, ``(m,)`` int64 (see the module)."""
        P = len(self.partitions)
        high = max(PRIORITY_LIMIT - _HEADROOM, self.tau + 1)  # tau above it: a respread due
        u = self._priority_rng.integers(self.tau, high, size=m)
        pri = u - u % P + s
        pri[pri < self.tau] += P
        return pri.astype(np.int64)

    def append(
        self, X: np.ndarray | SourceRows, ids: np.ndarray, weights: np.ndarray | None = None
    ) -> int:
        """Append the rows of one log entry, ``X`` ``(m, d)`` float32 or the
        :class:`~nmbatch.engine.rows.SourceRows` naming them (read by the shard from the
        ``source``), with stream ``ids`` ``(m,)`` int64 and sample ``weights`` ``(m,)``
        float64 (None: 1; a vote is its weight, on the shard as on one machine), to the
        next shard in turn (not waiting for it); returns ``N``. Under ``metric="cosine"``
        an array's rows are normalised here, before they are put in the object store (a
        zero row: :class:`~nmbatch.engine.metric.ZeroRowError`, a ``ValueError`` naming
        it, and nothing is appended); rows by reference are normalised by the shard that
        reads them."""
        if not isinstance(X, SourceRows):
            X = np.ascontiguousarray(X, dtype=np.float32)
        m = X.shape[0]
        if len(X.shape) != 2 or X.shape[1] != self.dim or np.shape(ids) != (m,):
            raise ValueError(f"rows of shape {X.shape} with {np.shape(ids)} ids for dim {self.dim}")
        if not isinstance(X, SourceRows):
            X = metric_rows(X, self.metric)
        if isinstance(X, SourceRows) and self.source is None:
            raise ValueError("rows by reference need a source")
        if not m:
            return self.n_samples
        s = self._next_shard
        self._next_shard = (s + 1) % len(self.partitions)
        rows = X if isinstance(X, SourceRows) else ray.put(X)
        chunk = (rows, np.asarray(ids, np.int64).copy(), self.priorities(m, s),
                 kept_weights(weights, m))  # fmt: skip
        self.chunks[s].append(chunk)
        self.alive[s].append(np.ones(m, dtype=bool))
        self.next_id = max(self.next_id, int(chunk[1].max()) + 1)
        # Not waited for: a dead actor's failure shows at the next round, which replaces
        # it with every chunk, this one included.
        _send(self.shards[s], chunk, len(self.partitions))
        self.n_samples += m
        self.converged = False
        return self.n_samples

    def retire(self, ids: np.ndarray | None = None, before: int = 0) -> int:
        """Forget the stored rows with a stream id in ``ids`` (each stored, else
        ``ValueError`` and nothing changes) or below ``before``: every shard takes back
        the votes of its own (:meth:`~.shard.ShardState.retire`), the coordinator adds
        their deltas in shard order (:meth:`~.coordinator.Coordinator._take_back`).
        The chunk records drop fully retired chunks and remember the rest, so a
        replacement shard retires the same rows; a shard whose records hold more retired
        rows than stored ones (and over :data:`_COMPACT_MIN`) gets one chunk of what it
        holds instead. Returns ``N`` after."""
        ids = np.unique(np.asarray(ids if ids is not None else (), dtype=np.int64))
        found, gone = 0, [[] for _ in self.chunks]
        for s, (chunks, alive) in enumerate(zip(self.chunks, self.alive, strict=True)):
            for c, (_, chunk_ids, *_) in enumerate(chunks):
                hit = alive[c] & (chunk_ids < before)
                if ids.shape[0]:
                    listed = alive[c] & np.isin(chunk_ids, ids)
                    found += int(np.count_nonzero(listed))
                    hit |= listed
                gone[s].append(hit)
        if found != ids.shape[0]:
            raise ValueError(f"{ids.shape[0] - found} of the ids are not stored")
        n_gone = 0
        for s, hits in enumerate(gone):  # records first: a replacement retires these too
            for c, hit in enumerate(hits):
                self.alive[s][c] &= ~hit
                n_gone += int(np.count_nonzero(hit))
            kept = [c for c, alive in enumerate(self.alive[s]) if alive.any()]
            self.chunks[s] = [self.chunks[s][c] for c in kept]
            self.alive[s] = [self.alive[s][c] for c in kept]
        if not n_gone:
            return self.n_samples
        self.n_samples -= n_gone
        self.n_retired += n_gone
        self._take_back(self.call_all("retire", ids, int(before)))
        for s in range(len(self.chunks)):
            dead = sum(int(np.count_nonzero(~a)) for a in self.alive[s])
            live = sum(int(np.count_nonzero(a)) for a in self.alive[s])
            if dead > max(live, _COMPACT_MIN):
                self._compact_records(s)
        return self.n_samples

    def _compact_records(self, s: int) -> None:
        """Shard ``s``'s chunk records drop their retired rows: by reference, each names
        only its stored rows; else they become one chunk of the rows the shard holds (put
        in the object store by this driver, which owns it; left as they are if the shard
        was lost)."""
        if all(isinstance(rows, SourceRows) for rows, *_ in self.chunks[s]):
            records = zip(self.chunks[s], self.alive[s], strict=True)
            self.chunks[s] = [(r[a], ids[a], pri[a], None if w is None else w[a])
                              for (r, ids, pri, w), a in records]  # fmt: skip
            self.alive[s] = [np.ones(c[1].shape[0], dtype=bool) for c in self.chunks[s]]
            return
        holdings = self._gather([self.shards[s].holdings.remote()])[0]
        if holdings is None:
            return
        rows, ids, priority, weights = holdings
        self.chunks[s] = [(ray.put(rows), ids, priority, weights)] if ids.shape[0] else []
        self.alive[s] = [np.ones(ids.shape[0], dtype=bool)] if ids.shape[0] else []

    def rebase(self, rows: Sequence[SourceRows], ids: Sequence[np.ndarray]) -> None:
        """The stored rows have moved in the source: ``rows[e]`` names the rows with stream
        ids ``ids[e]`` ``(n_e,)`` int64, and together they hold every stored row once.
        Every shard's records become references to them (same ids, same priorities), so
        that a replacement reads them there; the shards themselves are not called. Raises
        ``ValueError`` and changes nothing unless every stored row is named once."""
        sizes = [np.shape(these)[0] for these in ids]
        named = np.concatenate([np.asarray(these, np.int64) for these in ids] or [_NONE])
        entry = np.repeat(np.arange(len(sizes)), sizes)
        offset = np.concatenate([np.arange(n) for n in sizes] or [_NONE])
        order = np.argsort(named, kind="stable")
        ranked = named[order]
        if named.shape[0] != self.n_samples or np.any(ranked[1:] == ranked[:-1]):
            raise ValueError(f"{named.shape[0]} rows named for {self.n_samples} stored ones")
        new_chunks = []
        for s, (chunks, alive) in enumerate(zip(self.chunks, self.alive, strict=True)):
            held = np.concatenate([c[1][a] for c, a in zip(chunks, alive, strict=True)] or [_NONE])
            pri = np.concatenate([c[2][a] for c, a in zip(chunks, alive, strict=True)] or [_NONE])
            wts = np.concatenate([_ones(c)[a] for c, a in zip(chunks, alive, strict=True)]
                                 or [np.empty(0)])  # fmt: skip
            at = np.minimum(np.searchsorted(ranked, held), max(ranked.shape[0] - 1, 0))
            if held.shape[0] and not np.array_equal(ranked[at], held):
                raise ValueError(f"shard {s}: not every stored row is named")
            where = order[at]  # the held rows' places among the named ones
            by_place = np.argsort(where, kind="stable")
            where, held, pri = where[by_place], held[by_place], pri[by_place]
            wts = wts[by_place]
            cuts = np.flatnonzero(np.diff(entry[where])) + 1
            new_chunks.append([
                (rows[int(entry[w[0]])][offset[w]], h, p, kept_weights(u, h.shape[0]))
                for w, h, p, u in zip(np.split(where, cuts), np.split(held, cuts),
                                      np.split(pri, cuts), np.split(wts, cuts), strict=True)
                if w.shape[0]
            ])  # fmt: skip
        self.chunks = new_chunks  # each shard's records checked: all replaced at once
        self.alive = [[np.ones(r[1].shape[0], dtype=bool) for r in c] for c in new_chunks]

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored rows with stream ids ``ids`` ``(m,)`` int64, in that order, ``(m, d)``
        float32 (KeyError if one is not stored)."""
        found, rows = self.find(ids)
        if not found.all():
            raise KeyError("some ids are not stored")
        return rows

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of the stream ids ``ids`` ``(m,)`` int64 are stored, and their rows as the
        shards hold them: ``(found (m,) bool, rows (found.sum(), d) float32)``."""
        ids = np.asarray(ids, np.int64).ravel()
        while True:
            parts = self.call_all("rows_of", ids)
            if all(part is not None for part in parts):
                break
        held = np.concatenate([p[0] for p in parts])
        rows = np.concatenate([p[1] for p in parts]).reshape(-1, self.dim)
        order = np.argsort(held, kind="stable")
        at = np.minimum(np.searchsorted(held[order], ids), max(held.shape[0] - 1, 0))
        found = held[order][at] == ids if held.shape[0] else np.zeros(ids.shape[0], bool)
        return found, rows[order][at[found]]

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """The sample weights of the stored rows with stream ids ``ids`` ``(m,)`` int64, in
        that order, ``(m,)`` float64, from the chunk records (no shard is called);
        ``ValueError`` if one is not stored."""
        ids = np.asarray(ids, np.int64).ravel()
        records = [(c[1][a], _ones(c)[a]) for chunks, alive in zip(self.chunks, self.alive,
                                                                    strict=True)
                   for c, a in zip(chunks, alive, strict=True)]  # fmt: skip
        held = np.concatenate([r[0] for r in records] or [_NONE])
        weights = np.concatenate([r[1] for r in records] or [np.empty(0)])
        order = np.argsort(held, kind="stable")
        at = np.minimum(np.searchsorted(held[order], ids), max(held.shape[0] - 1, 0))
        if ids.shape[0] and (not held.shape[0] or np.any(held[order][at] != ids)):
            raise ValueError("some ids are not stored")
        return weights[order][at] if ids.shape[0] else np.empty(0)

    def forget(self, ids: np.ndarray) -> np.ndarray:
        """Delete the stored rows with stream ids ``ids`` ``(m,)`` int64 exactly, as one
        machine does (``KMeansAlgorithm.forget``): :meth:`retire` (each shard takes back
        its rows' votes; the records remember them, so a replacement shard never sees
        them), then the clusters whose sums changed get their centroids from them at
        once, the move added to ``p``, which goes to every shard with the centroids at
        the next round (:func:`~nmbatch.engine.algorithms.base.move_changed_centroids`).
        Ids not stored are skipped. Returns ``(m,)`` bool: which were deleted."""
        query = np.asarray(ids, np.int64).ravel()
        held = [c[1][a] for chunks, alive in zip(self.chunks, self.alive, strict=True)
                for c, a in zip(chunks, alive, strict=True)]  # fmt: skip
        found = np.isin(query, np.concatenate(held) if held else _NONE)
        if found.any():
            S, v = self.S.copy(), self.v.copy()
            self.retire(np.unique(query[found]), 0)
            move_changed_centroids(self, S, v, sse_from_sums=True)
        return found

    # -- rounds -------------------------------------------------------------------------
    def step(self) -> IterationStats:
        """One round (:meth:`Coordinator.step`), then :meth:`respread` if due."""
        stats = super().step()
        if self._covered_all and self.tau > _RESPREAD_AT:
            self.respread()
        return stats

    def respread(self) -> None:
        """Give new rows their room back: map every priority down (:func:`~.priorities.respread`).

        The room ``[tau, PRIORITY_LIMIT)`` new priorities are drawn from shrinks as ``tau``
        rises (fast in a stream the prefix covers whole, where each round raises ``tau``
        past every new row). Done when the prefix holds every row (no row waits: nothing
        above ``tau`` whose spread must match the new draws): the prefix is mapped into
        ``[0, _LEVELS P)`` in order, ``tau`` becomes ``2 _LEVELS P``. The coordinator's
        chunk records are mapped first, so a shard replaced meanwhile starts mapped.
        """
        P = len(self.partitions)
        tau_new = 2 * _LEVELS * P
        if self.tau <= tau_new:
            return
        for chunks in self.chunks:
            for c, (rows, ids, pri, w) in enumerate(chunks):
                chunks[c] = (rows, ids, respread(pri, self.tau, tau_new, _LEVELS, P), w)
        self.call_all("respread", self.tau, tau_new, _LEVELS, P)
        self.tau = tau_new

    # -- restore -------------------------------------------------------------------------
    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> None:
        """Start again from ``centroids`` ``(k, d)`` float32 over the ``b = min(max(
        batch_size, k), N)`` lowest priorities, counting iterations from ``iteration``;
        as ``NestedMiniBatch.restore``: one exact assignment pass rebuilds the votes and
        ``sse``, the centroids are left as given (``p = 0``; under ``metric="cosine"``
        normalised first, which leaves a model's own unit centroids as they are)."""
        k, d = self.n_clusters, self.dim
        C = np.array(centroids, dtype=np.float32, order="C").reshape(k, d)
        C = metric_rows(C, self.metric, name="centroids")
        self.call_all("reset")  # a shard lost here is replaced unvoted: the same
        self.S[:], self.v[:], self.Q[:], self.sse[:], self.p[:] = 0.0, 0, 0.0, 0.0, 0.0
        for ledger in self.ledgers:
            for part in ledger:
                part[...] = 0
        b = min(max(int(batch_size), k), self.n_samples)
        self.tau = 0
        self.tau = self._select_tau(b)
        self.centroids, self.initialized = C, True
        results = self.call_all("step", ray.put((C, self.p)), self.tau)
        for s, res in enumerate(results):
            if res is not None:  # else lost: its rows join at the next round as new rows
                self._add_votes(s, res[0])
        self._clear_emptied([res[6] if res is not None else None for res in results])
        centroid_update(self.S, self.v, self.Q, C, sse_out=self.sse)  # sse; update dropped
        self.batch_size, self.iteration = b, int(iteration)
        self.converged = self._grow = False
        self._regrow_to = 0
        self._covered_all = b == self.n_samples
        if self._covered_all and self.tau > _RESPREAD_AT:
            self.respread()


def _ones(chunk: Chunk) -> np.ndarray:
    """A chunk record's weights, ``(m,)`` float64 (ones when it keeps none)."""
    return np.ones(chunk[1].shape[0]) if chunk[3] is None else chunk[3]


def _send(actor: Any, chunk: Chunk, stride: int) -> None:
    """Append one chunk record ``(rows, ids, priority, weights)`` to ``actor`` (not
    waited for)."""
    rows, ids, priority, weights = chunk
    if isinstance(rows, SourceRows):
        actor.append_ref.remote(rows, ids, priority, stride, weights)
    else:
        actor.append.remote(rows, ids, priority, stride, weights)
