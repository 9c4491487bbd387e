"""``KMeansAlgorithm``: the state every algorithm shares and the passes they share.

Names follow the paper (Newling & Fleuret, "Nested Mini-Batch K-Means", NIPS 2016):
``b`` batch size (the prefix ``M_t = [0, b)`` of the store), ``C``/``c(j)`` centroids,
``S(j)`` and ``v(j)`` sum and count of the samples assigned to ``j``, ``sse(j)`` their
sum of ``d(i)^2``, ``Q(j)`` their sum of ``||x(i)||^2``, ``p(j)`` the distance ``c(j)``
moved at the last update, ``sigma_C(j) = sqrt(sse(j) / (v(j) (v(j) - 1)))``, and ``rho``
the doubling threshold.

Decisions the paper leaves open (docs/internals/open-points.md): the initial centroids are not votes
(``S = 0``, ``v = 0``); sums are float64; empty clusters keep their centroid and take no
part in the doubling test; a cluster with ``p(j) = 0`` never blocks doubling; one with
``v(j) = 1`` and ``p(j) > 0`` has no spread estimate yet and blocks it.

``metric="cosine"`` (spherical k-means, :mod:`nmbatch.engine.metric`): the store holds unit
rows, every centroid is ``S(j)/||S(j)||`` (the update, the relocation and the swaps derive
it in one place, :func:`~nmbatch.engine.kernels.update.centroid_of`), the bounds are those
of the Euclidean distances between unit vectors, and the doubling test takes the standard
error of the centroid's direction (docs/design.md, "Spherical k-means").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.assign import sample_lookup, sqnorms
from nmbatch.engine.kernels import assign_dense, centroid_update, remove_votes, sqdist32_error
from nmbatch.engine.kernels.common import EMPTY_F64
from nmbatch.engine.kernels.grouped_dense import assign_dense_grouped
from nmbatch.engine.metric import check_metric, metric_rows
from nmbatch.engine.pooled import pooled_assign, use_pool
from nmbatch.engine.products import PRODUCT_ROWS, SPAN_PRODUCT_RATIO, chunks_at_once, products
from nmbatch.engine.projection import Subspace, projected_products
from nmbatch.engine.seeding import SEEDINGS, initial_centroids
from nmbatch.engine.state import IterationStats, ModelState, SampleLookup
from nmbatch.engine.store import NestedBatchStore, Retirement

__all__ = ["SPAN_PRODUCT_RATIO", "KMeansAlgorithm", "move_changed_centroids", "voting_clusters"]


class KMeansAlgorithm:
    """State shared by all algorithms: centroids, sums and the centroid update.

    Parameters
    ----------
    store : NestedBatchStore
    n_clusters : int
        ``k``.
    init : a method of ``nmbatch.engine.seeding.SEEDINGS`` or array of shape (k, d)
    batch_size : int
        Initial (nmbatch) or fixed (mbatch) batch size.
    random_state : int or None
        Seeds the seeding and mbatch's sampling.
    metric : {"euclidean", "cosine"}
        The store's metric (``store.metric``, checked): ``"cosine"`` keeps unit centroids.
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
        metric: str = "euclidean",
    ) -> None:
        if n_clusters < 1:
            raise ValueError(f"n_clusters must be >= 1, got {n_clusters}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if check_metric(metric) != store.metric:
            raise ValueError(f"metric is {metric!r} but the store's is {store.metric!r}")
        self.metric = metric
        self._unit = metric == "cosine"  # centroids S(j)/||S(j)||
        self.store = store
        self.n_clusters = int(n_clusters)
        self.initial_batch_size = int(batch_size)
        self.random_state = random_state
        self._rng = np.random.default_rng(random_state)
        self.dim = store.dim
        if isinstance(init, str):
            if init not in SEEDINGS:
                raise ValueError(f"init must be one of {SEEDINGS} or an array, got {init!r}")
            self._init: str | np.ndarray = init
        else:
            self._init = metric_rows(as_float32_matrix(init, dim=self.dim, name="init"),
                                     metric, name="init")
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
        # The dense passes' projection (.projection): chosen at the first large pass.
        self.subspace = Subspace()

    # -- public -----------------------------------------------------------------------
    def ready(self) -> bool:
        """True when the store holds at least ``k`` samples, so ``step()`` can run."""
        return self.initialized or self.store.n_samples >= self.n_clusters

    def step(self) -> IterationStats:
        """Run one iteration; returns what it did."""
        raise NotImplementedError

    def retire(
        self, *, ids: np.ndarray | None = None, before: int | None = None,
        skip_missing: bool = False,
    ) -> Retirement:
        """Forget the stored samples with these stream ``ids`` or with ``id < before``.

        Exact: before a retired prefix row leaves the store, its vote leaves ``S``, ``v``,
        ``Q`` (and ``sse``) (:func:`~nmbatch.engine.kernels.retire.remove_votes`); the
        per-row state (labels, bounds, norms) then moves with the rows the store moves,
        and ``b`` shrinks by the number of prefix rows retired, so ``v`` sums to ``b``
        and ``S(j)/v(j)`` is the mean of the retained prefix rows of ``j``. Bounds of the
        rows that stay stay valid, and ``p`` is kept: the next step's bound sweep still
        needs it. The centroids are left as they are: the next ``step()`` moves them to
        the means of the retained rows. Call it between steps (from the thread that runs
        ``step()``); appends may run concurrently. ``skip_missing``: ids not stored are
        passed over (``Retirement.missing``) instead of refused. Returns the store's
        ``Retirement``.
        """
        if self.store.batch_size != self.batch_size:
            raise RuntimeError(
                f"the store's prefix ({self.store.batch_size} rows) is not the algorithm's "
                f"batch ({self.batch_size} rows): grow it only through step()"
            )
        labels, xx, dist2 = self._vote_arrays()
        self._weigh_sums()  # v float64 before a weighted vote leaves it

        def take_back(data: np.ndarray, rows: np.ndarray) -> None:
            remove_votes(data, rows, labels, xx, dist2, self.S, self.v, self.Q, self.sse,
                         self.store.weights_buffer)

        out = self.store.retire(ids=ids, before=before, on_prefix=take_back,
                               skip_missing=skip_missing)
        if out.n_prefix:
            b_old = self.batch_size
            for rows in self._row_arrays():
                rows[out.prefix_to] = rows[out.prefix_from]
            labels[out.batch_size : b_old] = -1  # vacated: these rows hold no vote
            self.batch_size = out.batch_size
            self._clear_emptied()
            if self.initialized and self._sse_from_sums_on_update:
                # sse of the retained rows under the current centroids (update discarded).
                centroid_update(self.S, self.v, self.Q, self.centroids, sse_out=self.sse)
            self.counts = self.v.copy()
            self.converged = False
        return out

    def forget(self, ids: np.ndarray) -> np.ndarray:
        """Delete the stored samples with stream ids ``ids`` (``(m,)`` int, any order),
        exactly; ids not stored (never stored, retired or deleted before) are skipped.

        One mechanism with retention: :meth:`retire` takes each deleted prefix row's vote
        (``w x`` from ``S``, ``w`` from ``v``, ``w ||x||^2`` from ``Q``) out and removes
        the rows from the store. Then every cluster whose sums changed gets its centroid
        from them at once (:func:`~nmbatch.engine.kernels.update.centroid_update`:
        ``S(j)/v(j)``, ``S(j)/||S(j)||`` under cosine; a cluster left empty keeps its
        centroid), and the distance it moved is added to ``p(j)``: the next step's bound
        sweep loosens the bounds by the whole move since they were last valid (triangle
        inequality), so they stay sound. Call it between steps. Returns ``(m,)`` bool:
        which of ``ids`` were stored and are deleted now.
        """
        query = np.asarray(ids, dtype=np.int64).ravel()
        valid = query >= 0  # a negative id is never stored
        S, v = self.S.copy(), self.v.copy()
        out = self.retire(ids=query[valid], skip_missing=True)
        move_changed_centroids(self, S, v, sse_from_sums=self._sse_from_sums_on_update)
        return valid & ~np.isin(query, out.missing)

    def lookup(self, ids: np.ndarray) -> SampleLookup:
        """Which of the stream ids ``ids`` (``(m,)`` int) are stored, and for those their
        nearest centroid now and its squared distance, computed exactly against the
        current centroids (:func:`~nmbatch.engine.assign.nearest`), whatever label the
        sample holds in the batch."""
        found, rows = self.store.find(ids)
        return sample_lookup(found, rows, self.centroids if self.initialized else None)

    def _vote_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(labels, xx, dist2)`` by store row for ``remove_votes`` (empty: not kept)."""
        return self._labels, EMPTY_F64, self._dist2

    def _row_arrays(self) -> list[np.ndarray]:
        """The per-row arrays, indexed by store row, that move with the rows."""
        return [self._labels, self._dist2]

    def energy_estimate(self) -> float:
        """Mean ``d(i)^2`` over the samples the algorithm holds (``sse.sum() / b``); under
        ``metric="cosine"`` the mean cosine dissimilarity ``1 - cos = d(i)^2 / 2``."""
        b = self.v.sum()  # the weight of the samples held (their number, unweighted)
        if not b > 0:
            return float("nan")
        return float(max(self.sse.sum(), 0.0) / b) / (2.0 if self._unit else 1.0)

    def nbytes(self) -> int:
        """Bytes of the algorithm's own arrays (per-sample state such as labels and bounds,
        at their current capacity, and per-cluster sums), not counting the store."""
        return sum(
            int(a.nbytes) for a in vars(self).values()
            if isinstance(a, np.ndarray) and a.base is None
        )

    def bytes_per_sample(self) -> int:
        """Bytes the algorithm keeps per batch row (labels, norms, distances, bounds),
        the row itself and its id in the store not counted."""
        arrays = {id(a): a for a in (*self._row_arrays(), getattr(self, "_dist2", None))}
        return sum(
            a.itemsize * int(np.prod(a.shape[1:])) for a in arrays.values()
            if isinstance(a, np.ndarray)
        )

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
            engine_bytes=int(self.store.nbytes + self.nbytes()),
            n_retired=int(self.store.n_retired),
            n_ingested=int(self.store.n_ingested),
        )

    # -- shared machinery -------------------------------------------------------------
    def _initialise(self, X: np.ndarray) -> None:
        """Set the starting centroids from the first rows ``X`` of the store (not votes),
        drawn by their weights in a weighted store."""
        w = self.store.weights_buffer
        weights = w[: X.shape[0]].copy() if w.shape[0] else None
        self.centroids = initial_centroids(self._init, X, self.n_clusters, self._rng, weights)
        self.initialized = True
        self.subspace.reset()

    def _clear_emptied(self) -> None:
        """In a weighted store, zero the sums of every cluster left without a voting row
        (label ``j``, weight > 0) in the prefix. Fractional weights added and taken back
        need not cancel in float64 (``0.1 + 0.2 - 0.1 - 0.2 != 0``): the residue would
        make ``S(j)/v(j)`` an arbitrary point instead of an empty cluster. One pass over
        the prefix labels (numpy), only when weighted; unweighted sums cancel exactly."""
        w = self.store.weights_buffer
        if not w.shape[0]:
            return
        empty = ~voting_clusters(self._labels, w, self.batch_size, self.n_clusters)
        self.S[empty] = 0.0
        self.v[empty] = 0.0
        self.Q[empty] = 0.0
        self.sse[empty] = 0.0

    def _weigh_sums(self) -> np.ndarray:
        """The store's weights by row for the kernels (empty: unweighted). The first time
        the store is weighted, ``v`` (and ``counts``) become float64 sums of weights: an
        unweighted model keeps its int64 counts and its kernels' signatures."""
        w = self.store.weights_buffer
        if w.shape[0] and self.v.dtype != np.float64:
            self.v = self.v.astype(np.float64)
            self.counts = self.counts.astype(np.float64)
        return w

    def _require_samples(self) -> None:
        if not self.ready():
            raise ValueError(
                f"the store holds {self.store.n_samples} samples; {self.n_clusters} "
                f"(n_clusters) are needed before the first iteration"
            )

    def _dense_pass(
        self,
        data: np.ndarray,
        rows: np.ndarray,
        *,
        remove: bool,
        labels: np.ndarray,
        dist2: np.ndarray,
        lower: np.ndarray | None = None,
        upper: np.ndarray | None = None,
        norms: np.ndarray | None = None,
        fresh: bool = True,
        groups: np.ndarray | None = None,
    ) -> int:
        """Assign ``rows`` (sorted, int64) of ``data`` with BLAS distances in chunks
        (:func:`~nmbatch.engine.products.products`: the chunks' products on all kernel
        threads, then the parallel assignment kernel over them).

        Arguments as :func:`~nmbatch.engine.kernels.dense.assign_dense`; ``lower`` and
        ``upper``: the bounds to write (None: none). ``norms`` (N,) float64, optional: a
        cache of ``||data[i]||^2`` by row, written for ``rows`` when ``fresh`` (the kernel
        computes them as it reads each row), read from otherwise. ``groups`` (k,) int32,
        optional: ``lower`` holds one bound per group of centroids (``groups[j]``: the
        group of ``j``; :func:`~nmbatch.engine.kernels.grouped_dense.assign_dense_grouped`).

        Returns the number of rows whose label changed.
        """
        C = self.centroids
        Ct = np.ascontiguousarray(C.T)
        cc = sqnorms(C)
        w = self._weigh_sums()
        common = {
            "labels": labels, "dist2": dist2, "S": self.S, "v": self.v, "sse": self.sse,
            "Q": self.Q, "remove": remove, "sqnorms": norms, "sqnorms_known": not fresh,
            "lower_bounds": lower, "upper_bounds": upper,
            "weights": w if w.shape[0] else None,
        }  # fmt: skip
        # Group bounds take the full product (their kernel has no subspace path).
        sub = self.subspace.for_pass(data, rows, C) if groups is None else None
        if use_pool(rows.shape[0], C.shape[0], C.shape[1]):
            return pooled_assign(data, rows, C, Ct, cc, group_of=groups, subspace=sub,
                                 **common)  # fmt: skip
        step = PRODUCT_ROWS * chunks_at_once(C.shape[0])
        out = np.empty((min(step, rows.shape[0]), C.shape[0]), dtype=np.float32)
        changed = 0
        for start in range(0, rows.shape[0], step):
            r = rows[start : start + step]
            if sub is not None:
                proj, PCt, rc = sub
                dots, rx = projected_products(proj, data, r, PCt, out)
                changed += assign_dense(data, r, C, dots=dots, cc=cc,
                                        projected=(rx, rc, proj.slack), **common)  # fmt: skip
                continue
            dots = products(data, r, Ct, out)
            if groups is None:
                changed += assign_dense(data, r, C, dots=dots, cc=cc, **common)
            else:
                changed += assign_dense_grouped(data, r, C, dots=dots, cc=cc, group_of=groups,
                                                **common)  # fmt: skip
        return changed

    def _update_centroids(self) -> None:
        """``c(j) = S(j)/v(j)`` (cosine: ``S(j)/||S(j)||``) where ``v(j) > 0``; ``p(j)`` =
        distance moved (rounded up)."""
        self.centroids, self.p = centroid_update(
            self.S, self.v, self.Q, self.centroids,
            sse_out=self.sse if self._sse_from_sums_on_update else None, unit=self._unit,
        )
        self.counts = self.v.copy()

    def _doubling_allowance(self) -> int:
        """Clusters that may fail the doubling test: 0, the paper's rule."""
        return 0

    def _doubling_test(self, rho: float, allowed: int | None = None) -> bool:
        """``sigma_C(j) / p(j) > rho`` for every non-empty moved cluster but at most
        ``allowed`` of them (default :meth:`_doubling_allowance`), with the rules above: a
        moved cluster with ``v(j) <= 1`` fails (``v(j) = 1`` unweighted; with sample
        weights ``v(j)`` is the sum of its samples' weights, and the formulas below are
        those of ``v(j)`` copies: docs/design.md, "Sample weights"). Under
        ``metric="cosine"``, ``sigma_C(j)`` is the standard error of the direction
        ``S(j)/||S(j)||``,
        ``sqrt(max(v(j) Q(j) - ||S(j)||^2, 0) / ((v(j) - 1) ||S(j)||^2))`` (infinite for
        ``S(j) = 0``; docs/design.md, "Spherical k-means")."""
        if allowed is None:
            allowed = self._doubling_allowance()
        v = self.v.astype(np.float64)
        p = self.p
        testing = (v > 0) & (p > 0.0)
        n_failed = int((testing & (v <= 1)).sum())
        if n_failed > allowed:
            return False
        testing &= v > 1
        vt = v[testing]
        if self._unit:
            St = self.S[testing]
            norm2 = np.einsum("ij,ij->i", St, St)
            with np.errstate(divide="ignore", invalid="ignore"):
                spread = np.maximum(vt * self.Q[testing] - norm2, 0.0) / ((vt - 1.0) * norm2)
            sigma = np.sqrt(np.where(norm2 > 0.0, spread, np.inf))
        else:
            sigma = np.sqrt(np.maximum(self.sse[testing], 0.0) / (vt * (vt - 1.0)))
        n_failed += int((~(sigma / p[testing] > rho)).sum())
        return n_failed <= allowed


def voting_clusters(labels: np.ndarray, weights: np.ndarray, b: int, k: int) -> np.ndarray:
    """The clusters that hold a vote of the prefix ``[0, b)``: ``(k,)`` bool, cluster
    ``j`` labels a row of weight > 0. ``labels`` ``(>= b,)`` int32 (``-1``: no vote),
    ``weights`` ``(>= b,)`` float64 (a weighted store's ``weights_buffer``)."""
    lab = labels[:b]
    voting = (lab >= 0) & (weights[:b] > 0)
    return np.bincount(lab[voting], minlength=k) > 0


def move_changed_centroids(
    model: Any, S: np.ndarray, v: np.ndarray, *, sse_from_sums: bool
) -> None:
    """After votes left ``model``'s sums (a deletion), the clusters whose sums differ from
    ``S`` ``(k, d)`` float64 and ``v`` ``(k,)`` (the sums before) get their centroid from
    them at once (:func:`~nmbatch.engine.kernels.update.centroid_update`; a cluster left
    empty keeps its own), and the distance each moved is added to ``p(j)``, so the bounds
    the next sweep loosens by ``p`` stay sound (docs/design.md, "Exact deletion");
    ``sse_from_sums``: ``sse`` recomputed under the new centroids. ``model``: a
    ``KMeansAlgorithm`` or the Ray coordinator (``S``, ``v``, ``Q``, ``centroids``,
    ``p``, ``sse``, ``initialized``; ``_unit`` for unit centroids)."""
    touched = (model.v != v) | (model.S != S).any(axis=1)
    if not (model.initialized and touched.any()):
        return
    unit = bool(getattr(model, "_unit", False))
    C, moved = centroid_update(model.S, model.v, model.Q, model.centroids, unit=unit)
    C[~touched] = model.centroids[~touched]
    model.centroids = C
    model.p = model.p + np.where(touched, moved, 0.0)
    if sse_from_sums:  # sse under the centroids now in force
        centroid_update(model.S, model.v, model.Q, model.centroids, sse_out=model.sse)
