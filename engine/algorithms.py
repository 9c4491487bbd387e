"""nmbatch and its baselines, one iteration per ``step()``, on a ``NestedBatchStore``.

Names follow the paper (Newling & Fleuret, "Nested Mini-Batch K-Means", NIPS 2016):
``b`` batch size (the prefix ``M_t = [0, b)`` of the store), ``C``/``c(j)`` centroids,
``S(j)`` and ``v(j)`` sum and count of the samples assigned to ``j``, ``sse(j)`` their
sum of ``d(i)^2``, ``p(j)`` the distance ``c(j)`` moved at the last update,
``sigma_C(j) = sqrt(sse(j) / (v(j) (v(j) - 1)))``, and ``rho`` the doubling threshold.

- ``nmbatch``: nested batches, one sample one vote, bounds (Alg. ``nmbatch``).
- ``nmbatch.deact``: the same, but every revisited sample's distances recomputed by BLAS.
- ``elkan``: the bounded exact algorithm: nmbatch's bounded kernel over all samples.
- ``lloyd``: exact full-batch k-means, distances by BLAS.
- ``mbatch``: Sculley's mini-batch k-means (uniform random batches, running sums).
- ``mbatch.remove``: mbatch whose samples give back their old vote when drawn again.

Decisions the paper leaves open (see DESIGN.md): the initial centroids are not votes
(``S = 0``, ``v = 0``); sums are float64; empty clusters keep their centroid and take no
part in the doubling test; a cluster with ``p(j) = 0`` never blocks doubling; one with
``v(j) = 1`` and ``p(j) > 0`` has no spread estimate yet and blocks it.
"""

from __future__ import annotations

import time

import numpy as np

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.assign import CHUNK_ROWS, sqnorms
from nmbatch.engine.init import kmeans_plusplus
from nmbatch.engine.kernels import (
    assign_dense,
    bound_sweep,
    centroid_update,
    gemm_error,
    reassign_rows,
    settle_assigned,
    sqdist32_error,
)
from nmbatch.engine.state import IterationStats, ModelState
from nmbatch.engine.store import NestedBatchStore

__all__ = [
    "ALGORITHMS",
    "IterationStats",
    "KMeansAlgorithm",
    "MiniBatch",
    "NestedMiniBatch",
    "make_algorithm",
]

ALGORITHMS = ("nmbatch", "nmbatch.deact", "mbatch", "mbatch.remove", "lloyd", "elkan")
_NO_UPPER = np.empty(0, dtype=np.float64)
# A bounded revisit goes through BLAS when the bounds leave open more than this fraction
# of the listed rows' (row, centroid) pairs (measured: see NestedMiniBatch._revisit_bounded).
DENSE_REVISIT_FRACTION = 0.45
# Sorted rows whose span is at most this many times their number are multiplied in place
# (extra rows of the product are cheaper than gathering a copy).
SPAN_PRODUCT_RATIO = 1.5


class KMeansAlgorithm:
    """State shared by all algorithms: centroids, sums and the centroid update.

    Parameters
    ----------
    store : NestedBatchStore
    n_clusters : int
        ``k``.
    init : "first", "k-means++" or array of shape (k, d)
    batch_size : int
        Initial (nmbatch) or fixed (mbatch) batch size.
    random_state : int or None
        Seeds k-means++ and mbatch's sampling.
    """

    name = "base"
    # Whether the centroid update computes ``sse`` from the sums (nmbatch), or the
    # assignment pass accumulated it (the others).
    _sse_from_sums_on_update = False

    def __init__(
        self,
        store: NestedBatchStore,
        n_clusters: int,
        *,
        init: str | np.ndarray = "first",
        batch_size: int = 5000,
        random_state: int | None = None,
    ) -> None:
        if n_clusters < 1:
            raise ValueError(f"n_clusters must be >= 1, got {n_clusters}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.store = store
        self.n_clusters = int(n_clusters)
        self.initial_batch_size = int(batch_size)
        self.random_state = random_state
        self._rng = np.random.default_rng(random_state)
        self.dim = store.dim
        if isinstance(init, str):
            if init not in ("first", "k-means++"):
                raise ValueError(f"init must be 'first', 'k-means++' or an array, got {init!r}")
            self._init: str | np.ndarray = init
        else:
            self._init = as_float32_matrix(init, dim=self.dim, name="init")
            if self._init.shape[0] != self.n_clusters:
                raise ValueError(
                    f"init has {self._init.shape[0]} centroids, n_clusters is {self.n_clusters}"
                )
        k, d = self.n_clusters, self.dim
        self.centroids = np.zeros((k, d), dtype=np.float32)
        self.S = np.zeros((k, d), dtype=np.float64)
        self.v = np.zeros(k, dtype=np.int64)
        self.sse = np.zeros(k, dtype=np.float64)
        self.Q = np.zeros(k, dtype=np.float64)
        self.p = np.zeros(k, dtype=np.float64)
        self.counts = self.v.copy()
        self.iteration = 0
        self.batch_size = 0
        self.converged = False
        self.initialized = False
        self._g = sqdist32_error(d)
        self._g_gemm = gemm_error(d)

    # -- public -----------------------------------------------------------------------
    def ready(self) -> bool:
        """True when the store holds at least ``k`` samples, so ``step()`` can run."""
        return self.initialized or self.store.n_samples >= self.n_clusters

    def step(self) -> IterationStats:
        """Run one iteration; returns what it did."""
        raise NotImplementedError

    def energy_estimate(self) -> float:
        """Mean ``d(i)^2`` over the samples the algorithm holds (``sse.sum() / b``)."""
        b = int(self.v.sum())
        return float(max(self.sse.sum(), 0.0) / b) if b else float("nan")

    def state(self, stats: IterationStats | None = None) -> ModelState:
        """The model as it stands, as one record (``stats``: of the step just run)."""
        energy = self.energy_estimate() if self.iteration > 0 and self.batch_size > 0 else None
        return ModelState(
            centroids=self.centroids,
            counts=self.counts,
            batch_size=int(self.batch_size),
            n_samples=int(self.store.n_samples),
            iteration=int(self.iteration),
            converged=bool(self.converged),
            initialized=bool(self.initialized),
            energy=energy,
            stats=stats,
        )

    # -- shared machinery -------------------------------------------------------------
    def _initialise(self, X: np.ndarray) -> None:
        """Set the starting centroids from the first rows ``X`` of the store (not votes)."""
        k = self.n_clusters
        if isinstance(self._init, np.ndarray):
            C = self._init
        elif self._init == "first":
            C = X[:k]
        else:
            C = kmeans_plusplus(X, k, self._rng)
        self.centroids = np.array(C, dtype=np.float32, order="C")
        self.initialized = True

    def _require_samples(self) -> None:
        if not self.ready():
            raise ValueError(
                f"the store holds {self.store.n_samples} samples; {self.n_clusters} "
                f"(n_clusters) are needed before the first iteration"
            )

    def _dense_pass(
        self, data, rows, remove, labels, dist2, lower, upper=None, norms=None, fresh=True
    ) -> int:
        """Assign ``rows`` of ``data`` with BLAS distances in chunks; returns changes.

        ``norms`` (N,) float64, optional: a cache of ``||data[i]||^2`` by row, written for
        ``rows`` when ``fresh`` (the kernel computes them as it reads each row), read from
        otherwise. Rows are sorted; a chunk that fills most of its span of ``data`` is
        multiplied in place rather than gathered.
        """
        if upper is None:
            upper = _NO_UPPER
        C = self.centroids
        Ct = np.ascontiguousarray(C.T)
        cc = sqnorms(C)
        changed = 0
        for start in range(0, rows.shape[0], CHUNK_ROWS):
            r = rows[start : start + CHUNK_ROWS]
            if r.shape[0] == 0:
                continue
            lo, span = r[0], r[-1] + 1 - r[0]
            # A product that overflows float32 is treated as unknown by the kernel.
            with np.errstate(over="ignore", invalid="ignore"):
                if span == r.shape[0]:  # contiguous rows: no gather copy
                    dots = data[lo : lo + span] @ Ct
                elif span <= SPAN_PRODUCT_RATIO * r.shape[0]:
                    dots = (data[lo : lo + span] @ Ct)[r - lo]
                else:
                    dots = data[r] @ Ct
            fill = norms is None or fresh
            xx = np.empty(r.shape[0], dtype=np.float64) if fill else norms[r]
            changed += assign_dense(
                data, r, xx, fill, dots, C, cc, self._g_gemm, self._g,
                remove, labels, dist2, lower, upper, self.S, self.v, self.sse, self.Q,
            )
            if fill and norms is not None:
                norms[r] = xx
        return changed

    def _update_centroids(self) -> None:
        """``c(j) = S(j)/v(j)`` where ``v(j) > 0``; ``p(j)`` = distance moved (rounded up)."""
        self.centroids, self.p = centroid_update(
            self.S, self.v, self.Q, self.centroids, self._sse_from_sums_on_update, self.sse
        )
        self.counts = self.v.copy()

    def _doubling_test(self, rho: float) -> bool:
        """``min_j sigma_C(j) / p(j) > rho`` over non-empty clusters, with the rules above."""
        v = self.v.astype(np.float64)
        p = self.p
        testing = (v > 0) & (p > 0.0)
        if (testing & (v == 1)).any():
            return False
        vt = v[testing]
        sigma = np.sqrt(np.maximum(self.sse[testing], 0.0) / (vt * (vt - 1.0)))
        return bool((sigma / p[testing] > rho).all())


class NestedMiniBatch(KMeansAlgorithm):
    """nmbatch (``bounds=True``), nmbatch.deact (``bounds=False``) and elkan (``full=True``).

    Per-sample state lives in memory only: ``labels`` (a), ``upper`` (u, an upper bound on
    d) and ``lower`` (l). ``sse(j)``, the sum of ``d(i)^2`` over the samples of ``j`` with
    the centroids in force during the iteration, is computed exactly from the per-cluster
    sums, ``sse(j) = Q(j) - 2 c(j).S(j) + v(j) ||c(j)||^2`` with ``Q(j) = sum ||x(i)||^2``,
    so a sample whose bounds prove its label unchanged need not be read at all.
    """

    def __init__(
        self,
        store: NestedBatchStore,
        n_clusters: int,
        *,
        rho: float = 100.0,
        bounds: bool = True,
        full: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(store, n_clusters, **kwargs)
        if not rho > 0:
            raise ValueError(f"rho must be > 0, got {rho}")
        self.rho = float(rho)
        self.bounds = bool(bounds)
        self.full = bool(full)
        self.dense_revisit_fraction = DENSE_REVISIT_FRACTION
        self.name = "elkan" if full else ("nmbatch" if bounds else "nmbatch.deact")
        self._sse_from_sums_on_update = True
        self._grow = False
        k = self.n_clusters
        self._labels = np.empty(0, dtype=np.int32)
        self._dist2 = np.empty(0, dtype=np.float64)  # scratch of the BLAS path
        self._xx = np.empty(0, dtype=np.float64)  # ||x(i)||^2 of the prefix rows
        self._upper = np.empty(0, dtype=np.float64)
        self._lower = np.empty((0, k), dtype=np.float32)

    def labels(self) -> np.ndarray:
        """Assignments ``a(i)`` of the prefix rows ``[0, b)``: ``(b,)`` int32 copy."""
        return self._labels[: self.batch_size].copy()

    def lower_bounds(self) -> np.ndarray:
        """Lower bounds ``l(i, j)`` of the prefix rows: ``(b, k)`` float32 copy."""
        return self._lower[: self.batch_size].copy()

    def _reserve(self, b: int) -> None:
        if self._labels.shape[0] >= b:
            return
        cap = max(b, 2 * self._labels.shape[0])
        k = self.n_clusters
        old = self.batch_size
        labels = np.full(cap, -1, dtype=np.int32)
        labels[:old] = self._labels[:old]
        dist2 = np.zeros(cap, dtype=np.float64)
        dist2[:old] = self._dist2[:old]
        xx = np.zeros(cap, dtype=np.float64)
        xx[:old] = self._xx[:old]
        self._labels, self._dist2, self._xx = labels, dist2, xx
        if self.bounds:
            lower = np.zeros((cap, k), dtype=np.float32)
            lower[:old] = self._lower[:old]
            upper = np.zeros(cap, dtype=np.float64)
            upper[:old] = self._upper[:old]
            self._lower, self._upper = lower, upper

    def upper_bounds(self) -> np.ndarray:
        """Upper bounds ``u(i)`` of the prefix rows: ``(b,)`` float64 copy."""
        return self._upper[: self.batch_size].copy()

    def _target_batch(self, n: int) -> int:
        if self.full or not self.initialized:
            return n if self.full else min(self.initial_batch_size, n)
        if self._grow:
            return min(2 * self.batch_size, n)
        return self.batch_size

    def _revisit_bounded(self, data: np.ndarray, b_old: int) -> tuple[int, int]:
        """nmbatch lines 10-21 over the prefix ``[0, b_old)``; returns (changes, distances).

        The bound sweep lists the rows whose label the bounds cannot settle, and counts the
        (row, centroid) pairs they leave open. Usually those are few: each listed row is
        read once, for its distance to ``a(i)`` and to the open centroids. When they are
        most of the listed rows' pairs (the first revisits, after big centroid moves), the
        exact distance to ``a(i)`` first settles some rows and tightens the others' bounds;
        if the pairs still open remain most of theirs, one BLAS product computes them
        faster than a scalar distance per pair (and leaves every bound tight).
        """
        k = self.n_clusters
        X = data[:b_old]
        labels, upper, lower = self._labels[:b_old], self._upper[:b_old], self._lower[:b_old]
        s_assigned = self._dist2[:b_old]  # scratch
        fraction = self.dense_revisit_fraction
        rows, n_open = bound_sweep(self.p, labels, upper, lower)
        n_dist = 0
        known = False
        if n_open > fraction * rows.shape[0] * k:
            n_dist = rows.shape[0]
            rows, n_open = settle_assigned(
                X, rows, self.centroids, self._g, labels, upper, lower, s_assigned
            )
            known = True
            if n_open > fraction * rows.shape[0] * k:
                changed = self._dense_pass(
                    data, rows, True, self._labels, self._dist2, self._lower, self._upper,
                    norms=self._xx, fresh=False,
                )
                # Pairs computed (the distance to a(i), done again, is counted once).
                return changed, n_dist + rows.shape[0] * (k - 1)
        changed, n_more = reassign_rows(
            X, rows, self.centroids, self._g, labels, upper, lower,
            self.S, self.v, self.Q, s_assigned, known,
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
                    data, np.arange(b_old, dtype=np.int64), True,
                    self._labels, self._dist2, self._lower, norms=self._xx, fresh=False,
                )
                n_dist = b_old * k
        if b > b_old:
            self._dense_pass(
                data, np.arange(b_old, b, dtype=np.int64), False,
                self._labels, self._dist2, self._lower, self._upper if self.bounds else None,
                norms=self._xx,
            )
            n_dist += (b - b_old) * k
        self.batch_size = b
        self._update_centroids()
        self.iteration += 1
        self.converged = b == n_now and b == b_old and n_changed == 0
        self._grow = (not self.full) and self._doubling_test(self.rho)
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
        )

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> None:
        """Start from given centroids over the prefix ``[0, min(batch_size, N))``.

        One exact assignment pass rebuilds ``a``, ``d``, ``l``, ``S``, ``v`` and ``sse``;
        the centroids are then left as given (``p = 0``), so the next ``step()`` moves them
        to the means of the restored prefix.
        """
        C = as_float32_matrix(centroids, dim=self.dim, name="centroids")
        if C.shape[0] != self.n_clusters:
            raise ValueError(f"centroids has {C.shape[0]} rows, n_clusters is {self.n_clusters}")
        data, b = self.store.freeze(max(int(batch_size), self.n_clusters))
        self.centroids = C.copy()
        self.initialized = True
        k = self.n_clusters
        self.S = np.zeros((k, self.dim), dtype=np.float64)
        self.v = np.zeros(k, dtype=np.int64)
        self.sse = np.zeros(k, dtype=np.float64)
        self.Q = np.zeros(k, dtype=np.float64)
        self.p = np.zeros(k, dtype=np.float64)
        self.batch_size = 0
        self._labels = np.empty(0, dtype=np.int32)
        self._dist2 = np.empty(0, dtype=np.float64)
        self._upper = np.empty(0, dtype=np.float64)
        self._lower = np.empty((0, k), dtype=np.float32)
        self._reserve(b)
        self._dense_pass(
            data, np.arange(b, dtype=np.int64), False, self._labels, self._dist2, self._lower,
            self._upper if self.bounds else None, norms=self._xx,
        )
        # sse from the sums under the restored centroids (the kernel's update is discarded).
        centroid_update(self.S, self.v, self.Q, self.centroids, True, self.sse)
        self.batch_size = b
        self.counts = self.v.copy()
        self.iteration = int(iteration)
        self.converged = False
        self._grow = False


class Lloyd(KMeansAlgorithm):
    """Exact k-means: every iteration assigns all ``N`` samples by BLAS, then takes means."""

    name = "lloyd"

    def __init__(self, store: NestedBatchStore, n_clusters: int, **kwargs) -> None:
        kwargs.pop("rho", None)
        super().__init__(store, n_clusters, **kwargs)
        self._labels = np.empty(0, dtype=np.int32)
        self._dist2 = np.empty(0, dtype=np.float64)
        self._no_bounds = np.empty((0, self.n_clusters), dtype=np.float32)

    def labels(self) -> np.ndarray:
        return self._labels[: self.batch_size].copy()

    def step(self) -> IterationStats:
        self._require_samples()
        t0 = time.perf_counter()
        n_now = self.store.n_samples
        data, b = self.store.freeze(n_now)
        if not self.initialized:
            self._initialise(data[:b])
        if self._labels.shape[0] < b:
            labels = np.full(b, -1, dtype=np.int32)
            labels[: self.batch_size] = self._labels[: self.batch_size]
            self._labels = labels
            self._dist2 = np.zeros(b, dtype=np.float64)
        b_old = self.batch_size
        self.S[:] = 0.0
        self.v[:] = 0
        self.sse[:] = 0.0
        self.Q[:] = 0.0
        n_changed = self._dense_pass(
            data, np.arange(b, dtype=np.int64), False, self._labels, self._dist2, self._no_bounds
        )
        self.batch_size = b
        self._update_centroids()
        self.iteration += 1
        self.converged = n_changed == 0 and b == b_old
        return IterationStats(
            iteration=self.iteration, batch_size=b, next_batch_size=b, n_samples=n_now,
            n_changed=n_changed, n_new=b - b_old, doubled=False, converged=self.converged,
            n_distances=b * self.n_clusters, n_skipped=0, seconds=time.perf_counter() - t0,
        )


class MiniBatch(KMeansAlgorithm):
    """Sculley's mbatch (``remove=False``) and mbatch.remove (``remove=True``).

    Each iteration draws ``batch_size`` samples uniformly from the store. mbatch adds every
    assignment to the running sums (centroids are running averages of all assignments
    ever made); mbatch.remove first takes back the sample's previous vote.
    """

    def __init__(
        self, store: NestedBatchStore, n_clusters: int, *, remove: bool = False, **kwargs
    ) -> None:
        kwargs.pop("rho", None)
        super().__init__(store, n_clusters, **kwargs)
        self.remove = bool(remove)
        self.name = "mbatch.remove" if remove else "mbatch"
        self._labels = np.empty(0, dtype=np.int32)
        self._dist2 = np.empty(0, dtype=np.float64)
        self._no_bounds = np.empty((0, self.n_clusters), dtype=np.float32)

    def labels(self) -> np.ndarray:
        return self._labels[: self.batch_size].copy()

    def step(self) -> IterationStats:
        self._require_samples()
        t0 = time.perf_counter()
        n_now = self.store.n_samples
        data, n = self.store.freeze(n_now)
        if not self.initialized:
            self._initialise(data[: max(min(self.initial_batch_size, n), self.n_clusters)])
        if self._labels.shape[0] < n:
            labels = np.full(n, -1, dtype=np.int32)
            labels[: self.batch_size] = self._labels[: self.batch_size]
            dist2 = np.zeros(n, dtype=np.float64)
            dist2[: self.batch_size] = self._dist2[: self.batch_size]
            self._labels, self._dist2 = labels, dist2
        m = min(self.initial_batch_size, n)
        if self.remove:
            rows = np.sort(self._rng.choice(n, size=m, replace=False))
        else:
            rows = np.sort(self._rng.integers(0, n, size=m))
        n_changed = self._dense_pass(
            data, rows.astype(np.int64), self.remove, self._labels, self._dist2, self._no_bounds
        )
        self.batch_size = n
        self._update_centroids()
        self.iteration += 1
        return IterationStats(
            iteration=self.iteration, batch_size=m, next_batch_size=m, n_samples=n_now,
            n_changed=n_changed, n_new=0, doubled=False, converged=False,
            n_distances=m * self.n_clusters, n_skipped=0, seconds=time.perf_counter() - t0,
        )


def make_algorithm(
    name: str,
    store: NestedBatchStore,
    n_clusters: int,
    *,
    init: str | np.ndarray = "first",
    rho: float = 100.0,
    batch_size: int = 5000,
    random_state: int | None = None,
) -> KMeansAlgorithm:
    """Build the algorithm ``name`` (one of ``ALGORITHMS``) on ``store``."""
    common = {"init": init, "batch_size": batch_size, "random_state": random_state}
    if name == "nmbatch":
        return NestedMiniBatch(store, n_clusters, rho=rho, **common)
    if name == "nmbatch.deact":
        return NestedMiniBatch(store, n_clusters, rho=rho, bounds=False, **common)
    if name == "elkan":
        return NestedMiniBatch(store, n_clusters, rho=rho, full=True, **common)
    if name == "lloyd":
        return Lloyd(store, n_clusters, **common)
    if name == "mbatch":
        return MiniBatch(store, n_clusters, **common)
    if name == "mbatch.remove":
        return MiniBatch(store, n_clusters, remove=True, **common)
    raise ValueError(f"unknown algorithm {name!r}; choose one of {ALGORITHMS}")
