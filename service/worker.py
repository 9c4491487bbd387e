"""The worker thread: sample log -> store -> nmbatch iterations -> published model.

One thread per app, started and stopped by the app's lifespan. Its life:

1. wait until the model's dimension is known (setting, Redis meta, or the first batch);
2. build the engine's ``NestedBatchStore`` and ``make_algorithm("nmbatch", ...)``, replay
   the whole sample log into the store and, if a snapshot was restored, call
   ``algo.restore(centroids, b, iteration)`` (one exact assignment pass over the first
   ``b`` samples);
3. loop: read new log entries (when the ingest route signals, and every
   ``poll_seconds`` for entries written by another process), ``step()`` while there is
   work, publish each new model, write a snapshot every ``snapshot_seconds``; sleep
   while converged with no new samples;
4. on stop, write a last snapshot.

BLAS and numba run on ``worker_threads`` threads (threadpoolctl, ``numba.set_num_threads``)
so the HTTP side keeps a core. Redis errors are logged and retried; any other error
ends the thread and ``/readyz`` reports it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import numba
import numpy as np
import redis
from threadpoolctl import threadpool_limits

from engine import NestedBatchStore, make_algorithm
from engine.algorithms import KMeansAlgorithm
from service.config import Settings
from service.metrics import ServiceMetrics
from service.redis_log import ModelRepository, Snapshot
from service.state import DoublingEvent, ModelBoard, PublishedModel, PublishedStats

__all__ = ["Worker"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_DOUBLINGS = 1000  # doubling events kept for /stats


class Worker:
    """Runs nmbatch on the model's sample log in a background thread.

    Parameters
    ----------
    settings : Settings
    repository : ModelRepository
        Synchronous Redis access, used only by this thread once started.
    board : ModelBoard
        Where models and statistics are published.
    metrics : ServiceMetrics
    snapshot : Snapshot or None
        The snapshot restored at start-up (already published by the caller).
    dim : int or None
        The model's dimension if already known.
    """

    def __init__(
        self,
        settings: Settings,
        repository: ModelRepository,
        board: ModelBoard,
        metrics: ServiceMetrics,
        *,
        snapshot: Snapshot | None = None,
        dim: int | None = None,
    ) -> None:
        self.settings = settings
        self.repository = repository
        self.board = board
        self.metrics = metrics
        self.snapshot = snapshot
        self.dim = dim
        self.wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"nmbatch-worker-{settings.model}", daemon=True
        )
        self.error: BaseException | None = None
        self.phase = "starting"
        self.store: NestedBatchStore | None = None
        self.algo: KMeansAlgorithm | None = None
        self.last_id = "0-0"
        self.version = snapshot.version if snapshot is not None else 0
        self._snapshot_version = self.version
        self._last_snapshot = time.monotonic()
        self._doublings: deque[DoublingEvent] = deque(maxlen=_MAX_DOUBLINGS)
        self._distances = 0
        self._skipped = 0
        self._last_seconds: float | None = None

    # -- control (any thread) -------------------------------------------------------------
    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def notify(self) -> None:
        """Tell the worker that samples were appended to the log."""
        self.wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the thread to finish its step, write a last snapshot and end; wait for it."""
        self._stopping.set()
        self.wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("worker did not stop within %.0f s", timeout)

    def alive(self) -> bool:
        """True while the thread runs without a fatal error."""
        return self._thread.is_alive() and self.error is None

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        threads = self.settings.worker_threads
        try:
            with threadpool_limits(limits=threads):
                numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
                if self._prepare():
                    self._loop()
        except BaseException as exc:
            self.error = exc
            self.phase = "failed"
            log.exception("worker failed: %s", exc)
        finally:
            try:
                self._write_snapshot()
            except Exception:
                log.exception("could not write the final snapshot")
            if self.error is None:
                self.phase = "stopped"
            self._publish_stats()

    def _prepare(self) -> bool:
        """Wait for the dimension, build the engine, replay the log, restore. False: stopped."""
        self.phase = "waiting-for-dimension"
        self._publish_stats()
        while self.dim is None:
            if self._stopping.is_set():
                return False
            self.dim = self._redis_call(self.repository.dim)
            if self.dim is None:
                self.wake.wait(self.settings.poll_seconds)
                self.wake.clear()
        s = self.settings
        self.store = NestedBatchStore(self.dim, seed=s.seed)
        self.algo = make_algorithm(
            "nmbatch",
            self.store,
            s.k,
            init=s.init,
            rho=s.rho,
            batch_size=s.batch_size,
            random_state=s.seed,
        )
        self.phase = "replaying"
        self._publish_stats()
        started = time.perf_counter()
        while self._pull_log() and not self._stopping.is_set():
            pass
        if self._stopping.is_set():
            return False
        log.info(
            "replayed %d samples from the log in %.2f s",
            self.store.n_samples,
            time.perf_counter() - started,
        )
        snap = self.snapshot
        if snap is not None and self.store.n_samples > 0:
            self.algo.restore(snap.centroids, snap.batch_size, snap.iteration)
            self._publish(converged=False)
        return True

    def _loop(self) -> None:
        assert self.algo is not None and self.store is not None
        algo, store = self.algo, self.store
        poll = self.settings.poll_seconds
        last_pull = time.monotonic()
        idle_logged = False
        while not self._stopping.is_set():
            if self.wake.is_set() or time.monotonic() - last_pull >= poll:
                self.wake.clear()
                while self._pull_log():  # everything available, page by page
                    pass
                last_pull = time.monotonic()
            idle = algo.converged and store.n_samples == algo.batch_size
            if algo.ready() and not idle:
                self.phase = "iterating"
                idle_logged = False
                self._step()
            else:
                if not idle_logged:
                    self.phase = "converged" if algo.converged else "waiting-for-samples"
                    self._publish_stats()
                    idle_logged = True
                self.wake.wait(max(0.0, poll - (time.monotonic() - last_pull)))
            if time.monotonic() - self._last_snapshot >= self.settings.snapshot_seconds:
                self._write_snapshot()

    def _step(self) -> None:
        assert self.algo is not None
        stats = self.algo.step()
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
        self._publish(converged=stats.converged)

    def _publish(self, *, converged: bool) -> None:
        """Publish the algorithm's current centroids as the next version."""
        assert self.algo is not None and self.store is not None
        algo = self.algo
        self.version += 1
        model = PublishedModel.build(
            version=self.version,
            centroids=algo.centroids,
            counts=algo.counts,
            n_samples=self.store.n_samples,
            batch_size=algo.batch_size,
            iteration=algo.iteration,
            converged=converged,
        )
        self.board.publish(model)
        m = self.metrics
        m.centroid_version.set(model.version)
        m.batch_size.set(model.batch_size)
        m.converged.set(int(model.converged))
        self._publish_stats()

    def _publish_stats(self) -> None:
        algo, store = self.algo, self.store
        energy = None
        if algo is not None and algo.iteration > 0 and algo.batch_size > 0:
            value = algo.energy_estimate()
            energy = value if np.isfinite(value) else None
        self.board.publish_stats(
            PublishedStats(
                phase=self.phase,
                iteration=algo.iteration if algo is not None else 0,
                batch_size=algo.batch_size if algo is not None else 0,
                n_samples=store.n_samples if store is not None else 0,
                converged=bool(algo.converged) if algo is not None else False,
                energy=energy,
                distances_computed=self._distances,
                distances_skipped=self._skipped,
                doublings=tuple(self._doublings),
                last_iteration_seconds=self._last_seconds,
            )
        )

    # -- Redis ----------------------------------------------------------------------------
    def _pull_log(self) -> bool:
        """Read one page of new log entries into the store; True if a full page was read."""
        assert self.store is not None
        page = 32  # entries of <= 1 MiB each: bounded replies, also when replaying
        chunks = self._redis_call(self.repository.read_log, self.last_id, page)
        if not chunks:
            return False
        for chunk in chunks:
            if chunk.X.shape[1] != self.store.dim:
                log.error(
                    "log entry %s has dimension %d, the model %d: skipped",
                    chunk.entry_id,
                    chunk.X.shape[1],
                    self.store.dim,
                )
            else:
                self.store.append(chunk.X)
            self.last_id = chunk.entry_id
        self.metrics.samples_in_store.set(self.store.n_samples)
        return len(chunks) == page

    def _write_snapshot(self) -> None:
        """Store the published model in Redis if it is newer than the last snapshot."""
        self._last_snapshot = time.monotonic()
        model = self.board.model
        if model is None or model.version <= self._snapshot_version:
            return
        snapshot = Snapshot(
            version=model.version,
            centroids=model.centroids,
            counts=model.counts,
            batch_size=model.batch_size,
            iteration=model.iteration,
            last_id=self.last_id,
            n_samples=model.n_samples,
            converged=model.converged,
            updated_at=model.updated_at,
        )
        written = self._redis_call(self.repository.write_snapshot, snapshot)
        if written is None:  # Redis unavailable: try again at the next cadence
            return
        self._snapshot_version = model.version
        if written:
            self.metrics.snapshot_written()
        else:
            log.warning("Redis holds a snapshot newer than version %d: not replaced", model.version)

    def _redis_call(self, fn: Callable[..., T], *args: object) -> T | None:
        """``fn(*args)``, or None (logged) when Redis is unavailable."""
        try:
            return fn(*args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("Redis unavailable in the worker (%s); retrying", exc)
            self.wake.wait(self.settings.poll_seconds)
            return None
