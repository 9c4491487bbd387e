"""What the worker shows: numbered models on the board, ``/stats``, and the metrics.

:class:`Publisher` numbers the worker's models (a version is shown only once it is
reserved in Redis, :class:`~nmbatch.service.worker.lease.LeaseKeeper`), puts them and the
algorithm's statistics on the :class:`ModelBoard` the routes read, and keeps the
iteration metrics and the doubling events of ``/stats``. Each model it numbers carries
its :class:`~nmbatch.service.identities.Lineage`: the engine's relocations and swaps
composed since the last snapshot (:meth:`Publisher.snapshotted` starts it again).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque

import numpy as np

from nmbatch.engine.state import IterationStats, ModelState
from nmbatch.service.identities import Lineage
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.state import DoublingEvent, ModelBoard, PublishedModel, PublishedStats
from nmbatch.service.storage import LeaseLostError
from nmbatch.service.worker.backoff import RedisAwayError, RedisBackoff
from nmbatch.service.worker.lease import VERSION_BLOCK, LeaseKeeper
from nmbatch.service.worker.roles import Phase

__all__ = ["Publisher"]

log = logging.getLogger(__name__)

_MAX_DOUBLINGS = 1000  # doubling events kept for /stats


class Publisher:
    """Numbers and shows the worker's models and statistics.

    Attributes
    ----------
    version : int
        The last version shown (or the base the next one is numbered above).
    """

    def __init__(
        self,
        board: ModelBoard,
        metrics: ServiceMetrics,
        lease: LeaseKeeper,
        backoff: RedisBackoff,
    ) -> None:
        self.board = board
        self.metrics = metrics
        self.lease = lease
        self.backoff = backoff
        self.version = 0
        self.lineage: Lineage | None = None  # since the last snapshot (None: none yet)
        self._doublings: deque[DoublingEvent] = deque(maxlen=_MAX_DOUBLINGS)
        self._distances = 0
        self._skipped = 0
        self._last_seconds: float | None = None

    # -- models ---------------------------------------------------------------------------
    def base_version(self, reserved: int, snapshot: PublishedModel | None) -> int:
        """The highest version anybody may have shown: ``reserved`` (``versions_reserved``
        in Redis), the snapshot's, the one served here, and the last one numbered here."""
        current = self.board.model
        return max(
            reserved,
            snapshot.version if snapshot is not None else 0,
            current.version if current is not None else 0,
            self.version,
        )

    def resume(self, base: int, snapshot: PublishedModel | None) -> None:
        """Number the next versions above ``base`` and show ``snapshot`` (if any) first.

        Versions up to ``base`` may have been shown with newer centroids by a worker that
        died before its next snapshot: an older snapshot is renumbered above them.
        """
        self.version = base
        self.lineage = None
        if snapshot is None:
            return
        self.lineage = Lineage.start(snapshot.version, snapshot.state.k)
        if base > snapshot.version:
            self.version = base + 1
            again = Lineage.start(snapshot.version, snapshot.state.k)  # the same clusters
            self.board.publish(dataclasses.replace(snapshot, version=self.version, lineage=again))
            log.info("snapshot version %d republished as version %d (versions up to %d "
                     "were reserved by the previous worker)",
                     snapshot.version, self.version, base)  # fmt: skip
        else:
            self.board.publish(snapshot)
        self.metrics.centroid_version.set(self.version)

    def show(self, model: PublishedModel) -> bool:
        """Serve ``model`` (a snapshot) if it is newer than the served one; True if so."""
        if not self.board.publish(model):
            return False
        self.metrics.centroid_version.set(model.version)
        return True

    def publish(self, state: ModelState) -> bool:
        """Show ``state`` (the engine's, after a step or a restore) as the next version.

        A version is shown only once it is reserved in Redis. The next block is reserved
        when half of the current one is used, so an outage leaves at least half a block
        to go on with; when Redis is away and the reserved versions are used up,
        publication waits (the iterations go on). Returns False if the lease turned out
        to be another process's (nothing shown; the statistics are left as they are),
        else True: the caller shows the statistics.
        """
        if self.lease.reserved - self.version <= VERSION_BLOCK // 2:
            try:
                self.backoff.call(self.lease.reserve, self.version + VERSION_BLOCK)
            except RedisAwayError:
                if self.version + 1 > self.lease.reserved:
                    return True
            except LeaseLostError:
                self.lease.check()
                return False
        self.version += 1
        lineage = self.lineage
        if lineage is None or lineage.k != state.k:  # the first model, or a new k
            lineage = Lineage.start(None, state.k)
        self.lineage = lineage = lineage.after(state.stats)
        model = PublishedModel.build(version=self.version, state=state, lineage=lineage)
        self.board.publish(model)
        m = self.metrics
        m.centroid_version.set(model.version)
        m.batch_size.set(state.batch_size)
        m.converged.set(int(state.converged))
        return True

    def snapshotted(self, model: PublishedModel) -> None:
        """``model`` (the newest shown) was written as the snapshot: the next models'
        lineages start from it."""
        self.lineage = Lineage.start(model.version, model.state.k)

    # -- statistics -----------------------------------------------------------------------
    def count(self, stats: IterationStats) -> None:
        """Account for one iteration: metrics, bound savings, a doubling event."""
        m = self.metrics
        m.iterations.inc()
        m.iteration_seconds.observe(stats.seconds)
        m.distances_computed.inc(stats.n_distances)
        m.distances_skipped.inc(stats.n_skipped)
        self._distances += stats.n_distances
        self._skipped += stats.n_skipped
        total = self._distances + self._skipped
        if total:
            m.skipped_share.set(self._skipped / total)
        self._last_seconds = stats.seconds
        if stats.doubled and stats.next_batch_size > stats.batch_size:
            self._doublings.append(
                DoublingEvent(stats.iteration, stats.batch_size, stats.next_batch_size, time.time())
            )

    def show_stats(
        self, phase: Phase, state: ModelState | None = None, n_samples: int = 0,
        drift: float | None = None,
    ) -> None:  # fmt: skip
        """Put the statistics of ``/stats`` on the board.

        ``state``: the engine's, with ``n_samples`` the samples in its store. None (a
        standby, or no engine yet): the counters of the served model, without energy
        and with no engine memory. ``drift``: the worker's last drift figure
        (:mod:`~nmbatch.service.worker.signals`).
        """
        energy = None
        engine_bytes = n_retired = 0
        if state is None:
            model = self.board.model
            if model is not None:
                state, n_samples = model.state, model.state.n_samples
        else:
            engine_bytes, n_retired = int(state.engine_bytes), int(state.n_retired)
            if state.energy is not None and np.isfinite(state.energy):
                energy = state.energy
        n_ingested = max(state.n_ingested, n_samples) if state is not None else 0
        self.metrics.engine_bytes.set(engine_bytes)
        self.metrics.samples_retired.set(n_retired)
        self.metrics.samples_accepted_ever.set(n_ingested)
        self.board.publish_stats(
            PublishedStats(
                phase=phase,
                iteration=state.iteration if state is not None else 0,
                batch_size=state.batch_size if state is not None else 0,
                n_samples=n_samples,
                converged=bool(state.converged) if state is not None else False,
                energy=energy,
                distances_computed=self._distances,
                distances_skipped=self._skipped,
                doublings=tuple(self._doublings),
                last_iteration_seconds=self._last_seconds,
                engine_bytes=engine_bytes,
                n_retired=n_retired,
                n_ingested=n_ingested,
                drift=drift,
            )
        )
