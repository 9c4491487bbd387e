"""The worker thread: sample log -> store -> nmbatch iterations -> published model.

:class:`Worker` runs the loop of each role and the transitions between roles and phases
(:mod:`nmbatch.service.worker.roles`); the lease, the Redis backoff and the publication
are its parts (:mod:`~nmbatch.service.worker.lease`, :mod:`~nmbatch.service.worker.backoff`,
:mod:`~nmbatch.service.worker.publisher`), and so are the models, statistics and
snapshots it publishes (:mod:`~nmbatch.service.worker.publication`). What each role does
is told in :mod:`nmbatch.service.worker`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from nmbatch.engine.hosting import EngineHost, EngineProcessError, iterate, settled
from nmbatch.engine.threads import kernel_threads
from nmbatch.service.config import Settings
from nmbatch.service.logs import bind_model
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.state import ModelBoard
from nmbatch.service.storage import LeaseLostError, ModelRepository, Snapshot, WorkerLease
from nmbatch.service.storage.deletions import Tombstones
from nmbatch.service.storage.events import EventWriter
from nmbatch.service.storage.handoff import handoff_bytes
from nmbatch.service.storage.retained import RetainedLog
from nmbatch.service.tracing import span
from nmbatch.service.worker.backoff import RedisAwayError, RedisBackoff
from nmbatch.service.worker.engines import build_engine
from nmbatch.service.worker.lease import VERSION_BLOCK, LeaseKeeper
from nmbatch.service.worker.publication import Publication
from nmbatch.service.worker.publisher import Publisher
from nmbatch.service.worker.recovery import EngineRecovery
from nmbatch.service.worker.retention import LogRetention
from nmbatch.service.worker.roles import Phase, Role
from nmbatch.service.worker.samples import SampleDesk
from nmbatch.service.worker.signals import Signals

__all__ = ["Worker"]

log = logging.getLogger(__name__)

_LOG_PAGE = 4
"""Log entries read at a time (<= 1 MiB each), also in replay. hiredis decodes a reply
holding the GIL, which the event loop (every ``/assign``) then waits for: a thread
reading pages of 32 entries back to back took the loop's p99 lateness from 5-8 ms to
13-15 ms on a busy 2-core machine, pages of 4 to 9-11 ms."""


class Worker(Publication, EngineRecovery, SampleDesk):
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
    engine_nice : int
        Niceness of the engine's child process (0: unchanged); with
        ``NMBATCH_ENGINE_SCHED_IDLE`` the child runs in Linux's ``SCHED_IDLE`` class
        instead of sharing the CPU by niceness (:func:`~nmbatch.engine.hosting.child.
        lower_priority`).
    retention_size : callable or None
        The retention policy's size for a dimension (:func:`~nmbatch.service.worker.
        retention.retention_size`); None: ``NMBATCH_MAX_SAMPLES``.
    seed : ndarray or None
        ``(k, d)`` float32: the centroids a seeded model (``init="given"``) starts from;
        its engine publishes them first, as they are (:meth:`_step`).

    Attributes
    ----------
    role : Role
    phase : Phase
    error : BaseException or None
        What ended the thread, if it failed; or the unexpected error the worker is
        recovering from, until its engine is rebuilt.
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
        retention_size: Callable[[int], int | None] | None = None,
        redis_url: str | None = None,
        seed: np.ndarray | None = None,
    ) -> None:
        self.settings = settings
        self.seed = seed  # a seeded model's given centroids, (k, d) float32
        self.redis_url = redis_url  # for the shards of a Ray engine, which read the log
        self._by_reference = False  # the engine is fed log entries by reference
        self.repository = repository
        self.board = board
        self.metrics = metrics
        self.snapshot = snapshot
        self.dim = dim
        self.engine_nice = engine_nice
        self.retention_size = retention_size or (lambda dim: settings.max_samples)
        self.retained_log = RetainedLog(repository.client, repository.keys)
        self.tombstones = Tombstones(repository.client, repository.keys)
        self._sample_requests = queue.SimpleQueue()  # lookups and deletions (SampleDesk)
        self.retention: LogRetention | None = None
        self.n_ingested = 0  # samples ever accepted (the meta's count), read at each pull
        self.wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"nmbatch-worker-{settings.model}", daemon=True
        )
        self.backoff = RedisBackoff(metrics)
        self.lease = LeaseKeeper(
            lease,
            repository,
            self.backoff,
            model=settings.model,
            seconds=settings.worker_lock_seconds,
            worker_alive=self._thread.is_alive,
            on_lost=self.wake.set,
        )
        self.publisher = Publisher(board, metrics, self.lease, self.backoff)
        events = EventWriter(repository.client, settings.model, settings.events_keep)
        self.signals = Signals(settings, events, board, metrics)
        self.error: BaseException | None = None
        self._failures, self._failed_at = 0, -math.inf  # see EngineRecovery._recover
        self.phase = Phase.STARTING
        self.role = Role.STARTING
        self.engine: EngineHost | None = None
        self.last_id = "0-0"  # the last log entry read into the engine's store
        self._snapshot_version = 0  # version of the snapshot known to be in Redis
        self._last_snapshot = time.monotonic()

    # -- control (any thread) -------------------------------------------------------------
    def begin(self) -> None:
        """Take the lease if free and publish the first model; call once before :meth:`start`.

        Raises a Redis error if Redis does not answer (the service does not start then).
        """
        if self.lease.acquire():
            try:
                self._assume(self.snapshot)
                return
            except LeaseLostError:  # taken by another process in between
                self.lease.holding.clear()
        self._set_role(Role.STANDBY)
        if self.snapshot is not None:
            self.publisher.show(self.snapshot.model)
        log.info("another process is the worker of model '%s': standing by",
                 self.settings.model)  # fmt: skip

    def start(self) -> None:
        """Start the threads."""
        self.lease.start()
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
        self.lease.stop()
        self.lease.join(timeout)

    def alive(self) -> bool:
        """True while the thread runs without a fatal error."""
        return self._thread.is_alive() and self.error is None

    # -- the thread: roles ----------------------------------------------------------------
    def _run(self) -> None:
        bind_model(self.settings.model)
        threads = self.settings.worker_threads
        try:
            with kernel_threads(threads):  # the engine's kernels on `threads`, BLAS on one
                while not self._stopping.is_set():
                    if self.role == Role.WORKER:
                        try:
                            if self._prepare():
                                self.error = None
                                self._loop()
                        except EngineProcessError as exc:
                            self._restart_engine(exc)
                            continue
                        except Exception as exc:
                            if self._stopping.is_set():
                                raise
                            self._recover(exc)
                            continue
                        if self.lease.lost.is_set() and not self._stopping.is_set():
                            self._demote()
                    else:
                        self._stand_by()
        except BaseException as exc:
            self.error = exc
            self.phase = Phase.FAILED
            log.exception("worker failed: %s", exc)
        finally:
            self.refuse_samples()
            self.lease.stop()
            try:
                self._finish()
            except Exception:
                log.exception("could not write the final snapshot or release the lease")
            self._close_engine()
            if self.error is None:
                self.phase = Phase.STOPPED
            self._publish_stats()

    def _set_role(self, role: Role) -> None:
        self.role = role
        self.metrics.is_worker.set(int(role == Role.WORKER))
        if role == Role.STANDBY:
            self.phase = Phase.STANDBY

    def _assume(self, snapshot: Snapshot | None) -> None:
        """Become the worker: reserve versions above all shown, publish ``snapshot``.

        Raises Redis errors and :class:`LeaseLostError` to the caller.
        """
        model = snapshot.model if snapshot is not None else None
        base = self.publisher.base_version(self.repository.reserved_versions(), model)
        self.lease.reserve(base + VERSION_BLOCK)
        self.snapshot = snapshot
        self._snapshot_version = model.version if model is not None else 0
        self.publisher.resume(base, model)
        self.lease.lost.clear()
        self._set_role(Role.WORKER)
        log.info("worker of model '%s' (centroid versions from %d)", self.settings.model,
                 self.publisher.version)  # fmt: skip

    def _stand_by(self) -> None:
        """Follow the snapshots in Redis until the lease is ours (or we stop)."""
        self._set_role(Role.STANDBY)
        self._publish_stats()
        while not self._stopping.is_set():
            try:
                if self.backoff.call(self.lease.acquire):
                    snapshot = self.backoff.call(self.repository.read_snapshot)
                    self.backoff.call(self._assume, snapshot)
                    return
                self._follow()
            except RedisAwayError:
                pass
            except LeaseLostError:  # lost it between taking it and reserving: stand by
                self.lease.holding.clear()
            self.wake.wait(self.settings.poll_seconds)
            self.wake.clear()

    def _demote(self) -> None:
        """Another process holds the lease: drop the engine state and stand by."""
        log.warning("the worker lease of model '%s' was taken by another process: "
                    "standing by", self.settings.model)  # fmt: skip
        self.lease.drop()
        self._close_engine()
        self.last_id = "0-0"
        self._set_role(Role.STANDBY)
        self.refuse_samples()

    def _finish(self) -> None:
        """On stop as the worker: last snapshot, then release the lease."""
        if self.role != Role.WORKER or not self.lease.holding.is_set():
            return
        self.lease.join(10.0)
        self.backoff.retry_now()  # one last attempt even during a backoff
        try:
            self._write_snapshot()
            model = self.board.model
            settled = model is None or model.version <= self._snapshot_version
            # Everything shown is in the snapshot: the next worker may go on from it as is.
            self.lease.release(self._snapshot_version if settled else None)
        except (RedisAwayError, LeaseLostError):
            log.warning("stopped without the last snapshot or lease release (Redis away or "
                        "lease lost); the lease expires in %.0f s",
                        self.settings.worker_lock_seconds)  # fmt: skip
        self.lease.holding.clear()

    # -- the thread: the engine -----------------------------------------------------------
    def _prepare(self) -> bool:
        """Wait for the dimension, build the engine, replay the log, restore.

        False: stopped, or the lease was lost.
        """
        self.phase = Phase.WAITING_FOR_DIMENSION
        self._publish_stats()
        while self.dim is None:
            if self._stopping.is_set() or self.lease.lost.is_set():
                return False
            with contextlib.suppress(RedisAwayError):
                self.dim = self.backoff.call(self.repository.dim)
            if self.dim is None:
                self.wake.wait(self.settings.poll_seconds)
                self.wake.clear()
        s = self.settings
        self._close_engine()
        self.phase = Phase.STARTING_ENGINE
        engine, self._by_reference = build_engine(s, self.dim, nice=self.engine_nice,
                                                  redis_url=self.redis_url,
                                                  seed=self.seed)  # fmt: skip
        self.engine = engine
        retained = self.retention_size(self.dim)
        self.retention = LogRetention(s, retained, self.retained_log,
                                      by_reference=self._by_reference)  # fmt: skip
        if self.repository.local is not None:  # rows held beyond the retained set: bounded
            self.repository.local.max_bytes = handoff_bytes(retained, self.dim)
        self.phase = Phase.REPLAYING
        self._publish_stats()
        started = time.perf_counter()
        try:  # the retained rows of the last compaction, then the log after them
            # Tombstones are pruned where entries leave (window, age, reservoir).
            self.tombstones.tracking = s.retention != "all"
            self.retention.deletions = self.tombstones
            self.retention.tombstones = self.backoff.call(self.tombstones.read)
            self.last_id = self.backoff.call(self.retention.load_base, engine)
        except RedisAwayError:
            self._close_engine()  # half a base loaded: start again once Redis is back
            self._stopping.wait(max(0.5, self.backoff.seconds_to_retry()))
            return False
        while True:
            if self._stopping.is_set() or self.lease.lost.is_set():
                return False
            try:
                if not self._pull_log():
                    break
            except RedisAwayError:
                self._stopping.wait(max(0.01, self.backoff.seconds_to_retry()))
        log.info(
            "replayed %d samples from the log in %.2f s",
            engine.store.n_samples,
            time.perf_counter() - started,
        )
        self._retain()  # the count ever accepted before the first publication; trims
        if self.snapshot is not None and engine.store.n_samples > 0:
            state = self.snapshot.model.state
            self._publish(engine.restore(state.centroids, state.batch_size, state.iteration))
        return True

    def _loop(self) -> None:
        engine = self.engine
        assert engine is not None
        poll = self.settings.poll_seconds
        last_pull = time.monotonic()
        idle_logged = False
        while not self._stopping.is_set() and not self.lease.lost.is_set():
            if self.wake.is_set() or time.monotonic() - last_pull >= poll:
                self.wake.clear()
                drift = self.signals.drift
                try:
                    with span("nmbatch.worker.pull", self.settings.model):
                        while self._pull_log():  # everything available, page by page
                            pass
                except RedisAwayError:
                    pass  # iterate on what we have; the next pull retries
                self._retain()
                if self.signals.drift != drift:
                    self._publish_stats()  # /stats shows the figure the rows gave
                last_pull = time.monotonic()
            self.serve_samples()  # lookups and deletions, on the rows pulled so far
            idle = settled(engine)
            if engine.ready() and not idle:
                self.phase = Phase.ITERATING
                idle_logged = False
                with span("nmbatch.worker.step", self.settings.model):
                    self._step()
                self.signals.flush()
            else:
                if not idle_logged:
                    converged = engine.state.converged
                    self.phase = Phase.CONVERGED if converged else Phase.WAITING_FOR_SAMPLES
                    self._publish_stats()
                    idle_logged = True
                self.wake.wait(max(0.0, poll - (time.monotonic() - last_pull)))
            if time.monotonic() - self._last_snapshot >= self.settings.snapshot_seconds:
                self._snapshot(measure=True)

    def _retain(self) -> None:
        """After a round of reads: the count of samples ever accepted, and the retention's
        upkeep (:meth:`LogRetention.maintain`). Redis away: the next round does it."""
        retention = self.retention
        assert retention is not None and self.engine is not None
        trimmed = retention.trimmed_entries
        try:
            self.n_ingested = self.backoff.call(self.repository.n_samples)
            self.backoff.call(retention.maintain, self.engine, self.last_id, self.lease.token)
        except RedisAwayError:
            pass
        except LeaseLostError:
            self.lease.check()
        self.metrics.log_trimmed.inc(retention.trimmed_entries - trimmed)

    def _step(self) -> None:
        """One iteration (the streaming driver's step), counted and published.

        A seeded model's engine that has published nothing (no snapshot restored) starts
        from its seed instead: the engine's ``restore`` over the first batch, which
        leaves the centroids as given, published as they are (iteration 0, the counts of
        that batch under them, no energy estimate yet) and snapshotted, so kept; the steps
        after move them.
        """
        assert self.engine is not None
        if self.seed is not None and not self.engine.state.initialized:
            self._publish(self.engine.restore(self.seed, self.settings.batch_size, 0))
            self._snapshot()  # kept at once: the given centroids stay readable (?version=)
            return
        iterate(self.engine, self._count_and_publish)

    # -- Redis ----------------------------------------------------------------------------
    def _pull_log(self) -> bool:
        """Read one page of new log entries into the store; True if a full page was read."""
        assert self.engine is not None and self.retention is not None
        store = self.engine.store
        repository = self.repository
        read = repository.read_log_heads if self._by_reference else repository.read_log
        chunks = self.backoff.call(read, self.last_id, _LOG_PAGE)
        if not chunks:
            return False
        for chunk in chunks:
            if chunk.X.shape[1] != store.dim:
                log.error("log entry %s has dimension %d, the model %d: skipped",
                          chunk.entry_id, chunk.X.shape[1], store.dim)  # fmt: skip
            else:
                self.retention.offer(self.engine, chunk.X, chunk.entry_id, chunk.weights)
                if not self._by_reference:  # rows by value: measured for the drift figure
                    self.signals.rows(chunk.X)
            self.last_id = chunk.entry_id
        self.metrics.samples_in_store.set(store.n_samples)
        return len(chunks) == _LOG_PAGE
