"""The published model: immutable snapshots the worker swaps and the routes read.

The worker builds a new :class:`PublishedModel` (and :class:`PublishedStats`) after each
iteration and swaps it into the :class:`ModelBoard` with one reference assignment. A
reader takes the reference once and uses only that object, so it never sees centroids
of one version with counts of another, and never waits for an iteration. The arrays are
read-only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DoublingEvent", "ModelBoard", "PublishedModel", "PublishedStats"]


def _frozen(array: np.ndarray, dtype: type) -> np.ndarray:
    out = np.array(array, dtype=dtype, copy=True, order="C")
    out.flags.writeable = False
    return out


@dataclass(frozen=True, slots=True)
class PublishedModel:
    """Centroids of one version and what describes them.

    Attributes
    ----------
    version : int
        Increases by at least one with each publication; never decreases, also across
        restarts.
    centroids : ndarray (k, d) float32, read-only
    counts : ndarray (k,) int64, read-only
        ``v(j)``: prefix samples assigned to centroid ``j``.
    n_samples : int
        ``N``: samples in the worker's store when published.
    batch_size : int
        ``b``: prefix size (the nested batch).
    iteration : int
    converged : bool
        ``b == N`` and no assignment changed in the last iteration.
    updated_at : float
        Unix time of the centroid update.
    """

    version: int
    centroids: np.ndarray
    counts: np.ndarray
    n_samples: int
    batch_size: int
    iteration: int
    converged: bool
    updated_at: float

    @classmethod
    def build(
        cls,
        *,
        version: int,
        centroids: np.ndarray,
        counts: np.ndarray,
        n_samples: int,
        batch_size: int,
        iteration: int,
        converged: bool,
        updated_at: float | None = None,
    ) -> PublishedModel:
        """Copy the arrays into read-only ones and build the record."""
        return cls(
            version=int(version),
            centroids=_frozen(centroids, np.float32),
            counts=_frozen(counts, np.int64),
            n_samples=int(n_samples),
            batch_size=int(batch_size),
            iteration=int(iteration),
            converged=bool(converged),
            updated_at=time.time() if updated_at is None else float(updated_at),
        )

    @property
    def k(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])


@dataclass(frozen=True, slots=True)
class DoublingEvent:
    """The nested batch grew from ``from_size`` to ``to_size`` after ``iteration``."""

    iteration: int
    from_size: int
    to_size: int
    at: float


@dataclass(frozen=True, slots=True)
class PublishedStats:
    """The algorithm's course so far, as shown by ``GET /stats``.

    ``distances_computed`` and ``distances_skipped`` count sample-centroid distances over
    all iterations of this process; ``energy`` is the mean squared distance of the prefix
    samples to their centroid (``sse.sum() / b``), None before the first iteration.
    """

    phase: str = "starting"
    iteration: int = 0
    batch_size: int = 0
    n_samples: int = 0
    converged: bool = False
    energy: float | None = None
    distances_computed: int = 0
    distances_skipped: int = 0
    doublings: tuple[DoublingEvent, ...] = field(default_factory=tuple)
    last_iteration_seconds: float | None = None

    @property
    def skipped_share(self) -> float | None:
        """Share of distance computations avoided by the bounds (None before any)."""
        total = self.distances_computed + self.distances_skipped
        return self.distances_skipped / total if total else None


class ModelBoard:
    """Where the worker publishes and the routes read; swaps are single assignments."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # serialises writers only; readers never take it
        self._model: PublishedModel | None = None
        self._stats = PublishedStats()

    @property
    def model(self) -> PublishedModel | None:
        """The current model, or None before the first one."""
        return self._model

    @property
    def stats(self) -> PublishedStats:
        """The current algorithm statistics."""
        return self._stats

    def publish(self, model: PublishedModel) -> bool:
        """Make ``model`` current unless a version >= its version is; returns True if so."""
        with self._lock:
            current = self._model
            if current is not None and model.version <= current.version:
                return False
            self._model = model
            return True

    def publish_stats(self, stats: PublishedStats) -> None:
        """Make ``stats`` current."""
        self._stats = stats
