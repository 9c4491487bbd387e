"""Retention policies: which samples the model keeps as the stream goes on.

A policy sees the stream only as batches of new samples (and, for ``age``, the time each
batch was accepted); for each batch it answers with an :class:`Admission`: which rows of
the batch enter the store, under which stream ids, and which stored samples leave (every
id below ``retire_before``, plus ``retire_ids``). The streaming driver
(:mod:`nmbatch.engine.hosting.driver`) carries an admission out on a model: the
retirements first (exactly, votes taken back: ``KMeansAlgorithm.retire``), then the
append, so the store never holds more than the policy allows.

- ``all``: keep everything (``max_samples``: a capacity; a batch that would pass it is
  refused whole with :class:`CapacityError`).
- ``window``: the last ``max_samples`` samples, in stream order.
- ``age``: the samples accepted less than ``max_age_seconds`` ago (a sample accepted at
  ``t`` leaves at the first batch with ``now >= t + max_age_seconds``), optionally also
  at most ``max_samples``. Times come from the caller (``now=``) or the injectable clock.
- ``reservoir``: a uniform random sample of ``max_samples`` of every sample offered
  (Vitter's algorithm R, vectorised per batch, seeded).

Stream ids count every sample offered to the policy, admitted or not, from 0.

A sample deleted by its id (exact deletion: ``KMeansAlgorithm.forget``) is told to the
policy (:meth:`RetentionPolicy.forget`), so that its count of retained samples stays the
store's and it never retires the sample a second time: ``window`` and ``age`` keep the
deleted ids inside their range until it passes them, the reservoir empties the slot
(the next sample drawing it fills it and retires nothing), ``all`` frees the capacity.
"""

from __future__ import annotations

import collections
import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CATCH_UP_CHANGED",
    "CATCH_UP_STEPS",
    "RETENTIONS",
    "Admission",
    "AgeRetention",
    "AllRetention",
    "CapacityError",
    "ReservoirRetention",
    "RetentionPolicy",
    "WindowRetention",
    "catch_up_steps",
    "check_catch_up",
    "check_retention",
    "make_retention",
    "wants_catch_up",
]

RETENTIONS = ("all", "window", "age", "reservoir")
CATCH_UP_STEPS = 3
"""Further iterations a ``partial_fit`` call may run under ``window`` and ``age`` (``auto``)."""
CATCH_UP_CHANGED = 0.01
"""An iteration that reassigned more than this share of the batch calls for another."""

_EMPTY_IDS = np.empty(0, dtype=np.int64)


class CapacityError(ValueError):
    """A batch would take the store past the capacity of retention ``all``."""


@dataclass(frozen=True)
class Admission:
    """The policy's answer for one batch of ``m`` new samples.

    keep          : (a,) int64  indices into the batch of the rows that enter, increasing
    ids           : (a,) int64  their stream ids, increasing
    retire_before : int         every stored sample with ``id < retire_before`` leaves
    retire_ids    : (r,) int64  and these stored samples leave
    """

    keep: np.ndarray
    ids: np.ndarray
    retire_before: int = 0
    retire_ids: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)

    @property
    def retires(self) -> bool:
        """True if the admission takes stored samples out."""
        return self.retire_before > 0 or self.retire_ids.shape[0] > 0


class RetentionPolicy:
    """Base of the policies: counts the stream and admits every sample.

    ``max_samples`` bounds the samples retained (None: no bound); ``retained`` is how
    many the policy's answers leave in the store; ``threshold``: every id below it has
    left (window and age), the largest ``retire_before`` answered so far.
    """

    name = "all"

    def __init__(self, max_samples: int | None = None) -> None:
        self.max_samples = None if max_samples is None else int(max_samples)
        self.n_offered = 0
        self.retained = 0
        self.threshold = 0

    def admit(self, m: int, now: float | None = None) -> Admission:
        """The admission of ``m`` new samples (``m = 0``: only what time retires)."""
        raise NotImplementedError

    def forget(self, ids: np.ndarray) -> None:
        """Count out the retained samples with stream ids ``ids`` (``(r,)`` int64,
        distinct, each retained: just deleted from the store)."""
        self.retained -= int(np.asarray(ids).shape[0])

    def _all(self, m: int, *, retire_before: int = 0) -> Admission:
        first = self.n_offered
        self.n_offered += m
        ids = np.arange(first, first + m, dtype=np.int64)
        return Admission(np.arange(m, dtype=np.int64), ids, retire_before)


class AllRetention(RetentionPolicy):
    """Keep every sample; with ``max_samples``, refuse a batch that would pass it."""

    def admit(self, m: int, now: float | None = None) -> Admission:
        if self.max_samples is not None and self.retained + m > self.max_samples:
            raise CapacityError(
                f"the store holds {self.retained} samples; {m} more would pass "
                f"max_samples={self.max_samples}"
            )
        self.retained += m
        return self._all(m)


class _RangeRetention(RetentionPolicy):
    """A policy that retains a range of stream ids (``window``, ``age``): it remembers
    the deleted ids inside the range, to count them out of ``retained``."""

    # The deleted ids of the range: sorted, distinct, each >= threshold after admit (a
    # class default: a policy pickled before deletion existed has none).
    _deleted: np.ndarray = _EMPTY_IDS

    def forget(self, ids: np.ndarray) -> None:
        super().forget(ids)
        self._deleted = np.union1d(self._deleted, np.asarray(ids, dtype=np.int64))

    def _deleted_inside(self, threshold: int) -> int:
        """The deleted ids at or above ``threshold``, the rest dropped: the list never
        holds more ids than the range."""
        self._deleted = self._deleted[self._deleted >= threshold]
        return int(self._deleted.shape[0])


class WindowRetention(_RangeRetention):
    """Keep the last ``max_samples`` samples of the stream."""

    name = "window"

    def admit(self, m: int, now: float | None = None) -> Admission:
        W = int(self.max_samples)
        first = self.n_offered
        threshold = max(first + m - W, 0)
        skip = min(max(threshold - first, 0), m)  # rows of the batch already outside
        self.n_offered += m
        self.threshold = max(self.threshold, threshold)
        self.retained = min(self.n_offered, W) - self._deleted_inside(threshold)
        keep = np.arange(skip, m, dtype=np.int64)
        return Admission(keep, first + keep, threshold)


class AgeRetention(_RangeRetention):
    """Keep the samples accepted less than ``max_age_seconds`` ago (and at most
    ``max_samples``, if given). ``clock`` gives ``now`` when a call does not; a time
    earlier than the last one counts as the last one (a clock stepping back neither
    brings samples back nor reorders them)."""

    name = "age"

    def __init__(
        self,
        max_age_seconds: float,
        max_samples: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(max_samples)
        self.max_age_seconds = float(max_age_seconds)
        self.clock = clock
        self._batches: collections.deque[tuple[int, float]] = collections.deque()
        self._now = -math.inf

    def admit(self, m: int, now: float | None = None) -> Admission:
        now = float(self.clock() if now is None else now)
        self._now = max(self._now, now)
        first = self.n_offered
        while self._batches and self._batches[0][1] + self.max_age_seconds <= self._now:
            self._batches.popleft()
        threshold = self._batches[0][0] if self._batches else first
        if m and not (self._batches and self._batches[-1][1] == self._now):
            self._batches.append((first, self._now))  # (a batch of the same time joins it)
        if self.max_samples is not None:
            threshold = max(threshold, first + m - self.max_samples)
        skip = min(max(threshold - first, 0), m)
        self.n_offered += m
        self.threshold = max(self.threshold, threshold)
        self.retained = self.n_offered - max(threshold, 0) - self._deleted_inside(threshold)
        keep = np.arange(skip, m, dtype=np.int64)
        return Admission(keep, first + keep, max(threshold, 0))


class ReservoirRetention(RetentionPolicy):
    """A uniform random sample of ``max_samples`` of the stream (Vitter's algorithm R).

    The ``t``-th sample (from 0) enters slot ``t`` while ``t < max_samples``; after that
    it draws ``j`` uniform in ``[0, t]`` and, if ``j < max_samples``, replaces the sample
    in slot ``j``. In a batch the draws are made at once and, of several new samples
    drawing one slot, the last wins (the others enter and leave within the batch, so
    they are never stored): the same outcome as one sample at a time.
    """

    name = "reservoir"

    def __init__(self, max_samples: int, seed: int | None = None) -> None:
        super().__init__(max_samples)
        self._rng = np.random.default_rng(seed)
        self.slots = np.full(int(max_samples), -1, dtype=np.int64)  # stream id per slot

    def admit(self, m: int, now: float | None = None) -> Admission:
        M = int(self.max_samples)
        first = self.n_offered
        t = np.arange(first, first + m, dtype=np.int64)
        slot = t.copy()
        late = t >= M
        if late.any():
            slot[late] = self._rng.integers(0, t[late] + 1)
        hit = np.flatnonzero(slot < M)
        # The last new sample drawing each slot wins it.
        taken, last = np.unique(slot[hit][::-1], return_index=True)
        keep = np.sort(hit[hit.shape[0] - 1 - last])
        old = self.slots[taken]
        old = old[old >= 0]  # an empty slot (never filled, or its sample deleted)
        self.slots[slot[keep]] = t[keep]
        self.n_offered += m
        self.retained += keep.shape[0] - old.shape[0]
        return Admission(keep, t[keep], 0, old)

    def forget(self, ids: np.ndarray) -> None:
        """Empty the slots of the deleted samples: the next sample that draws one fills
        it and retires nothing."""
        super().forget(ids)
        self.slots[np.isin(self.slots, ids)] = -1

    def state_dict(self) -> dict[str, Any]:
        """What, with :attr:`slots`, continues the reservoir exactly (JSON-able): the
        count of samples offered and the generator's state."""
        return {"n_offered": int(self.n_offered), "rng": self._rng.bit_generator.state}

    def load_state(self, state: dict[str, Any], slots: np.ndarray) -> None:
        """Continue from :meth:`state_dict` and the stream ids in the filled slots
        (``(min(n_offered, max_samples),)`` int64, slot order)."""
        M = int(self.max_samples)
        n = int(state["n_offered"])
        filled = min(n, M)
        if slots.shape != (filled,):
            raise ValueError(f"{slots.shape[0]} slots for {n} samples offered to {M} slots")
        self.slots[:] = -1
        self.slots[:filled] = slots
        self.n_offered = n
        self.retained = int((slots >= 0).sum())  # a deleted sample's slot is empty
        self._rng.bit_generator.state = state["rng"]


def check_retention(
    retention: object, max_samples: object, max_age_seconds: object, n_clusters: int
) -> None:
    """Raise ``ValueError`` unless the settings make a policy that can hold ``k`` samples."""
    if not isinstance(retention, str) or retention not in RETENTIONS:
        raise ValueError(f"retention must be one of {RETENTIONS}, got {retention!r}")
    if max_samples is not None:
        if not isinstance(max_samples, numbers.Integral) or isinstance(max_samples, bool):
            raise ValueError(f"max_samples must be an int or None, got {max_samples!r}")
        if max_samples < n_clusters:
            raise ValueError(
                f"max_samples={max_samples} is smaller than n_clusters={n_clusters}: "
                f"retention {retention!r} could never hold one sample per centroid"
            )
    elif retention in ("window", "reservoir"):
        raise ValueError(f"retention {retention!r} needs max_samples (an int >= n_clusters)")
    if retention == "age":
        ok = isinstance(max_age_seconds, numbers.Real) and not isinstance(max_age_seconds, bool)
        if not ok or not math.isfinite(max_age_seconds) or max_age_seconds <= 0:
            raise ValueError(
                f"retention 'age' needs max_age_seconds, a finite number > 0, got "
                f"{max_age_seconds!r}"
            )
    elif max_age_seconds is not None:
        raise ValueError(f"max_age_seconds is only used by retention 'age', not {retention!r}")


def make_retention(
    retention: str,
    *,
    n_clusters: int,
    max_samples: int | None = None,
    max_age_seconds: float | None = None,
    seed: int | None = None,
    clock: Callable[[], float] = time.time,
) -> RetentionPolicy:
    """The policy named ``retention`` (checked by :func:`check_retention`)."""
    check_retention(retention, max_samples, max_age_seconds, n_clusters)
    if retention == "window":
        return WindowRetention(max_samples)
    if retention == "age":
        return AgeRetention(float(max_age_seconds), max_samples, clock)  # type: ignore[arg-type]
    if retention == "reservoir":
        return ReservoirRetention(int(max_samples), seed)  # type: ignore[arg-type]
    return AllRetention(max_samples)


def check_catch_up(catch_up: object) -> None:
    """Raise ``ValueError`` unless ``catch_up`` is ``"auto"`` or an int >= 0."""
    ok = isinstance(catch_up, numbers.Integral) and not isinstance(catch_up, bool)
    if not (catch_up == "auto" or (ok and catch_up >= 0)):
        raise ValueError(f'catch_up must be "auto" or an int >= 0, got {catch_up!r}')


def catch_up_steps(catch_up: int | str, retention: str) -> int:
    """Further iterations ``partial_fit`` may run after a chunk's own: ``catch_up``, or for
    ``"auto"`` :data:`CATCH_UP_STEPS` under ``window`` and ``age`` (a model of a stream
    that forgets) and 0 under ``all`` and ``reservoir`` (one iteration per chunk).

    Each further iteration runs only while the one before calls for it
    (:func:`wants_catch_up`: it moved more than :data:`CATCH_UP_CHANGED` of its batch, or
    relocated an empty cluster): a model the stream has left behind (the
    distribution changed) takes a few iterations per chunk until it is near the k-means
    of what it retains again, then one per chunk. Measured on MNIST in drifting order
    (docs/bench/drift).
    """
    if catch_up == "auto":
        return CATCH_UP_STEPS if retention in ("window", "age") else 0
    return int(catch_up)


def wants_catch_up(n_changed: int, batch_size: int, n_relocated: int = 0) -> bool:
    """Whether an iteration that reassigned ``n_changed`` of ``batch_size`` samples and
    relocated ``n_relocated`` empty clusters calls for another: it moved more than
    :data:`CATCH_UP_CHANGED` of the batch, or it put a centroid on a lone sample (the
    next iteration gives that cluster its share)."""
    return n_changed > CATCH_UP_CHANGED * batch_size or n_relocated > 0
