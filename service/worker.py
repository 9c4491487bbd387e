"""The worker thread: sample log -> store -> nmbatch iterations -> published model.

One :class:`Worker` per app, started and stopped by the app's lifespan. Several service
processes may serve one model (same Redis, same ``NMBATCH_MODEL``); one of them is its
**worker**, the others are **standbys**, decided by a lease in Redis
(:class:`service.redis_log.WorkerLease`).

Worker role:

1. reserve centroid versions above anything shown so far and publish the latest snapshot
   (renumbered above them if the last worker died after the snapshot);
2. wait until the model's dimension is known (setting, Redis meta, or the first batch);
3. build the engine's ``NestedBatchStore`` and ``make_algorithm("nmbatch", ...)`` (in a
   child process unless ``NMBATCH_WORKER_PROCESS=false``: :mod:`service.engine_host`), replay
   the whole sample log into the store and, if a snapshot exists, call
   ``algo.restore(centroids, b, iteration)`` (one exact assignment pass over the first
   ``b`` samples);
4. loop: read new log entries (when the ingest route signals, and every
   ``poll_seconds`` for entries written by other processes), ``step()`` while there is
   work, publish each new model, write a snapshot every ``snapshot_seconds``; sleep
   while converged with no new samples;
5. on stop, write a last snapshot and release the lease.

Standby role: every ``poll_seconds`` try to take the lease, else publish the snapshot in
Redis if it is newer than the one served (so ``/centroids`` and ``/assign`` follow the
worker). A standby that takes the lease goes through the worker role from step 1; a
worker that finds the lease taken by another process (it was frozen or cut off longer
than the lease's expiry) drops its store and becomes a standby. Snapshot writes and
version reservations check the lease inside Redis, so a worker that lost it can never
overwrite its successor's work.

The lease is renewed every third of ``worker_lock_seconds`` by a small companion thread
(a long iteration on a big store must not let it expire); it renews only while the
worker thread is alive.

Redis outages: the worker keeps iterating on the samples it holds and keeps publishing
(within the versions it reserved), skips log reads and snapshots while Redis is away,
retrying with exponential backoff; when Redis answers again it catches up by itself.
BLAS and numba run on ``worker_threads`` threads (threadpoolctl, ``numba.set_num_threads``)
so the HTTP side keeps a core. If the engine's process dies, the worker starts a new one
(log replay, restore from the centroids served last). Any other error than Redis being
unavailable ends the thread and ``/readyz`` reports it.
"""

from __future__ import annotations

import contextlib
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

from nmbatch.service.config import Settings
from nmbatch.service.engine_host import (
    AlgoView,
    EngineConfig,
    EngineHost,
    EngineProcess,
    EngineProcessError,
    LocalEngine,
    StoreView,
)
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.redis_log import (
    LeaseLostError,
    ModelRepository,
    Snapshot,
    WorkerLease,
    redis_unavailable,
)
from nmbatch.service.state import DoublingEvent, ModelBoard, PublishedModel, PublishedStats

__all__ = ["VERSION_BLOCK", "Worker"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_DOUBLINGS = 1000  # doubling events kept for /stats
VERSION_BLOCK = 1000
"""Centroid versions reserved in Redis at a time (a crash may skip up to this many)."""
_BACKOFF_MIN, _BACKOFF_MAX = 0.05, 2.0  # seconds between attempts while Redis is away


class _RedisAwayError(Exception):
    """Redis did not answer; the caller skips the operation (backoff is running)."""


def _model_of(snapshot: Snapshot, version: int | None = None) -> PublishedModel:
    return PublishedModel.build(
        version=snapshot.version if version is None else version,
        centroids=snapshot.centroids,
        counts=snapshot.counts,
        n_samples=snapshot.n_samples,
        batch_size=snapshot.batch_size,
        iteration=snapshot.iteration,
        converged=snapshot.converged,
        updated_at=snapshot.updated_at,
    )


class Worker:
    """Runs nmbatch on the model's sample log in a background thread, or stands by.

    Parameters
    ----------
    settings : Settings
    repository : ModelRepository
        Synchronous Redis access, used by this object's threads once started.
    board : ModelBoard
        Where models and statistics are published.
    metrics : ServiceMetrics
    lease : WorkerLease
        The model's worker lease (its own single-connection client).
    snapshot : Snapshot or None
        The snapshot read at start-up.
    dim : int or None
        The model's dimension if already known.
    """

    def __init__(
        self,
        settings: Settings,
        repository: ModelRepository,
        board: ModelBoard,
        metrics: ServiceMetrics,
        lease: WorkerLease,
        *,
        snapshot: Snapshot | None = None,
        dim: int | None = None,
        engine_nice: int = 0,
    ) -> None:
        self.settings = settings
        self.repository = repository
        self.board = board
        self.metrics = metrics
        self.lease = lease
        self.snapshot = snapshot
        self.dim = dim
        self.wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"nmbatch-worker-{settings.model}", daemon=True
        )
        self._lease_thread = threading.Thread(
            target=self._keep_lease, name=f"nmbatch-lease-{settings.model}", daemon=True
        )
        self._lease_stop = threading.Event()
        self._holding = threading.Event()  # we hold the lease (as far as we know)
        self._lease_lost = threading.Event()  # another process holds it now
        self.error: BaseException | None = None
        self.phase = "starting"
        self.role = "starting"
        self.engine_nice = engine_nice
        self.engine: EngineHost | None = None
        self.store: StoreView | None = None
        self.algo: AlgoView | None = None
        self.last_id = "0-0"
        self.version = 0
        self._reserved = 0  # versions_reserved as this worker left it in Redis
        self._snapshot_version = 0  # version of the snapshot known to be in Redis
        self._last_snapshot = time.monotonic()
        self._doublings: deque[DoublingEvent] = deque(maxlen=_MAX_DOUBLINGS)
        self._distances = 0
        self._skipped = 0
        self._last_seconds: float | None = None
        self.redis_ok = True
        self._backoff = 0.0
        self._retry_at = 0.0

    # -- control (any thread) -------------------------------------------------------------
    def begin(self) -> None:
        """Take the lease if free and publish the first model; call once before :meth:`start`.

        Raises a Redis error if Redis does not answer (the service does not start then).
        """
        if self.lease.acquire():
            self._holding.set()
            try:
                self._assume(self.snapshot)
                return
            except LeaseLostError:  # taken by another process in between
                self._holding.clear()
        self._set_role("standby")
        if self.snapshot is not None:
            self.board.publish(_model_of(self.snapshot))
            self.metrics.centroid_version.set(self.snapshot.version)
        log.info("another process is the worker of model '%s': standing by",
                 self.settings.model)  # fmt: skip

    def start(self) -> None:
        """Start the threads."""
        self._lease_thread.start()
        self._thread.start()

    def notify(self) -> None:
        """Tell the worker that samples were appended to the log."""
        self.wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the step, write a last snapshot, release the lease, end; wait for it."""
        self._stopping.set()
        self.wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("worker did not stop within %.0f s", timeout)
        self._lease_stop.set()
        if self._lease_thread.is_alive():
            self._lease_thread.join(timeout)

    def alive(self) -> bool:
        """True while the thread runs without a fatal error."""
        return self._thread.is_alive() and self.error is None

    # -- the thread -----------------------------------------------------------------------
    def _run(self) -> None:
        threads = self.settings.worker_threads
        try:
            with threadpool_limits(limits=threads):
                numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
                while not self._stopping.is_set():
                    if self.role == "worker":
                        try:
                            if self._prepare():
                                self._loop()
                        except EngineProcessError as exc:
                            self._restart_engine(exc)
                            continue
                        if self._lease_lost.is_set() and not self._stopping.is_set():
                            self._demote()
                    else:
                        self._stand_by()
        except BaseException as exc:
            self.error = exc
            self.phase = "failed"
            log.exception("worker failed: %s", exc)
        finally:
            self._lease_stop.set()
            try:
                self._finish()
            except Exception:
                log.exception("could not write the final snapshot or release the lease")
            self._close_engine()
            if self.error is None:
                self.phase = "stopped"
            self._publish_stats()

    def _set_role(self, role: str) -> None:
        self.role = role
        self.metrics.is_worker.set(int(role == "worker"))
        if role == "standby":
            self.phase = "standby"

    def _assume(self, snapshot: Snapshot | None) -> None:
        """Become the worker: reserve versions above all shown, publish ``snapshot``.

        Raises Redis errors and :class:`LeaseLostError` to the caller.
        """
        current = self.board.model
        base = max(
            self.repository.reserved_versions(),
            snapshot.version if snapshot is not None else 0,
            current.version if current is not None else 0,
            self.version,
        )
        self._reserved = self.repository.reserve_versions(self.lease.token, base + VERSION_BLOCK)
        self.version = base
        self.snapshot = snapshot
        self._snapshot_version = snapshot.version if snapshot is not None else 0
        if snapshot is not None:
            if base > snapshot.version:
                # Versions up to ``base`` may have been shown with newer centroids by a
                # worker that died before its next snapshot: number these above them.
                self.version = base + 1
                self.board.publish(_model_of(snapshot, self.version))
                log.info("snapshot version %d republished as version %d (versions up to %d "
                         "were reserved by the previous worker)",
                         snapshot.version, self.version, base)  # fmt: skip
            else:
                self.board.publish(_model_of(snapshot))
            self.metrics.centroid_version.set(self.version)
        self._lease_lost.clear()
        self._set_role("worker")
        log.info("worker of model '%s' (centroid versions from %d)", self.settings.model,
                 self.version)  # fmt: skip

    def _stand_by(self) -> None:
        """Follow the snapshots in Redis until the lease is ours (or we stop)."""
        self._set_role("standby")
        self._publish_stats()
        while not self._stopping.is_set():
            try:
                if self._redis(self.lease.acquire):
                    self._holding.set()
                    self._redis(self._assume, self._redis(self.repository.read_snapshot))
                    return
                self._follow()
            except _RedisAwayError:
                pass
            except LeaseLostError:  # lost it between taking it and reserving: stand by
                self._holding.clear()
            self.wake.wait(self.settings.poll_seconds)
            self.wake.clear()

    def _follow(self) -> None:
        """Publish the snapshot in Redis if newer than the served model (standby)."""
        version = self._redis(self.repository.snapshot_version)
        model = self.board.model
        if version is None or (model is not None and version <= model.version):
            return
        snapshot = self._redis(self.repository.read_snapshot)
        if snapshot is not None and self.board.publish(_model_of(snapshot)):
            self.metrics.centroid_version.set(snapshot.version)
            self._publish_stats()

    def _check_lease(self) -> None:
        """A fenced write found the lease not ours: take it again if it merely expired.

        Sets ``_lease_lost`` (demotion) if another process took it.
        """
        try:
            held = self._redis(self.lease.renew)
        except _RedisAwayError:
            return  # decided at the next write or renewal
        if not held:
            self._holding.clear()
            self._lease_lost.set()

    def _demote(self) -> None:
        """Another process holds the lease: drop the engine state and stand by."""
        log.warning("the worker lease of model '%s' was taken by another process: "
                    "standing by", self.settings.model)  # fmt: skip
        self._holding.clear()
        self._lease_lost.clear()
        self._close_engine()
        self.last_id = "0-0"
        self._set_role("standby")

    def _finish(self) -> None:
        """On stop as the worker: last snapshot, then release the lease."""
        if self.role != "worker" or not self._holding.is_set():
            return
        if self._lease_thread.is_alive():
            self._lease_thread.join(10.0)
        self._retry_at = 0.0  # one last attempt even during a backoff
        try:
            self._write_snapshot()
            model = self.board.model
            settled = model is None or model.version <= self._snapshot_version
            # Everything shown is in the snapshot: the next worker may go on from it as is.
            self._redis(self.lease.release, self._snapshot_version if settled else None)
        except (_RedisAwayError, LeaseLostError):
            log.warning("stopped without the last snapshot or lease release (Redis away or "
                        "lease lost); the lease expires in %.0f s",
                        self.settings.worker_lock_seconds)  # fmt: skip
        self._holding.clear()

    def _prepare(self) -> bool:
        """Wait for the dimension, build the engine, replay the log, restore.

        False: stopped, or the lease was lost.
        """
        self.phase = "waiting-for-dimension"
        self._publish_stats()
        while self.dim is None:
            if self._stopping.is_set() or self._lease_lost.is_set():
                return False
            with contextlib.suppress(_RedisAwayError):
                self.dim = self._redis(self.repository.dim)
            if self.dim is None:
                self.wake.wait(self.settings.poll_seconds)
                self.wake.clear()
        s = self.settings
        config = EngineConfig(
            dim=self.dim,
            k=s.k,
            init=s.init,
            rho=s.rho,
            batch_size=s.batch_size,
            seed=s.seed,
            threads=s.worker_threads,
            nice=self.engine_nice,
        )
        self._close_engine()
        self.phase = "starting-engine"
        self.engine = EngineProcess(config) if s.worker_process else LocalEngine(config)
        self.store, self.algo = self.engine.store, self.engine.algo
        self.last_id = "0-0"
        self.phase = "replaying"
        self._publish_stats()
        started = time.perf_counter()
        while True:
            if self._stopping.is_set() or self._lease_lost.is_set():
                return False
            try:
                if not self._pull_log():
                    break
            except _RedisAwayError:
                self._stopping.wait(max(0.01, self._retry_at - time.monotonic()))
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

    def _restart_engine(self, exc: EngineProcessError) -> None:
        """The engine's process died: rebuild it from the log and the served centroids.

        The next :meth:`_prepare` replays the whole log into a new process and restores
        the centroids published last (versions go on increasing). Waits a second first,
        so a process that cannot start is not restarted in a tight loop.
        """
        log.error("%s: restarting the engine (log replay, restore from version %s)", exc,
                  self.board.model.version if self.board.model else None)  # fmt: skip
        self.metrics.engine_restarts.inc()
        self._close_engine()
        model = self.board.model
        if model is not None and model.n_samples > 0:
            self.snapshot = self._snapshot_of(model)
        self._stopping.wait(1.0)

    def _close_engine(self) -> None:
        """Drop the engine (and end its process, if any)."""
        engine, self.engine, self.store, self.algo = self.engine, None, None, None
        if engine is not None:
            engine.close()

    def _loop(self) -> None:
        assert self.algo is not None and self.store is not None
        algo, store = self.algo, self.store
        poll = self.settings.poll_seconds
        last_pull = time.monotonic()
        idle_logged = False
        while not self._stopping.is_set() and not self._lease_lost.is_set():
            if self.wake.is_set() or time.monotonic() - last_pull >= poll:
                self.wake.clear()
                try:
                    while self._pull_log():  # everything available, page by page
                        pass
                except _RedisAwayError:
                    pass  # iterate on what we have; the next pull retries
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
                try:
                    self._write_snapshot()
                except _RedisAwayError:
                    pass
                except LeaseLostError:
                    self._check_lease()

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
        """Publish the algorithm's current centroids as the next version.

        A version is shown only once it is reserved in Redis. The next block is reserved
        when half of the current one is used, so an outage leaves at least half a block
        to go on with; when Redis is away and the reserved versions are used up,
        publication waits (the iterations go on).
        """
        assert self.algo is not None and self.store is not None
        if self._reserved - self.version <= VERSION_BLOCK // 2:
            try:
                self._reserved = self._redis(
                    self.repository.reserve_versions, self.lease.token, self.version + VERSION_BLOCK
                )
            except _RedisAwayError:
                if self.version + 1 > self._reserved:
                    self._publish_stats()
                    return
            except LeaseLostError:
                self._check_lease()
                return
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
        if self.role == "standby" or algo is None:
            model = self.board.model  # a standby shows the snapshot it serves
            self.board.publish_stats(
                PublishedStats(
                    phase=self.phase,
                    iteration=model.iteration if model is not None else 0,
                    batch_size=model.batch_size if model is not None else 0,
                    n_samples=model.n_samples if model is not None else 0,
                    converged=model.converged if model is not None else False,
                    distances_computed=self._distances,
                    distances_skipped=self._skipped,
                    doublings=tuple(self._doublings),
                    last_iteration_seconds=self._last_seconds,
                )
            )
            return
        energy = None
        if algo.iteration > 0 and algo.batch_size > 0:
            value = algo.energy_estimate()
            energy = value if np.isfinite(value) else None
        self.board.publish_stats(
            PublishedStats(
                phase=self.phase,
                iteration=algo.iteration,
                batch_size=algo.batch_size,
                n_samples=store.n_samples if store is not None else 0,
                converged=bool(algo.converged),
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
        chunks = self._redis(self.repository.read_log, self.last_id, page)
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
        """Store the published model in Redis if it is newer than the last snapshot.

        Raises :class:`_RedisAwayError` (try at the next cadence) and :class:`LeaseLostError`.
        """
        self._last_snapshot = time.monotonic()
        model = self.board.model
        if model is None or model.version <= self._snapshot_version:
            return
        snapshot = self._snapshot_of(model)
        written = self._redis(self.repository.write_snapshot, snapshot, self.lease.token)
        self._snapshot_version = model.version
        if written:
            self.metrics.snapshot_written()
        else:
            log.warning("Redis holds a snapshot newer than version %d: not replaced", model.version)

    def _snapshot_of(self, model: PublishedModel) -> Snapshot:
        """The snapshot of a published model, at the log position read so far."""
        return Snapshot(
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

    def _redis(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``; raises :class:`_RedisAwayError` if Redis is unavailable or backing off.

        While Redis is away, calls are skipped until the backoff (doubling from 50 ms to
        2 s) has passed; the first failure and the recovery are logged once.
        """
        now = time.monotonic()
        if now < self._retry_at:
            raise _RedisAwayError
        try:
            result = fn(*args)
        except redis.RedisError as exc:
            if not redis_unavailable(exc):
                raise
            self._backoff = min(max(2 * self._backoff, _BACKOFF_MIN), _BACKOFF_MAX)
            self._retry_at = time.monotonic() + self._backoff
            self.metrics.redis_errors.labels("worker").inc()
            if self.redis_ok:
                self.redis_ok = False
                self.metrics.redis_up.set(0)
                log.warning("Redis unavailable in the worker (%s); retrying with backoff", exc)
            raise _RedisAwayError from exc
        if not self.redis_ok:
            self.redis_ok = True
            self.metrics.redis_up.set(1)
            log.warning("Redis reachable again: the worker resumes reading and snapshots")
        self._backoff = 0.0
        return result

    # -- the lease thread -----------------------------------------------------------------
    def _keep_lease(self) -> None:
        """Renew the lease every third of its expiry while held and the worker lives."""
        interval = self.settings.worker_lock_seconds / 3
        delay = interval
        while not self._lease_stop.wait(delay):
            delay = interval
            if not self._holding.is_set() or not self._thread.is_alive():
                continue
            try:
                held = self.lease.renew()
            except redis.RedisError as exc:
                if not redis_unavailable(exc):
                    log.exception("renewing the worker lease failed")
                delay = min(interval, 0.25)  # try again soon: the expiry runs
                continue
            if not held and self._holding.is_set():
                self._holding.clear()
                self._lease_lost.set()
                self.wake.set()
