"""Serving one model: its handle, the samples in and the centroids out.

Every sample crosses this module twice: :func:`ingest` appends it to the model's log
(and wakes the worker), :func:`require_model` and :func:`centroids_json` (or
:func:`centroids_npy`) serve the centroids the worker published from it. The model is a
:class:`ModelHandle`: its settings, its sample log (the request side of Redis), the
board the worker publishes to, the metrics, and two small ports the start-up code fills
in: the model's worker (:class:`WorkerPort`: its role and phase, and ``notify`` after an
append) and its capacity planner (:class:`CapacityPlanner`). Nothing here knows the
worker thread, the engine process or the embedded Redis behind them. Refusals are the
domain errors of :mod:`nmbatch.service.usecases.errors` (storage's errors translated
here); :mod:`nmbatch.service.problems` decides how the client is answered.

:func:`off_loop` decides where the numpy work runs: on the event loop for small inputs,
else in the thread pool.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import numpy as np
import orjson
from anyio.to_thread import run_sync

from nmbatch.engine.metric import ZeroRowError, metric_rows
from nmbatch.engine.state import SampleLookup
from nmbatch.service import storage
from nmbatch.service.config import Settings
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.state import ModelBoard, PublishedModel
from nmbatch.service.storage import AppendOutcome, AsyncSampleLog
from nmbatch.service.storage.capacity import Capacity
from nmbatch.service.storage.deletions import SampleRef
from nmbatch.service.storage.events import AsyncEventFeed
from nmbatch.service.storage.versions import AsyncKeptVersions
from nmbatch.service.usecases.errors import (
    CentroidsPendingError,
    DomainError,
    DuplicateSampleIdError,
    IdempotencyKeyReusedError,
    LogBacklogError,
    ModelDeletedError,
    NotEnoughSamplesError,
    StoreFullError,
    WrongDimensionError,
    ZeroVectorError,
)

__all__ = [
    "WORKER_ROLE",
    "CapacityPlanner",
    "ModelHandle",
    "WorkerPort",
    "centroids_json",
    "centroids_npy",
    "ingest",
    "iso_time",
    "metric_vectors",
    "off_loop",
    "require_model",
]

T = TypeVar("T")

log = logging.getLogger("service")


WORKER_ROLE = "worker"
"""The role of the process that runs the model's iterations (the worker's ``Role.WORKER``,
a string enum)."""

_INLINE_VALUES = 65_536  # numpy work on fewer values runs on the event loop


async def off_loop(values: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``: inline for small inputs, else in the thread pool (the loop stays free).

    ``values`` estimates the work (numbers touched); a threadpool hop costs more than
    a tiny numpy call.
    """
    if values <= _INLINE_VALUES:
        return fn(*args)
    return await run_sync(fn, *args)  # anyio's thread pool, as Starlette's run_in_threadpool


class WorkerPort(Protocol):
    """What the use cases read from, and tell, the model's worker."""

    @property
    def role(self) -> str:
        """``worker``, ``standby`` or ``starting`` (a string enum)."""

    @property
    def phase(self) -> str:
        """What the worker thread is doing (a string enum)."""

    @property
    def error(self) -> BaseException | None:
        """The error that ended the worker thread, if any."""

    def alive(self) -> bool:
        """True while the worker thread runs."""

    def notify(self) -> None:
        """New samples are in the log: wake the worker."""

    def lookup(self, refs: list[SampleRef]) -> Future[tuple[np.ndarray, SampleLookup]]:
        """Where the samples of ``refs`` stand (the worker's ``SampleDesk.lookup``):
        ``(known, lookup)``, ``known`` ``(m,)`` bool, the engine's lookup of the known."""

    def forget(self, refs: list[SampleRef]) -> Future[np.ndarray]:
        """Delete the samples of ``refs`` exactly, tombstones first (the worker's
        ``SampleDesk.forget``): ``(m,)`` bool, True where this call deleted one."""


class CapacityPlanner(Protocol):
    """The model's capacity, planned once its dimension is known."""

    capacity: Capacity | None
    setting: str
    """What a :class:`StoreFullError` tells the client to raise (``NMBATCH_MAX_SAMPLES``,
    or a named model's ``max_samples``)."""

    @property
    def with_redis(self) -> bool:
        """True with the embedded Redis, whose ``maxmemory`` the planner sets."""

    async def plan(self, dim: int) -> Capacity:
        """The capacity for dimension ``dim`` (planned, logged and applied on first use)."""


class ModelHandle:
    """One served model (the default one or a named one), between its start and stop.

    Attributes
    ----------
    settings : Settings
        The model's settings (a named model's are the service's with its spec).
    sample_log : AsyncSampleLog
        The model's sample log through the request handlers' async Redis client.
    board : ModelBoard
        Where its worker publishes the model and the statistics.
    metrics : ServiceMetrics
        Its series of the app's metrics (label ``model``, served by ``/metrics``).
    worker : WorkerPort
        Its worker.
    planner : CapacityPlanner
        Its capacity.
    dim : int or None
        Its dimension once known (the setting, Redis's, or the first batch's).
    kept : AsyncKeptVersions
        Its kept versions and pin in Redis (:mod:`nmbatch.service.storage.versions`).
    events : AsyncEventFeed
        Its events in Redis (:mod:`nmbatch.service.storage.events`).
    """

    def __init__(
        self,
        settings: Settings,
        sample_log: AsyncSampleLog,
        board: ModelBoard,
        metrics: ServiceMetrics,
        worker: WorkerPort,
        planner: CapacityPlanner,
        dim: int | None,
    ) -> None:
        self.settings = settings
        self.sample_log = sample_log
        self.board = board
        self.metrics = metrics
        self.worker = worker
        self.planner = planner
        self.dim = dim
        self.kept = AsyncKeptVersions(sample_log.client, settings.model)
        self.events = AsyncEventFeed(sample_log.client, settings.model)
        self.last_sweep: dict[str, Any] | None = None  # POST /sweep's last answer here

    @property
    def name(self) -> str:
        """The model's name (``NMBATCH_MODEL`` for the default one)."""
        return self.settings.model

    @property
    def capacity(self) -> Capacity | None:
        """The planned capacity, None before the dimension is known."""
        return self.planner.capacity

    async def capacity_for(self, dim: int) -> Capacity:
        """The capacity for dimension ``dim``: the planned one, or planned now."""
        capacity = self.planner.capacity
        if capacity is not None and capacity.dim == dim:
            return capacity
        return await self.planner.plan(dim)

    def handoff_short(self, incoming: int) -> tuple[int, int] | None:
        """``(held, most)`` bytes of this process's hand-off to its worker when
        ``incoming`` more bytes would not fit in it, else None.

        The hand-off (:class:`~nmbatch.service.storage.handoff.LocalEntries`) holds what
        this process appended and its worker has not yet taken: full, the worker is that
        far behind and would read what comes next back from Redis. None where this
        process is not the model's worker (its appends are not handed over).
        """
        local = self.sample_log.local
        if local is None or self.worker.role != WORKER_ROLE:
            return None
        held = local.nbytes
        return (held, local.max_bytes) if held + incoming > local.max_bytes else None

    async def known_dim(self) -> int | None:
        """The model's dimension: the setting, Redis's (fixed by any process), or None."""
        if self.dim is None:
            self.dim = await self.sample_log.dim()
        return self.dim


# -- samples in ----------------------------------------------------------------------
def metric_vectors(X: np.ndarray, metric: str, outcome: str) -> np.ndarray:
    """``X`` (``(n, d)`` float32, validated) as a model of ``metric`` takes it: itself
    (``euclidean``), or a new ``(n, d)`` float32 array of its rows as unit vectors
    (``cosine``: the engine's :func:`~nmbatch.engine.metric.unit_rows`, 4 bytes per
    value). A zero row under ``cosine`` raises :class:`ZeroVectorError` naming its index;
    ``outcome`` says what became of the request (nothing stored, nothing assigned)."""
    try:
        return metric_rows(X, metric, name="vectors")
    except ZeroRowError as exc:
        raise ZeroVectorError(exc.row, outcome) from None


async def ingest(
    handle: ModelHandle,
    X: np.ndarray,
    idempotency_key: str | None = None,
    weights: np.ndarray | None = None,
    ids: list[str] | None = None,
) -> AppendOutcome:
    """Append ``X`` (``(m, d)`` float32, validated) to the log, once per ``idempotency_key``,
    with its sample ``weights`` (``(m,)`` float64, checked; None: every vector weighs 1)
    and its sample ``ids`` (``m`` distinct strings, checked; None: the log assigns them,
    and the outcome lists them).

    :meth:`AsyncSampleLog.append` within the model's capacity (planned here when this
    batch fixes the dimension); storage's refusals become domain errors: a batch of
    another dimension racing with the first one raises :class:`WrongDimensionError`, a
    key used for other vectors :class:`IdempotencyKeyReusedError`, a batch that would
    pass the capacity (or that Redis refuses for its memory) :class:`StoreFullError`;
    with a retention other than ``all`` the embedded Redis's refusal is
    :class:`LogBacklogError`: the log is trimmed as rows retire, so it is a moment's
    backlog, not a full store; a model deleted since the request picked it
    :class:`ModelDeletedError` (checked in the script that appends), an id already a
    sample of the model :class:`DuplicateSampleIdError` (checked in the same script, so of
    two concurrent requests naming one id only one stores it). Stored samples are
    counted and the worker notified.

    Under ``metric="cosine"`` the rows are normalised first (:func:`metric_vectors`), so
    the log and every replay of it hold unit rows; a zero row raises
    :class:`ZeroVectorError` before anything is written (the dimension neither).

    Weights go into the log with the rows (the engine's votes are the weights, on the
    Ray engine's shards as on one machine).
    """
    settings = handle.settings
    if settings.metric != "euclidean":
        X = await off_loop(X.size, metric_vectors, X, settings.metric,
                           "nothing of this request was stored")  # fmt: skip
    try:
        if handle.dim is None:
            await handle.sample_log.fix_dim(int(X.shape[1]))
            handle.dim = int(X.shape[1])  # this batch fixed it, or found it fixed as its own
        capacity = await handle.capacity_for(handle.dim)
        outcome = await handle.sample_log.append(
            X,
            dim=handle.dim,
            # Only "all" refuses samples; the other policies make room by retiring.
            max_samples=capacity.max_samples if settings.retention == "all" else None,
            idempotency_key=idempotency_key,
            key_seconds=settings.idempotency_seconds,
            max_keys=settings.idempotency_max_keys,
            # This process's worker takes the rows from memory rather than from Redis.
            hand_over=handle.worker.role == WORKER_ROLE,
            offload=off_loop,
            weights=weights,
            ids=ids,
        )
    except storage.WrongDimensionError as exc:
        handle.dim = exc.expected
        raise WrongDimensionError(exc.expected, exc.got, str(exc)) from None
    except storage.ModelGoneError:
        raise ModelDeletedError(settings.model) from None
    except storage.IdempotencyKeyReusedError as exc:
        raise IdempotencyKeyReusedError(str(exc)) from None
    except storage.DuplicateSampleIdError as exc:
        raise DuplicateSampleIdError(settings.model, exc.sample_id) from None
    except storage.StoreFullError as exc:
        raise _store_full(handle, exc, int(X.shape[0])) from None
    if outcome.stored:
        handle.metrics.samples_ingested.inc(outcome.accepted)
        handle.worker.notify()
    return outcome


def _store_full(handle: ModelHandle, exc: storage.StoreFullError, rejected: int) -> DomainError:
    """What a refused append of ``rejected`` rows is: :class:`LogBacklogError` (a moment's
    backlog under a retention other than ``all``) or :class:`StoreFullError`."""
    retention = handle.settings.retention
    capacity = handle.capacity
    max_samples = capacity.max_samples if capacity is not None else exc.max_samples
    if exc.redis_oom and retention != "all" and handle.planner.with_redis:
        # The log is trimmed as the window, age or reservoir retires rows; the embedded
        # Redis's maxmemory (sized for the retained rows) is reached when the trimming
        # lags the ingestion: the same batch fits a moment later. An external Redis's
        # maxmemory is the operator's: it may never fit, so that stays a full store.
        log.warning("Redis refused an append for its memory: %s", exc)
        return LogBacklogError(
            f"{exc} (with {exc.n_samples:,} samples in the log, retention "
            f"{retention}): the worker has not yet trimmed the rows the "
            "retention retired; nothing was stored, retry shortly",
            n_samples=exc.n_samples,
            rejected=rejected,
        )
    if exc.redis_oom:
        detail = f"{exc} (with {exc.n_samples:,} samples in the log)"
        log.warning("Redis refused an append for its memory: %s", exc)
    else:
        detail = str(exc)
    return StoreFullError(
        detail + f"; the service goes on serving, raise {handle.planner.setting} (and the "
        "memory) to store more",
        setting=handle.planner.setting,
        max_samples=max_samples,
        n_samples=exc.n_samples,
        rejected=rejected,
    )


# -- centroids out ------------------------------------------------------------------
def iso_time(unix: float) -> str:
    """Unix time as ISO 8601 UTC with milliseconds."""
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds")


async def require_model(handle: ModelHandle) -> PublishedModel:
    """The model reads serve (the pinned version, else the newest published one), or a
    domain error saying why there is none yet.

    :class:`NotEnoughSamplesError` while fewer than ``k`` samples are stored,
    :class:`CentroidsPendingError` while the first iteration runs.
    """
    model = handle.board.served  # the pinned version, if any, else the newest
    if model is not None:
        return model
    k = handle.settings.k
    n = await handle.sample_log.n_samples()
    if n < k:
        raise NotEnoughSamplesError(n, k)
    raise CentroidsPendingError(n, k)


def centroids_json(
    model: PublishedModel, retention: str = "all", metric: str = "euclidean"
) -> bytes:
    """The :class:`Centroids` document of ``model`` (kept under ``retention``, of
    ``metric``), serialised."""
    state = model.state
    return orjson.dumps(
        {
            "version": model.version,
            "k": state.k,
            "dim": state.dim,
            "centroids": state.centroids,
            "counts": state.counts,
            "n_samples": state.n_samples,
            "n_ingested": max(state.n_ingested, state.n_samples),
            "retention": retention,
            "metric": metric,
            "batch_size": state.batch_size,
            "iteration": state.iteration,
            "converged": state.converged,
            "updated_at": iso_time(model.updated_at),
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def centroids_npy(model: PublishedModel) -> bytes:
    """The ``(k, d)`` float32 centroids in ``.npy`` format."""
    out = io.BytesIO()
    np.save(out, model.state.centroids, allow_pickle=False)
    return out.getvalue()
