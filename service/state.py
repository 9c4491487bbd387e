"""The published model: immutable records the worker swaps and the routes read.

The worker builds a new :class:`PublishedModel` (and :class:`PublishedStats`) after each
iteration and swaps it into the :class:`ModelBoard` with one reference assignment. A
reader takes the reference once and uses only that object, so it never sees centroids
of one version with counts of another, and never waits for an iteration. The arrays are
read-only. A pinned version (``POST /pin``) is held beside the newest one:
:attr:`ModelBoard.served` is what reads serve, the pinned model if any, else the newest;
the worker goes on publishing (and snapshotting) the newest. The board also keeps the
recent energy estimates by version
(:class:`EnergyPoint`, for the dashboard's chart), as an immutable tuple swapped the same way.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from nmbatch.engine.state import ModelState
from nmbatch.service.identities import Lineage

__all__ = [
    "ENERGY_HISTORY",
    "DoublingEvent",
    "EnergyPoint",
    "ModelBoard",
    "PublishedModel",
    "PublishedStats",
]

#: Energy points the board keeps (the most recent versions).
ENERGY_HISTORY = 500


def _frozen(array: np.ndarray, dtype: type) -> np.ndarray:
    out = np.array(array, dtype=dtype, copy=True, order="C")
    out.flags.writeable = False
    return out


@dataclass(frozen=True, slots=True)
class PublishedModel:
    """The model's state under a version number, as served.

    Attributes
    ----------
    version : int
        Increases by at least one with each publication; never decreases, also across
        restarts.
    state : ModelState
        Centroids ``(k, d)`` float32 and counts ``(k,)`` int64 (float64 sums of weights
        for a weighted model; read-only copies), ``b``,
        ``N`` (samples in the worker's store when published), iteration, convergence.
    updated_at : float
        Unix time of the centroid update.
    lineage : Lineage or None
        Its clusters against those of the previous snapshot
        (:mod:`~nmbatch.service.identities`); None when not known (a version written
        before identities were kept).
    """

    version: int
    state: ModelState
    updated_at: float
    lineage: Lineage | None = None

    @classmethod
    def build(
        cls, *, version: int, state: ModelState, updated_at: float | None = None,
        lineage: Lineage | None = None,
    ) -> PublishedModel:  # fmt: skip
        """Copy the arrays of ``state`` into read-only ones and build the record."""
        frozen = dataclasses.replace(
            state,
            centroids=_frozen(state.centroids, np.float32),
            # v(j): int64 counts, or float64 sums of weights once the store is weighted
            counts=_frozen(
                state.counts, np.float64 if state.counts.dtype.kind == "f" else np.int64
            ),
        )
        return cls(
            version=int(version),
            state=frozen,
            updated_at=time.time() if updated_at is None else float(updated_at),
            lineage=lineage,
        )


@dataclass(frozen=True, slots=True)
class DoublingEvent:
    """The nested batch grew from ``from_size`` to ``to_size`` after ``iteration``."""

    iteration: int
    from_size: int
    to_size: int
    at: float


@dataclass(frozen=True, slots=True)
class EnergyPoint:
    """The energy estimate ``/stats`` showed with centroid ``version``, at Unix time ``at``."""

    version: int
    energy: float
    at: float


@dataclass(frozen=True, slots=True)
class PublishedStats:
    """The algorithm's course so far, as shown by ``GET /stats``.

    ``phase`` is the worker's phase then (a ``Phase`` of :mod:`nmbatch.service.worker.roles`,
    which compares equal to its string; this module sits below the worker, so the default
    is written as the string of ``Phase.STARTING``).

    ``distances_computed`` and ``distances_skipped`` count sample-centroid distances over
    all iterations of this process; ``energy`` is the mean squared distance of the prefix
    samples to their centroid (``sse.sum() / b``), None before the first iteration.
    ``engine_bytes`` is the memory of this process's engine (``ModelState.engine_bytes``:
    store at capacity and the algorithm's arrays), 0 without an engine (a standby).
    ``drift`` is the worker's drift figure (:mod:`nmbatch.service.worker.signals`), None
    before its first measure or on a standby.
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
    engine_bytes: int = 0
    n_retired: int = 0
    n_ingested: int = 0
    drift: float | None = None

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
        self._pinned: PublishedModel | None = None
        self._stats = PublishedStats()
        self._energy: tuple[EnergyPoint, ...] = ()

    @property
    def model(self) -> PublishedModel | None:
        """The current model, or None before the first one."""
        return self._model

    @property
    def pinned(self) -> PublishedModel | None:
        """The pinned model (a kept version), or None: reads follow the newest."""
        return self._pinned

    @property
    def served(self) -> PublishedModel | None:
        """What reads serve: the pinned model if any, else the current one."""
        pinned = self._pinned
        return pinned if pinned is not None else self._model

    def pin(self, model: PublishedModel | None) -> None:
        """Serve ``model`` (a kept version) whatever is published next; None: the newest."""
        self._pinned = model

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

    @property
    def energy_history(self) -> tuple[EnergyPoint, ...]:
        """The last :data:`ENERGY_HISTORY` energy estimates, one per version, oldest first."""
        return self._energy

    def publish_stats(self, stats: PublishedStats) -> None:
        """Make ``stats`` current, and record its energy under the current version.

        Each version keeps one point: the energy ``/stats`` shows with it (a later
        estimate under the same version replaces the point; the same one leaves it as it
        is). Statistics without energy (before the first iteration, a standby) add none.
        """
        with self._lock:
            model = self._model
            if stats.energy is not None and model is not None:
                history = self._energy
                last = history[-1] if history else None
                if last is None or last.version != model.version or last.energy != stats.energy:
                    if last is not None and last.version == model.version:
                        history = history[:-1]
                    point = EnergyPoint(model.version, float(stats.energy), time.time())
                    self._energy = (*history[-(ENERGY_HISTORY - 1) :], point)
            self._stats = stats
