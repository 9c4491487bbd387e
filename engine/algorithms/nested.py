"""nmbatch (Alg. ``nmbatch`` of the paper) and its variants nmbatch.deact and elkan.

- ``nmbatch``: nested batches, one sample one vote, bounds.
- ``nmbatch.deact``: the same, but every revisited sample's distances recomputed by BLAS.
- ``elkan``: the bounded exact algorithm: nmbatch's bounded kernel over all samples.
"""

from __future__ import annotations

import time

import numpy as np

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.algorithms.base import KMeansAlgorithm
from nmbatch.engine.algorithms.bounds import make_bounds
from nmbatch.engine.algorithms.growth import (
    B0_PER_CLUSTER,
    DOUBLING_TOLERANCE,
    LARGE_K_RHO,
    doubling_allowance,
    doubling_rho,
    first_batch_size,
)
from nmbatch.engine.algorithms.relocation import relocate_empty
from nmbatch.engine.algorithms.swap import Swap, swap_clusters
from nmbatch.engine.kernels import centroid_update
from nmbatch.engine.kernels.common import EMPTY_F64
from nmbatch.engine.metric import metric_rows
from nmbatch.engine.state import IterationStats
from nmbatch.engine.store import NestedBatchStore, Retirement

__all__ = ["DENSE_REVISIT_FRACTION", "PROJECTED_REVISIT_FRACTION", "NestedMiniBatch"]

# A bounded revisit goes through BLAS when the bounds leave open more than this fraction
# of the listed rows' (row, centroid) pairs, with every bound mode. Measured (2-core AMD
# EPYC, one idle core, one shared k-means++.sub start, seconds to 1% of the best held-out
# energy, two runs; scratch script, fractions alternated): MiniLM sentence embeddings
# (16,667 x 384), k = 1,024: 0.72-0.92 s with 0.45, 0.45 s with 0.2, 0.44-0.46 with 0.1,
# 0.45 with 0.05; MNIST k = 1,024: 3.37-3.55 / 3.42 / 3.03-3.09; image patches (d = 108)
# k = 1,024: 2.97-3.69 / 2.61-3.30 / 2.48-2.98; MNIST k = 50: 0.28-0.30 / 0.28-0.30 /
# 0.25-0.27; patches k = 256: 0.65-0.91 / 0.63-0.75 / 0.57. Before, group bounds took 0.1
# (patches, k = 4,096: 16.1 s with 0.06, 14.3 s with 0.1, 14.5 s with 0.15) and full
# bounds 0.45, measured on a machine whose BLAS ran further below the bounded kernel's speed.
DENSE_REVISIT_FRACTION = 0.1
# The same with the dense passes taken through a subspace (.projection): three times
# cheaper at k = 4,096 on MNIST, so the scalar revisit pays only while fewer pairs are
# open. MNIST k = 4,096, one idle core, seconds at the end of steps 1-4 (the same
# centroids bit for bit): 0.1: 5.9 / 9.8 / 12.7 / 15.3; 0.03: 5.4 / 7.1 / 7.7 / 8.4;
# 0.01: 6.1 / 7.8 / 8.5 / 9.3 (no projection: 10.1 / 11.4 / 13.0 / 14.6).
PROJECTED_REVISIT_FRACTION = 0.03


class NestedMiniBatch(KMeansAlgorithm):
    """nmbatch (``bounds=True``), nmbatch.deact (``bounds=False``) and elkan (``full=True``).

    Per-sample state lives in memory only: ``labels`` (a), ``upper`` (u, an upper bound on
    d) and ``lower`` (l). ``sse(j)``, the sum of ``d(i)^2`` over the samples of ``j`` with
    the centroids in force during the iteration, is computed exactly from the per-cluster
    sums, ``sse(j) = Q(j) - 2 c(j).S(j) + v(j) ||c(j)||^2`` with ``Q(j) = sum ||x(i)||^2``,
    so a sample whose bounds prove its label unchanged need not be read at all.

    ``bound_mode`` (nmbatch): ``l`` holds one bound per centroid (``"full"``), per group
    of centroids (``"group"``) or one in all (``"hamerly"``); ``"auto"`` picks by ``k``,
    ``d`` and the batch's memory (:mod:`.bounds`). elkan always keeps one per centroid.
    """

    def __init__(
        self,
        store: NestedBatchStore,
        n_clusters: int,
        *,
        rho: float = 100.0,
        bounds: bool = True,
        full: bool = False,
        relocate_empty: bool = True,
        swap: bool = False,
        bound_mode: str = "full",
        **kwargs,
    ) -> None:
        super().__init__(store, n_clusters, **kwargs)
        if not rho > 0:
            raise ValueError(f"rho must be > 0, got {rho}")
        self.rho = float(rho)
        self.bounds = bool(bounds)
        self.full = bool(full)
        self.relocate_empty = bool(relocate_empty)
        self.swap = bool(swap)
        # None: DENSE_REVISIT_FRACTION.
        self.dense_revisit_fraction: float | None = None
        self.b0_per_cluster = B0_PER_CLUSTER  # b_0 >= this times k (.growth)
        self.doubling_tolerance = DOUBLING_TOLERANCE  # with b_0 sized to k (.growth)
        self.large_k_rho = LARGE_K_RHO  # the test's rho with b_0 sized to k (.growth)
        self.name = "elkan" if full else ("nmbatch" if bounds else "nmbatch.deact")
        self._sse_from_sums_on_update = True
        self._grow = False
        # The stream: once the batch held every stored sample, it takes in every new one;
        # a retirement never shrinks the batch the next step works on (see _target_batch).
        self._covered_all = False
        self._regrow_to = 0
        self.n_relocated = 0  # empty clusters given a sample by the last step
        self.last_swaps: list[Swap] = []  # the swaps the last step made (.swap)
        self._xx = np.empty(0, dtype=np.float64)  # ||x(i)||^2 of the prefix rows
        self._bound_request = "full" if full else bound_mode
        self._bk = make_bounds(self._bound_request, self.n_clusters, self.dim)
        self._clear_rows()

    @property
    def bound_mode(self) -> str:
        """The lower bounds kept now: ``"full"``, ``"group"``, ``"hamerly"`` or ``"none"``."""
        return self._bk.mode if self.bounds else "none"

    def labels(self) -> np.ndarray:
        """Assignments ``a(i)`` of the prefix rows ``[0, b)``: ``(b,)`` int32 copy."""
        return self._labels[: self.batch_size].copy()

    def lower_bounds(self) -> np.ndarray:
        """Lower bounds ``l(i, j)`` of the prefix rows: ``(b, k)`` float32 copy (with group
        bounds: each centroid's group bound, 0 for ``a(i)``)."""
        b = self.batch_size
        return self._bk.expand(self._lower[:b], self._labels[:b])

    def upper_bounds(self) -> np.ndarray:
        """Upper bounds ``u(i)`` of the prefix rows: ``(b,)`` float64 copy."""
        return self._upper[: self.batch_size].copy()

    def _vote_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # sse is recomputed from the sums after a retirement; Q took the cached norms.
        return self._labels, self._xx, EMPTY_F64

    def _row_arrays(self) -> list[np.ndarray]:
        rows = [self._labels, self._xx]
        return [*rows, self._lower, self._upper] if self.bounds else rows

    def _clear_rows(self) -> None:
        """Forget every per-row array but the norms cache (no row is assigned)."""
        self._labels = np.empty(0, dtype=np.int32)
        self._dist2 = np.empty(0, dtype=np.float64)  # scratch of the BLAS path
        self._upper = np.empty(0, dtype=np.float64)
        self._lower = np.empty((0, self._bk.width), dtype=np.float32)

    def _reserve(self, b: int) -> None:
        if self.bounds:
            self._bk.prepare(self.centroids)  # groups, from the first centroids in force
        if self._labels.shape[0] >= b:
            return
        cap = max(b, 2 * self._labels.shape[0])
        old = self.batch_size
        if self.bounds and self._bk.too_big(cap):  # auto: group bounds from now on
            self._bk, self._lower = self._bk.to_groups(
                self._lower, self._labels, old, self.centroids
            )
        labels = np.full(cap, -1, dtype=np.int32)
        labels[:old] = self._labels[:old]
        dist2 = np.zeros(cap, dtype=np.float64)
        dist2[:old] = self._dist2[:old]
        xx = np.zeros(cap, dtype=np.float64)
        xx[:old] = self._xx[:old]
        self._labels, self._dist2, self._xx = labels, dist2, xx
        if self.bounds:
            lower = np.zeros((cap, self._bk.width), dtype=np.float32)
            lower[:old] = self._lower[:old]
            upper = np.zeros(cap, dtype=np.float64)
            upper[:old] = self._upper[:old]
            self._lower, self._upper = lower, upper

    def _target_batch(self, n: int) -> int:
        """``b`` of the next step, with ``n`` samples stored: the doubling rule, and two
        rules for a stream (samples arriving and leaving between steps). A batch that
        held every stored sample at the last step takes in every new one: there is no
        nested batch left to grow, and waiting for the doubling test would leave new
        samples out of the model for as long as the centroids keep moving. And samples
        retired from the batch are replaced by new ones from the store (up to the size
        before the retirement): without it a sliding window, whose centroids move a
        little at every step, would drain the batch, since the doubling test seldom
        passes while they move. Either way the rows that join are the next rows of
        the shuffled store: a uniform random subset, as every growth takes. The first
        batch holds ``b0_per_cluster`` samples per cluster at least (:mod:`.growth`)."""
        if self.full or not self.initialized:
            if self.full:
                return n
            return first_batch_size(self.initial_batch_size, self.n_clusters, n,
                                    self.b0_per_cluster)
        if self._covered_all:
            return n
        target = min(2 * self.batch_size, n) if self._grow else self.batch_size
        return max(target, min(self._regrow_to, n))

    def _doubling_allowance(self) -> int:
        """``floor(q k)`` clusters may fail the doubling test when ``b_0`` is sized to
        ``k``, else none (:func:`.growth.doubling_allowance`)."""
        return doubling_allowance(self.initial_batch_size, self.n_clusters,
                                  self.b0_per_cluster, self.doubling_tolerance)

    def _doubling_rho(self) -> float:
        """The doubling test's ``rho``: at most ``large_k_rho`` when ``b_0`` is sized to
        ``k``, else ``rho`` (:func:`.growth.doubling_rho`)."""
        return doubling_rho(self.rho, self.initial_batch_size, self.n_clusters,
                            self.b0_per_cluster, self.large_k_rho)

    def _relocate(self, data: np.ndarray, b: int, C_prev: np.ndarray) -> int:
        """Empty clusters take the batch's farthest samples (:mod:`.relocation`)."""
        w = self._weigh_sums()  # first: it may make v float64
        return relocate_empty(
            data, b, labels=self._labels, norms=self._xx, S=self.S, v=self.v, Q=self.Q,
            sse=self.sse, C=self.centroids, C_prev=C_prev, p=self.p,
            upper=self._upper if self.bounds else None,
            group_lower=self._bk.relocation_bounds(self._lower) if self.bounds else None,
            unit=self._unit, weights=w,
        )  # fmt: skip

    def _swap(
        self, data: np.ndarray, b: int, C_prev: np.ndarray, relocated: np.ndarray
    ) -> list[Swap]:
        """Starving clusters leave to split the clusters that gain most, where that
        lowers the energy (:mod:`.swap`); the clusters ``relocated`` (bool by cluster) just
        got their sample and sit this step out."""
        return swap_clusters(
            data, b, labels=self._labels, norms=self._xx, S=self.S, v=self.v, Q=self.Q,
            sse=self.sse, C=self.centroids, C_prev=C_prev, p=self.p,
            upper=self._upper if self.bounds else None,
            group_lower=self._bk.relocation_bounds(self._lower) if self.bounds else None,
            frozen=relocated, unit=self._unit,
        )  # fmt: skip

    def retire(
        self, *, ids: np.ndarray | None = None, before: int | None = None,
        skip_missing: bool = False,
    ) -> Retirement:
        b_old = self.batch_size
        out = super().retire(ids=ids, before=before, skip_missing=skip_missing)
        self._regrow_to = max(self._regrow_to, b_old)
        return out

    def _assign_new(self, data: np.ndarray, start: int, stop: int) -> None:
        """Assign the rows ``[start, stop)`` that join the batch (all their distances)."""
        self._dense_pass(
            data, np.arange(start, stop, dtype=np.int64), remove=False,
            labels=self._labels, dist2=self._dist2,
            lower=self._lower if self.bounds else None,
            upper=self._upper if self.bounds else None, norms=self._xx,
            groups=self._bk.group_of if self.bounds else None,
        )

    def _revisit_bounded(self, data: np.ndarray, b_old: int) -> tuple[int, int]:
        """nmbatch lines 10-21 over the prefix ``[0, b_old)``; returns (changes, distances).

        The bound sweep lists the rows whose label the bounds cannot settle, and counts the
        (row, centroid) pairs they leave open. Usually those are few: each listed row is
        read once, for its distance to ``a(i)`` and to the open centroids. When they are
        more than a fraction of the listed rows' pairs (the first revisits, after big
        centroid moves; the fraction is ``dense_revisit_fraction``, by default 10%,
        measured above), the exact distance to
        ``a(i)`` first settles some rows and tightens the others' bounds; if the pairs
        still open remain more than that fraction, one BLAS product computes them faster
        than a scalar distance per pair (and leaves every bound tight).
        """
        k = self.n_clusters
        X = data[:b_old]
        labels, upper, lower = self._labels[:b_old], self._upper[:b_old], self._lower[:b_old]
        s_assigned = self._dist2[:b_old]  # scratch
        bk = self._bk
        fraction = self.dense_revisit_fraction
        if fraction is None:  # a dense pass through a subspace is the cheaper one
            projected = self.subspace.projection is not None and bk.group_of is None
            fraction = PROJECTED_REVISIT_FRACTION if projected else DENSE_REVISIT_FRACTION
        rows, n_open = bk.sweep(self.p, labels, upper, lower)
        n_dist = 0
        known = None
        if n_open > fraction * rows.shape[0] * k:
            n_dist = rows.shape[0]
            rows, n_open = bk.settle(
                X, rows, self.centroids, self._g, labels, upper, lower, s_assigned
            )
            known = s_assigned
            if n_open > fraction * rows.shape[0] * k:
                changed = self._dense_pass(
                    data, rows, remove=True, labels=self._labels, dist2=self._dist2,
                    lower=self._lower, upper=self._upper, norms=self._xx, fresh=False,
                    groups=bk.group_of,
                )
                # Pairs computed (the distance to a(i), done again, is counted once).
                return changed, n_dist + rows.shape[0] * (k - 1)
        w = self._weigh_sums()
        changed, n_more = bk.reassign(
            X, rows, self.centroids, self.p, labels=labels, upper=upper, lower=lower,
            S=self.S, v=self.v, Q=self.Q, assigned_sqdist=known,
            weights=w if w.shape[0] else None,
        )
        return changed, n_dist + n_more

    def step(self) -> IterationStats:
        self._require_samples()
        t0 = time.perf_counter()
        n_now = self.store.n_samples
        data, b = self.store.freeze(max(self._target_batch(n_now), self.n_clusters))
        if not self.initialized:
            self._initialise(data[:b])
        b_old = self.batch_size
        self._reserve(b)
        k = self.n_clusters
        n_changed = 0
        n_dist = 0
        if b_old > 0:
            if self.bounds:
                n_changed, n_dist = self._revisit_bounded(data, b_old)
            else:
                n_changed = self._dense_pass(
                    data, np.arange(b_old, dtype=np.int64), remove=True,
                    labels=self._labels, dist2=self._dist2, norms=self._xx, fresh=False,
                )
                n_dist = b_old * k
        if b > b_old:
            self._assign_new(data, b_old, b)
            n_dist += (b - b_old) * k
        self.batch_size = b
        self._clear_emptied()
        C_prev = self.centroids
        self._update_centroids()
        was_empty = self.v == 0
        empty = np.flatnonzero(was_empty)  # relocate_empty fills them in this order
        n_relocated = self._relocate(data, b, C_prev) if self.relocate_empty else 0
        self.n_relocated = n_relocated
        n_changed += n_relocated
        relocated = was_empty & (self.v > 0)
        # The swaps' split heuristic counts samples, not weights: off in a weighted store.
        swap = self.swap and not self.store.weighted
        self.last_swaps = self._swap(data, b, C_prev, relocated) if swap else []
        n_changed += sum(int(s.rows.shape[0]) for s in self.last_swaps)
        if n_relocated or self.last_swaps:
            self.counts = self.v.copy()
        self.iteration += 1
        # A fixed point: every sample of the store in the batch, no label changed, and the
        # update moved no centroid (after restore() the labels are those of the given
        # centroids, which need not be the means of their samples: p > 0 then).
        self.converged = b == n_now and b == b_old and n_changed == 0 and not self.p.any()
        self._grow = (not self.full) and self._doubling_test(self._doubling_rho())
        self._covered_all = b == n_now
        self._regrow_to = 0
        next_b = min(2 * b, n_now) if self._grow else b
        n_possible = b_old * k + (b - b_old) * k
        return IterationStats(
            iteration=self.iteration,
            batch_size=b,
            next_batch_size=next_b,
            n_samples=n_now,
            n_changed=n_changed,
            n_new=b - b_old,
            doubled=self._grow,
            converged=self.converged,
            n_distances=n_dist,
            n_skipped=n_possible - n_dist,
            seconds=time.perf_counter() - t0,
            n_relocated=n_relocated,
            relocated=tuple(int(j) for j in empty[:n_relocated]),
            swaps=tuple((s.merged, s.into, s.split) for s in self.last_swaps),
        )

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> None:
        """Start from given centroids over the prefix ``[0, min(batch_size, N))``.

        One exact assignment pass rebuilds ``a``, ``d``, ``l``, ``S``, ``v`` and ``sse``;
        the centroids are then left as given (``p = 0``; under ``metric="cosine"``
        normalised first, which leaves a model's own unit centroids as they are), so the
        next ``step()`` moves them to the means of the restored prefix.
        """
        C = metric_rows(as_float32_matrix(centroids, dim=self.dim, name="centroids"),
                        self.metric, name="centroids")
        if C.shape[0] != self.n_clusters:
            raise ValueError(f"centroids has {C.shape[0]} rows, n_clusters is {self.n_clusters}")
        data, b = self.store.freeze(max(int(batch_size), self.n_clusters))
        self.centroids = C.copy()
        self.initialized = True
        k = self.n_clusters
        self.S = np.zeros((k, self.dim), dtype=np.float64)
        self.v = np.zeros(k, dtype=np.float64 if self.store.weighted else np.int64)
        self.sse = np.zeros(k, dtype=np.float64)
        self.Q = np.zeros(k, dtype=np.float64)
        self.p = np.zeros(k, dtype=np.float64)
        self.batch_size = 0
        self._bk = make_bounds(self._bound_request, self.n_clusters, self.dim)  # groups anew
        self._clear_rows()
        self._reserve(b)
        self._assign_new(data, 0, b)
        # sse from the sums under the restored centroids (the kernel's update is discarded).
        centroid_update(self.S, self.v, self.Q, self.centroids, sse_out=self.sse)
        self.batch_size = b
        self._covered_all = b == self.store.n_samples
        self._regrow_to = 0
        self.counts = self.v.copy()
        self.iteration = int(iteration)
        self.converged = False
        self._grow = False
