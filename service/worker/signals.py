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

The drift figure: the energies of the newest ``NMBATCH_DRIFT_WINDOW`` rows read from
the log, each measured by the engine when it arrives under the centroids served then
(the pinned version if any, else the newest; :func:`~nmbatch.engine.assign.
row_energies`: its dissimilarity to the nearest centroid), kept here in a ring (8 bytes
a row), their mean over the served model's energy per retained sample
(:func:`~nmbatch.engine.assign.drift_ratio`). Measuring each row on arrival, before the
model trains on it, is what makes a shift show: the model soon moves to the new rows.
It costs one nearest-centroid search per row read (``k d`` multiply-adds), as the
engine's own first assignment of it (``NMBATCH_DRIFT_WINDOW=0`` spares it). Shown in
``/stats`` and ``/metrics``.
"""

from __future__ import annotations

import logging

import numpy as np

from nmbatch.engine.assign import drift_ratio, row_energies
from nmbatch.engine.state import ModelState
from nmbatch.service.config import Settings
from nmbatch.service.identities import RELOCATED, SWAPPED
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.state import ModelBoard, PublishedModel
from nmbatch.service.storage.events import EventWriter

__all__ = ["Signals"]

log = logging.getLogger(__name__)


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
        self._ring = np.empty(settings.drift_window, dtype=np.float64)  # rows' energies
        self._filled = 0  # rows in the ring (at most its length)
        self._next = 0  # where the next row goes
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
                "n_relocated": int((lineage.origin == RELOCATED).sum()),
                "n_swapped": int((lineage.origin == SWAPPED).sum()),
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
        """Rows read from the log (``(n, d)`` float32): the newest are measured under the
        served centroids and enter the ring; the figure and its alarm follow."""
        window = self._ring.shape[0]
        served = self.board.served
        if not window or X.shape[0] == 0 or served is None or X.shape[1] != served.state.dim:
            return
        energies = row_energies(X[-window:], served.state.centroids, self.settings.metric)
        n = energies.shape[0]
        first = min(n, window - self._next)
        self._ring[self._next : self._next + first] = energies[:first]
        self._ring[: n - first] = energies[first:]
        self._next = (self._next + n) % window
        self._filled = min(window, self._filled + n)
        self.drift = drift_ratio(self._ring[: self._filled], served.state.energy)
        self.metrics.drift.set(self.drift if self.drift is not None else float("nan"))
        self._alarm(served.version)

    def _alarm(self, version: int) -> None:
        """A ``drift`` event when the figure reaches the alarm (again once below it)."""
        alarm = self.settings.drift_alarm
        if not alarm or self.drift is None:
            return
        if self.drift >= alarm and not self._alarmed:
            self.writer.emit("drift", {
                "drift": self.drift, "alarm": alarm, "version": version, "rows": self._filled,
            })  # fmt: skip
            log.warning("model '%s': drift %.3g reached the alarm %.3g",
                        self.settings.model, self.drift, alarm)  # fmt: skip
        self._alarmed = self.drift >= alarm
