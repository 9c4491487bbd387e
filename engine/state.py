"""The model's state as the engine reports it after a step or a restore, and the records
of what a retirement did and where stored samples stand.

One record for every consumer: the engine child process sends it to the server as it is,
the service publishes it (with a version) and persists it (with the log position).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["IterationStats", "ModelState", "Retirement", "SampleLookup"]


@dataclass(frozen=True)
class IterationStats:
    """What one ``step()`` did.

    ``n_relocated``: empty clusters given a sample; ``relocated``: those clusters, in the
    order they took one (each index now names a cluster with a new meaning, its old one
    having lost every sample); ``swaps``: the cluster swaps of the step in order, each
    ``(merged, into, split)``: cluster ``merged`` joined ``into`` (all its samples), then
    took the second part of ``split`` (:mod:`~nmbatch.engine.algorithms.swap`). A step's
    swaps never touch its relocated clusters nor each other's clusters.
    """

    iteration: int
    batch_size: int
    next_batch_size: int
    n_samples: int
    n_changed: int
    n_new: int
    doubled: bool
    converged: bool
    n_distances: int
    n_skipped: int
    seconds: float
    n_relocated: int = 0
    relocated: tuple[int, ...] = ()
    swaps: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class Retirement:
    """What one ``NestedBatchStore.retire`` call did.

    Prefix rows moved from ``prefix_from[t]`` to ``prefix_to[t]`` (``int64``, both in the
    old prefix, ``prefix_to < batch_size``), tail rows from ``tail_from[t]`` to
    ``tail_to[t]``; ``prefix_rows``: the retired prefix rows (sorted, old positions);
    ``n_prefix``/``n_tail``: rows retired from each part; ``batch_size``/``n_samples``:
    the new ``b`` and ``N``; ``missing``: the ids asked for that were not stored
    (sorted, distinct; empty unless ``skip_missing``).
    """

    n_prefix: int
    n_tail: int
    batch_size: int
    n_samples: int
    prefix_rows: np.ndarray
    prefix_from: np.ndarray
    prefix_to: np.ndarray
    tail_from: np.ndarray
    tail_to: np.ndarray
    missing: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    @property
    def n_retired(self) -> int:
        """Rows retired by the call."""
        return self.n_prefix + self.n_tail


@dataclass(frozen=True)
class SampleLookup:
    """Where stored samples stand, by stream id (``KMeansAlgorithm.lookup``).

    present : (m,) bool     the id's sample is stored (retained, not deleted)
    labels  : (m,) int64    its nearest centroid now, exactly (-1 where not present)
    sqdist  : (m,) float64  its squared distance to that centroid, as
              :func:`~nmbatch.engine.assign.nearest` gives it (NaN where not present;
              under ``metric="cosine"``, of the unit row: ``similarity`` and
              ``dissimilarity`` of :mod:`nmbatch.engine.metric` read it)
    """

    present: np.ndarray
    labels: np.ndarray
    sqdist: np.ndarray


@dataclass(frozen=True, slots=True)
class ModelState:
    """Centroids and the counters that describe them.

    Attributes
    ----------
    centroids : ndarray (k, d) float32
        ``C``; a new array after every step (never mutated in place).
    counts : ndarray (k,) int64
        ``v(j)``: prefix samples assigned to centroid ``j``.
    batch_size : int
        ``b``: the nested batch (prefix) size.
    n_samples : int
        ``N``: samples in the store.
    iteration : int
        Iterations run (``t``).
    converged : bool
        ``b == N`` and the last iteration changed no assignment and moved no centroid.
    initialized : bool
        The starting centroids are set (false until the first step).
    energy : float or None
        Mean ``d(i)^2`` of the prefix samples (``sse.sum() / b``; under
        ``metric="cosine"`` the mean cosine dissimilarity ``1 - cos``, half of it); None
        before the first iteration.
    stats : IterationStats or None
        What the step that produced this state did; None after a restore.
    engine_bytes : int
        Memory of the engine's arrays: the store's rows (at capacity) and the
        algorithm's per-sample and per-cluster state.
    n_retired : int
        Samples retired from the store (exact forgetting) since it was made.
    n_ingested : int
        One more than the largest stream id ever stored (with default ids: ``N``
        plus ``n_retired``).
    """

    centroids: np.ndarray
    counts: np.ndarray
    batch_size: int
    n_samples: int
    iteration: int
    converged: bool
    initialized: bool
    energy: float | None = None
    stats: IterationStats | None = None
    engine_bytes: int = 0
    n_retired: int = 0
    n_ingested: int = 0

    @property
    def k(self) -> int:
        """Number of centroids."""
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        """Dimension of the samples."""
        return int(self.centroids.shape[1])
