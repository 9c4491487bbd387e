"""The baselines nmbatch is compared with: ``lloyd``, ``mbatch`` and ``mbatch.remove``.

- ``lloyd``: exact full-batch k-means, distances by BLAS.
- ``mbatch``: Sculley's mini-batch k-means (uniform random batches, running sums).
- ``mbatch.remove``: mbatch whose samples give back their old vote when drawn again.

(``elkan``, the bounded exact baseline, is nmbatch's kernel over all samples:
:mod:`nmbatch.engine.algorithms.nested`.)
"""

from __future__ import annotations

import time

import numpy as np

from nmbatch.engine.algorithms.base import KMeansAlgorithm
from nmbatch.engine.algorithms.relocation import relocate_empty
from nmbatch.engine.state import IterationStats
from nmbatch.engine.store import NestedBatchStore, Retirement

__all__ = ["Lloyd", "MiniBatch"]


class _WithoutBounds(KMeansAlgorithm):
    """An algorithm that keeps a label and ``d(i)^2`` per stored row, and no bounds."""

    def __init__(self, store: NestedBatchStore, n_clusters: int, **kwargs) -> None:
        kwargs.pop("rho", None)
        super().__init__(store, n_clusters, **kwargs)
        self._labels = np.empty(0, dtype=np.int32)
        self._dist2 = np.empty(0, dtype=np.float64)

    def labels(self) -> np.ndarray:
        """Assignments of the rows ``[0, batch_size)`` (``-1``: never drawn): int32 copy."""
        return self._labels[: self.batch_size].copy()

    def _initial_rows(self, n: int) -> int:
        """How many of the ``n`` stored rows the initial centroids are chosen from."""
        return n

    def _begin_step(self) -> tuple[float, int, np.ndarray, int]:
        """Freeze every stored row, set the initial centroids if not yet, make room.

        Returns ``(t0, N, buffer, n)``: the step's start time, the number of samples read
        from the store, its buffer, and the rows of it frozen (``[0, n)`` valid).
        """
        self._require_samples()
        t0 = time.perf_counter()
        n_now = self.store.n_samples
        data, n = self.store.freeze(n_now)
        if not self.initialized:
            self._initialise(data[: self._initial_rows(n)])
        if self._labels.shape[0] < n:
            labels = np.full(n, -1, dtype=np.int32)
            labels[: self.batch_size] = self._labels[: self.batch_size]
            dist2 = np.zeros(n, dtype=np.float64)
            dist2[: self.batch_size] = self._dist2[: self.batch_size]
            self._labels, self._dist2 = labels, dist2
        return t0, n_now, data, n


class Lloyd(_WithoutBounds):
    """Exact k-means: every iteration assigns all ``N`` samples by BLAS, then takes means."""

    name = "lloyd"

    def __init__(
        self, store: NestedBatchStore, n_clusters: int, *, relocate_empty: bool = True, **kwargs
    ) -> None:
        super().__init__(store, n_clusters, **kwargs)
        self.relocate_empty = bool(relocate_empty)
        self.n_relocated = 0  # empty clusters given a sample by the last step

    def step(self) -> IterationStats:
        t0, n_now, data, b = self._begin_step()
        b_old = self.batch_size
        self.S[:] = 0.0
        self.v[:] = 0
        self.sse[:] = 0.0
        self.Q[:] = 0.0
        n_changed = self._dense_pass(
            data, np.arange(b, dtype=np.int64), remove=False,
            labels=self._labels, dist2=self._dist2,
        )
        self.batch_size = b
        C_prev = self.centroids
        self._update_centroids()
        self.n_relocated = 0
        empty = np.empty(0, dtype=np.int64)
        if self.relocate_empty:
            w = self._weigh_sums()  # first: it may make v float64
            empty = np.flatnonzero(self.v == 0)  # relocate_empty fills them in this order
            self.n_relocated = relocate_empty(
                data, b, labels=self._labels, norms=None, S=self.S, v=self.v, Q=self.Q,
                sse=self.sse, C=self.centroids, C_prev=C_prev, p=self.p, unit=self._unit,
                weights=w,
            )  # fmt: skip
            self.counts = self.v.copy()
        self.iteration += 1
        # Not a fixed point if the update moved a centroid (after a retirement).
        self.converged = n_changed == 0 and b == b_old and not self.p.any()
        return IterationStats(
            iteration=self.iteration, batch_size=b, next_batch_size=b, n_samples=n_now,
            n_changed=n_changed, n_new=b - b_old, doubled=False, converged=self.converged,
            n_distances=b * self.n_clusters, n_skipped=0, seconds=time.perf_counter() - t0,
            n_relocated=self.n_relocated,
            relocated=tuple(int(j) for j in empty[: self.n_relocated]),
        )


class MiniBatch(_WithoutBounds):
    """Sculley's mbatch (``remove=False``) and mbatch.remove (``remove=True``).

    Each iteration draws ``batch_size`` samples uniformly from the store. mbatch adds every
    assignment to the running sums (centroids are running averages of all assignments
    ever made); mbatch.remove first takes back the sample's previous vote. Only
    mbatch.remove can ``retire`` samples (exactly); mbatch raises ``NotImplementedError``.
    """

    def __init__(
        self, store: NestedBatchStore, n_clusters: int, *, remove: bool = False, **kwargs
    ) -> None:
        super().__init__(store, n_clusters, **kwargs)
        self.remove = bool(remove)
        self.name = "mbatch.remove" if remove else "mbatch"

    def _initial_rows(self, n: int) -> int:
        return max(min(self.initial_batch_size, n), self.n_clusters)

    def retire(
        self, *, ids: np.ndarray | None = None, before: int | None = None,
        skip_missing: bool = False,
    ) -> Retirement:
        """Forget samples exactly (``mbatch.remove``: each drawn sample holds one vote).

        ``mbatch`` keeps running averages of every assignment ever made: a sample drawn
        five times voted five times, and only its last vote is recorded, so its votes
        cannot be taken back exactly. It raises ``NotImplementedError``.
        """
        if not self.remove:
            raise NotImplementedError(
                "mbatch keeps running averages of every assignment ever made and cannot "
                "forget a sample exactly; use mbatch.remove, nmbatch, elkan or lloyd"
            )
        return super().retire(ids=ids, before=before, skip_missing=skip_missing)

    def step(self) -> IterationStats:
        t0, n_now, data, n = self._begin_step()
        m = min(self.initial_batch_size, n)
        if self.remove:
            rows = np.sort(self._rng.choice(n, size=m, replace=False))
        else:
            rows = np.sort(self._rng.integers(0, n, size=m))
        n_changed = self._dense_pass(
            data, rows.astype(np.int64), remove=self.remove,
            labels=self._labels, dist2=self._dist2,
        )
        self.batch_size = n
        self._update_centroids()
        self.iteration += 1
        return IterationStats(
            iteration=self.iteration, batch_size=m, next_batch_size=m, n_samples=n_now,
            n_changed=n_changed, n_new=0, doubled=False, converged=False,
            n_distances=m * self.n_clusters, n_skipped=0, seconds=time.perf_counter() - t0,
        )
