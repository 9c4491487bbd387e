"""The measurement protocol of the paper's Results section, independent of any algorithm.

For one seed ``s``: shuffle the training set with ``default_rng(s)``, take its first ``k``
rows as the initial centroids (the same for every algorithm), run each algorithm and
record its validation energy ``E_V`` (mean squared distance of the validation samples to
their nearest centroid, :func:`engine.energy`) against the algorithm's own wall-clock time.

An algorithm is a *runner*: a function ``(Problem, Budget) -> Iterator[Snapshot]``. A
runner times its own work with ``time.perf_counter`` and yields a :class:`Snapshot`
(cumulative seconds, centroids, iteration) after each iteration; the generator is
suspended while the consumer (:func:`record`) computes ``E_V``, so that time is never
counted. The generator's return value is a dict of notes with at least ``"stop"``.

Summaries: ``E*_s`` is the lowest ``E_V`` reached from seed ``s``'s start by any run;
``time_to(eps)`` is the first time ``E_V <= (1 + eps) E*_s``; per algorithm the median
over seeds is taken with "never" counted as ``+inf`` (reported as ``None`` when the
median is infinite).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "EPSILONS",
    "EPS_KEYS",
    "Budget",
    "Curve",
    "Problem",
    "Runner",
    "Snapshot",
    "best_energy",
    "median_or_none",
    "record",
    "shuffled_problem",
    "stepwise",
    "summarize",
    "time_to",
    "value_at",
]

EPSILONS = (0.05, 0.02, 0.01, 0.005)
EPS_KEYS = ("0.05", "0.02", "0.01", "0.005")


@dataclass(frozen=True)
class Problem:
    """One seed's starting point, shared by every algorithm.

    Attributes
    ----------
    train : (n, d) float32, the training set in this seed's shuffled order
    init : (k, d) float32, ``train[:k]``: the initial centroids
    seed : int
    rho : float, nmbatch's doubling threshold
    batch_size : int, initial batch of nmbatch, batch of mbatch
    """

    train: np.ndarray
    init: np.ndarray
    seed: int
    rho: float = 100.0
    batch_size: int = 5000

    @property
    def k(self) -> int:
        return int(self.init.shape[0])


@dataclass(frozen=True)
class Budget:
    """When a run stops if it has not converged: after ``seconds`` of its own time or
    ``max_iter`` iterations, whichever comes first."""

    seconds: float
    max_iter: int


@dataclass
class Snapshot:
    """State after one iteration: ``seconds`` of the algorithm's own cumulative time.

    ``evaluate`` asks :func:`record` to measure ``E_V`` here whatever its time grid says
    (for runners whose every point is a separate, costly run).
    """

    seconds: float
    centroids: np.ndarray
    iteration: int
    converged: bool = False
    evaluate: bool = False


Runner = Callable[[Problem, Budget], Iterator[Snapshot]]


@dataclass
class Curve:
    """``E_V`` against time of one run (one algorithm, one seed)."""

    name: str
    seed: int
    seconds: list[float] = field(default_factory=list)
    energy: list[float] = field(default_factory=list)
    iteration: list[int] = field(default_factory=list)
    n_steps: int = 0
    converged: bool = False
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def final_energy(self) -> float:
        return self.energy[-1] if self.energy else math.inf

    @property
    def total_seconds(self) -> float:
        return self.seconds[-1] if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "seed": self.seed, "seconds": self.seconds,
            "energy": self.energy, "iteration": self.iteration, "n_steps": self.n_steps,
            "converged": self.converged, "notes": self.notes,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Curve:
        return cls(**obj)


def shuffled_problem(
    train: np.ndarray, seed: int, k: int, *, rho: float = 100.0, batch_size: int = 5000
) -> Problem:
    """Shuffle ``train`` ((n, d) float32) with ``default_rng(seed)``; init = first ``k`` rows."""
    if train.shape[0] < k:
        raise ValueError(f"{train.shape[0]} training samples, fewer than k = {k}")
    perm = np.random.default_rng(seed).permutation(train.shape[0])
    X = np.ascontiguousarray(train[perm], dtype=np.float32)
    return Problem(X, X[:k].copy(), int(seed), float(rho), int(batch_size))


def stepwise(
    step: Callable[[], bool], centroids: Callable[[], np.ndarray], budget: Budget
) -> Iterator[Snapshot]:
    """Time ``step()`` calls (each returns "converged") and yield a snapshot after each.

    Returns ``{"stop": "converged" | "budget" | "max_iter"}``.
    """
    elapsed = 0.0
    it = 0
    while True:
        t0 = time.perf_counter()
        converged = bool(step())
        elapsed += time.perf_counter() - t0
        it += 1
        yield Snapshot(elapsed, centroids(), it, converged)
        if converged:
            return {"stop": "converged"}
        if elapsed >= budget.seconds:
            return {"stop": "budget"}
        if it >= budget.max_iter:
            return {"stop": "max_iter"}


def record(
    name: str,
    trace: Iterator[Snapshot],
    test: np.ndarray,
    seed: int,
    *,
    eval_grid: float = 0.01,
    first_steps: int = 20,
) -> Curve:
    """Consume a runner's snapshots and measure ``E_V`` on ``test`` outside its clock.

    ``E_V`` is computed after each of the first ``first_steps`` iterations, after the last
    one, and otherwise whenever the algorithm's time has grown by a fraction ``eval_grid``
    since the last evaluation (``eval_grid = 0``: after every iteration). A skipped
    snapshot's centroids are never read later (runners may update them in place).
    """
    from nmbatch.engine import energy

    curve = Curve(name, int(seed))
    pending: Snapshot | None = None
    last_t = -math.inf
    while True:
        try:
            snap = next(trace)
        except StopIteration as stop:
            notes = dict(stop.value or {})
            break
        curve.n_steps += 1
        curve.converged = curve.converged or snap.converged
        due = (
            snap.iteration <= first_steps
            or snap.converged
            or snap.evaluate
            or snap.seconds - last_t >= eval_grid * snap.seconds
        )
        if due:
            curve.seconds.append(float(snap.seconds))
            curve.energy.append(energy(test, snap.centroids))
            curve.iteration.append(int(snap.iteration))
            last_t = snap.seconds
            pending = None
        else:
            pending = snap
    if pending is not None:  # the last snapshot: nothing ran after it, centroids valid
        curve.seconds.append(float(pending.seconds))
        curve.energy.append(energy(test, pending.centroids))
        curve.iteration.append(int(pending.iteration))
    curve.notes = notes
    return curve


def best_energy(curves: list[Curve], extra: tuple[float, ...] = ()) -> float:
    """Lowest ``E_V`` of any evaluation of any curve (and of ``extra`` values)."""
    values = [min(c.energy) for c in curves if c.energy] + [float(e) for e in extra]
    return min(values)


def time_to(curve: Curve, target: float) -> float:
    """First time (s) with ``E_V <= target``; ``inf`` if never reached."""
    for t, e in zip(curve.seconds, curve.energy, strict=True):
        if e <= target:
            return t
    return math.inf


def value_at(curve: Curve, t: float) -> float:
    """``E_V`` of the last evaluation at or before time ``t`` (``inf`` before the first)."""
    idx = int(np.searchsorted(np.asarray(curve.seconds), t, side="right")) - 1
    return curve.energy[idx] if idx >= 0 else math.inf


def median_or_none(values: list[float]) -> float | None:
    """Median with ``inf`` for "never"; ``None`` if the median itself is infinite."""
    if not values:
        return None
    m = float(np.median(np.asarray(values, dtype=np.float64)))
    return None if math.isinf(m) or math.isnan(m) else m


def summarize(
    curves: dict[int, dict[str, Curve]], estar: dict[int, float], names: list[str]
) -> dict[str, dict[str, Any]]:
    """Per algorithm: median over seeds of ``time_to`` each ``(1+eps) E*_s`` and of the
    final ``E_V / E*_s - 1`` (the JSON block of results.json)."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        seeds = [s for s in curves if name in curves[s]]
        if not seeds:
            continue
        times = {
            key: median_or_none([time_to(curves[s][name], (1 + eps) * estar[s]) for s in seeds])
            for key, eps in zip(EPS_KEYS, EPSILONS, strict=True)
        }
        finals = [curves[s][name].final_energy / estar[s] - 1.0 for s in seeds]
        out[name] = {"time_to": times, "final_rel": float(np.median(finals))}
    return out
