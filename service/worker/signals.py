"""What the worker tells the world besides the model: its events and the drift figure.

:class:`Signals` turns what the worker sees into events
(:class:`~nmbatch.service.storage.events.EventWriter`: queued here, written by
:meth:`Signals.flush` once per round of the loop) and measures the drift:

- ``version``: a snapshot was written (a new kept version), with its counters and how
  many clusters were relocated or swapped since the version before (its lineage);
- ``doubling``: a step doubled the nested batch;
- ``relocation``: a step relocated empty clusters or swapped clusters (the indices, in
  this version's numbering, and the swaps ``[merged, into, split]``);
- ``retention``: samples left the model since the last published version (the
  retention policy retired them; ``n_retired`` counts them since the engine started);
- ``drift``: the drift figure reached ``NMBATCH_DRIFT_ALARM`` (sent again only after it
  fell below).

The drift figure: the newest ``NMBATCH_DRIFT_WINDOW`` rows read from the log (kept here
in a ring, ``4 d`` bytes each) under the centroids the model serves (the pinned version
if any, else the newest), as the engine measures it
(:func:`~nmbatch.engine.assign.drift_ratio`: their mean dissimilarity to the nearest
centroid over the served model's energy per retained sample). Measured at most once per
:data:`DRIFT_SECONDS`, when rows came or the served version changed since; shown in
``/stats`` and ``/metrics``.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from nmbatch.engine.assign import drift_ratio
from nmbatch.engine.state import ModelState
from nmbatch.service.config import Settings
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.state import ModelBoard, PublishedModel
from nmbatch.service.storage.events import EventWriter

__all__ = ["DRIFT_SECONDS", "Signals"]

log = logging.getLogger(__name__)

DRIFT_SECONDS = 1.0
"""Least seconds between two measures of the drift figure."""


class Signals:
    """One model's events and drift figure, on the worker thread."""

    def __init__(
        self, settings: Settings, writer: EventWriter, board: ModelBoard, metrics: ServiceMetrics
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.board = board
        self.metrics = metrics
        self.drift: float | None = None  # the last figure measured
        self._alarmed = False
        self._ring: np.ndarray | None = None  # (window, d) float32, the newest rows
        self._filled = 0  # rows in the ring (at most its length)
        self._next = 0  # where the next row goes
        self._fresh = False  # rows came since the last measure
        self._measured_at = -np.inf
        self._measured_version = -1  # the served version it was measured under
        self._retired = 0  # n_retired of the last state seen

    # -- events ---------------------------------------------------------------------------
    def stepped(self, model: PublishedModel) -> None:
        """A step's state was published as ``model``: its doubling, relocations and swaps,
        and the samples retired since the last one."""
        state, stats = model.state, model.state.stats
        if stats is not None and stats.doubled and stats.next_batch_size > stats.batch_size:
            self.writer.emit("doubling", {
                "version": model.version, "iteration": stats.iteration,
                "from_size": stats.batch_size, "to_size": stats.next_batch_size,
            })  # fmt: skip
        if stats is not None and (stats.relocated or stats.swaps):
            self.writer.emit("relocation", {
                "version": model.version, "iteration": stats.iteration,
                "n_relocated": len(stats.relocated), "n_swaps": len(stats.swaps),
                "relocated": list(stats.relocated), "swaps": [list(s) for s in stats.swaps],
            })  # fmt: skip
        self.retired(state, model.version)

    def retired(self, state: ModelState, version: int) -> None:
        """Samples retired since the last state seen (a ``retention`` event if any)."""
        if state.n_retired < self._retired:  # a new engine counts from 0
            self._retired = 0
        if state.n_retired > self._retired:
            self.writer.emit("retention", {
                "version": version, "retired": state.n_retired - self._retired,
                "n_retired": state.n_retired, "n_samples": state.n_samples,
            })  # fmt: skip
        self._retired = state.n_retired

    def kept(self, model: PublishedModel) -> None:
        """``model`` was written as the snapshot: a new kept version."""
        state, lineage = model.state, model.lineage
        data = {
            "version": model.version, "energy": state.energy, "n_samples": state.n_samples,
            "batch_size": state.batch_size, "iteration": state.iteration, "k": state.k,
            "converged": bool(state.converged),
        }  # fmt: skip
        if lineage is not None:
            data |= {
                "since": lineage.since,
                "n_relocated": int((lineage.origin == 1).sum()),
                "n_swapped": int((lineage.origin == 2).sum()),
            }
        self.writer.emit("version", data)

    def flush(self) -> None:
        """Write the queued events; Redis away: they wait for the next flush (bounded)."""
        try:
            self.writer.flush()
        except Exception as exc:
            log.debug("events not written yet: %s", exc)

    # -- drift ----------------------------------------------------------------------------
    def rows(self, X: np.ndarray) -> None:
        """Rows read from the log (``(n, d)`` float32): the newest enter the ring."""
        window = self.settings.drift_window
        if not window or X.shape[0] == 0:
            return
        if self._ring is None or self._ring.shape[1] != X.shape[1]:
            self._ring = np.empty((window, X.shape[1]), dtype=np.float32)
            self._filled = self._next = 0
        X = X[-window:]
        n = X.shape[0]
        first = min(n, window - self._next)
        self._ring[self._next : self._next + first] = X[:first]
        self._ring[: n - first] = X[first:]
        self._next = (self._next + n) % window
        self._filled = min(window, self._filled + n)
        self._fresh = True

    def measure(self, now: float | None = None) -> float | None:
        """The drift figure, measured again if rows came or the served version changed,
        and :data:`DRIFT_SECONDS` passed; a ``drift`` event when it reaches the alarm."""
        now = time.monotonic() if now is None else now
        served = self.board.served
        if served is None or self._ring is None or now - self._measured_at < DRIFT_SECONDS:
            return self.drift
        if not self._fresh and served.version == self._measured_version:
            return self.drift
        if self._ring.shape[1] != served.state.dim:
            return self.drift
        self._fresh, self._measured_at = False, now
        self._measured_version = served.version
        rows = self._ring[: self._filled]
        self.drift = drift_ratio(rows, served.state.centroids, served.state.energy,
                                 self.settings.metric)  # fmt: skip
        self.metrics.drift.set(self.drift if self.drift is not None else float("nan"))
        alarm = self.settings.drift_alarm
        if alarm and self.drift is not None:
            if self.drift >= alarm and not self._alarmed:
                self.writer.emit("drift", {
                    "drift": self.drift, "alarm": alarm, "version": served.version,
                    "rows": int(rows.shape[0]),
                })  # fmt: skip
                log.warning("model '%s': drift %.3g reached the alarm %.3g",
                            self.settings.model, self.drift, alarm)  # fmt: skip
            self._alarmed = self.drift >= alarm
        return self.drift
