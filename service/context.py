"""What the routes share: settings, Redis clients, the worker and the published model.

One :class:`ServiceContext` lives in ``app.state.context`` between the lifespan's start
and end. Routes reach it through the :func:`get_context` dependency and call its few
operations; they hold no state of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Annotated, TypeVar

import numpy as np
from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from nmbatch.engine import nearest
from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.parsing import NPY, OCTET, media_type, parse_vectors
from nmbatch.service.problems import ProblemError
from nmbatch.service.state import ModelBoard, PublishedModel
from nmbatch.service.storage import (
    AppendOutcome,
    AsyncSampleLog,
    IdempotencyKeyReusedError,
    StoreFullError,
    WrongDimensionError,
)
from nmbatch.service.storage.capacity import (
    REDIS_FIXED_BYTES,
    Capacity,
    plan_capacity,
    redis_maxmemory,
)
from nmbatch.service.worker import Role, Worker
from nmbatch.service.worker.retention import MIN_COMPACTION, REDIS_SAMPLES

__all__ = ["Context", "ServiceContext", "assign", "get_context", "off_loop", "parse_body"]

T = TypeVar("T")

log = logging.getLogger("service")

_INLINE_VALUES = 65_536  # numpy work on fewer values runs on the event loop
_INLINE_BINARY_BYTES = 4 << 20  # .npy / raw bodies up to this size are parsed on the loop
_INLINE_JSON_BYTES = 16 << 10  # JSON bodies up to this size are parsed on the loop


async def off_loop(values: int, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``: inline for small inputs, else in the thread pool (the loop stays free).

    ``values`` estimates the work (numbers touched); a threadpool hop costs more than
    a tiny numpy call.
    """
    if values <= _INLINE_VALUES:
        return fn(*args)
    return await run_in_threadpool(fn, *args)


async def parse_body(
    body: bytes | bytearray, content_type: str, **limits: int | None
) -> np.ndarray:
    """:func:`service.parsing.parse_vectors` of a request body, on or off the event loop.

    Binary bodies (``.npy``, raw ``float32``) are parsed in place by a few numpy calls
    over the bytes (about 40 microseconds per 512 KiB), less than a hop to the thread pool
    and back costs (two thread wake-ups, and the GIL handed over twice): they are parsed
    on the loop up to 4 MiB. JSON builds a Python float per number (about 8 ms per
    1,000 x 128 vectors): above 16 KiB it goes to the thread pool, so the loop keeps
    serving other requests meanwhile. ``limits`` are ``parse_vectors``'s keywords.
    """
    kind = media_type(content_type)
    inline = _INLINE_BINARY_BYTES if kind in (NPY, OCTET) else _INLINE_JSON_BYTES
    if len(body) <= inline:
        return parse_vectors(body, content_type, **limits)
    return await run_in_threadpool(partial(parse_vectors, body, content_type, **limits))


def assign(model: PublishedModel, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid of each row of ``X`` (``(n, d)`` float32) under ``model``.

    Returns labels ``(n,)`` int64 and Euclidean distances ``(n,)`` float64. One thread
    per request: the HTTP side answers many at once from its thread pool, and leaves the
    other cores to the engine.
    """
    labels, sqdist = nearest(X, model.state.centroids, n_threads=1)
    return labels, np.sqrt(sqdist)


class ServiceContext:
    """Shared state of one app between lifespan start and end."""

    def __init__(
        self,
        settings: Settings,
        sample_log: AsyncSampleLog,
        board: ModelBoard,
        metrics: ServiceMetrics,
        worker: Worker,
        dim: int | None,
        embedded_redis: EmbeddedRedis | None = None,
        *,
        memory: tuple[int, str],
        redis_needs: dict[str, int] | None = None,
    ) -> None:
        self.settings = settings
        self.sample_log = sample_log
        self.board = board
        self.metrics = metrics
        self.worker = worker
        self.dim = dim
        self.embedded_redis = embedded_redis
        self.memory = memory
        # Bytes of maxmemory each model of the app needs (shared by the app's models).
        self.redis_needs = redis_needs if redis_needs is not None else {}
        self.capacity: Capacity | None = None
        # What a 507 tells the client to raise: the setting, or a named model's max_samples.
        self.capacity_setting = "NMBATCH_MAX_SAMPLES"

    async def plan_capacity(self, dim: int) -> Capacity:
        """The model's :class:`Capacity` for its dimension ``dim``, set up on first use.

        Planned once the dimension is known (at start-up, or when the first batch fixes
        it): logged, shown in ``nmbatch_max_samples``, and the embedded Redis's
        ``maxmemory`` set to match (never below what it already uses plus its fixed
        overhead, so a log above a lowered capacity does not block the worker's writes);
        with several models (:attr:`redis_needs`) to the sum of their needs.
        """
        capacity = self.capacity
        if capacity is not None and capacity.dim == dim:
            return capacity
        s = self.settings
        capacity = plan_capacity(
            s.max_samples, dim, s.k, memory=self.memory, with_redis=self.embedded_redis is not None
        )
        log.info("capacity of model '%s' (retention %s): %s", s.model, s.retention,
                 capacity.detail)  # fmt: skip
        if self.embedded_redis is not None:
            # The log of a window, an age or a reservoir holds more than its size for a
            # while (until the next trim or compaction).
            in_redis = capacity.max_samples * REDIS_SAMPLES[s.retention]
            if s.retention == "reservoir":
                in_redis += MIN_COMPACTION
            needs = self.redis_needs
            needs[s.model] = redis_maxmemory(in_redis, dim) - REDIS_FIXED_BYTES
            maxmemory = await self.embedded_redis.limit_memory(
                self.sample_log.client, sum(needs.values()) + REDIS_FIXED_BYTES, REDIS_FIXED_BYTES
            )
            log.info("embedded Redis maxmemory %d bytes (noeviction)", maxmemory)
        self.metrics.max_samples.set(capacity.max_samples)
        self.capacity = capacity
        return capacity

    async def known_dim(self) -> int | None:
        """The model's dimension: the setting, or Redis's (fixed by any process), or None."""
        if self.dim is None:
            self.dim = await self.sample_log.dim()
        return self.dim

    async def append_samples(
        self, X: np.ndarray, idempotency_key: str | None = None
    ) -> AppendOutcome:
        """Append ``X`` (``(m, d)`` float32, validated) to the log, once per ``idempotency_key``.

        :meth:`AsyncSampleLog.append` within the model's capacity (:meth:`plan_capacity`);
        its refusals become problems: a batch of another dimension racing with the first
        one gets ``wrong-dimension`` (422), a key used for other vectors
        ``idempotency-key-reused`` (409), a batch that would pass the capacity (or that
        Redis refuses for its memory) ``store-full`` (507); with a retention other than
        ``all`` the embedded Redis's refusal is ``log-backlog`` (503, ``Retry-After``): the
        log is trimmed as rows retire, so it is a moment's backlog, not a full store.
        """
        m = int(X.shape[0])
        try:
            if self.dim is None:
                await self.sample_log.fix_dim(int(X.shape[1]))
                self.dim = int(X.shape[1])  # this batch fixed it, or found it fixed as its own
            capacity = await self.plan_capacity(self.dim)
            outcome = await self.sample_log.append(
                X,
                dim=self.dim,
                # Only "all" refuses samples; the other policies make room by retiring.
                max_samples=capacity.max_samples if self.settings.retention == "all" else None,
                idempotency_key=idempotency_key,
                key_seconds=self.settings.idempotency_seconds,
                # This process's worker takes the rows from memory rather than from Redis.
                hand_over=self.worker.role == Role.WORKER,
                offload=off_loop,
            )
        except WrongDimensionError as exc:
            self.dim = exc.expected
            raise ProblemError(
                422, "wrong-dimension", str(exc), expected_dim=exc.expected, got_dim=exc.got
            ) from None
        except IdempotencyKeyReusedError as exc:
            raise ProblemError(
                409, "idempotency-key-reused", str(exc), title="Idempotency-Key reused"
            ) from None
        except StoreFullError as exc:
            raise self._store_full(exc, m) from None
        if outcome.stored:
            self.metrics.samples_ingested.inc(outcome.accepted)
            self.worker.notify()
        return outcome

    def _store_full(self, exc: StoreFullError, rejected: int) -> ProblemError:
        """The ``store-full`` (507) problem of a refused append of ``rejected`` rows."""
        max_samples = self.capacity.max_samples if self.capacity is not None else exc.max_samples
        if exc.redis_oom and self.settings.retention != "all" and self.embedded_redis:
            # The log is trimmed as the window, age or reservoir retires rows; the embedded
            # Redis's maxmemory (sized here for the retained rows) is reached when the
            # trimming lags the ingestion: the same batch fits a moment later. An external
            # Redis's maxmemory is the operator's: it may never fit, so that stays a 507.
            log.warning("Redis refused an append for its memory: %s", exc)
            return ProblemError(
                503,
                "log-backlog",
                f"{exc} (with {exc.n_samples:,} samples in the log, retention "
                f"{self.settings.retention}): the worker has not yet trimmed the rows the "
                "retention retired; nothing was stored, retry shortly",
                title="Log backlog",
                headers={"Retry-After": "1"},
                n_samples=exc.n_samples,
                rejected=rejected,
            )
        if exc.redis_oom:
            detail = f"{exc} (with {exc.n_samples:,} samples in the log)"
            log.warning("Redis refused an append for its memory: %s", exc)
        else:
            detail = str(exc)
        return ProblemError(
            507,
            "store-full",
            detail + f"; the service goes on serving, raise {self.capacity_setting} (and the "
            "memory) to store more",
            title="Store full",
            setting=self.capacity_setting,
            max_samples=max_samples,
            n_samples=exc.n_samples,
            rejected=rejected,
        )

    async def require_model(self) -> PublishedModel:
        """The published model, or a problem saying why there is none yet."""
        model = self.board.model
        if model is not None:
            return model
        k = self.settings.k
        n = await self.sample_log.n_samples()
        if n < k:
            raise ProblemError(
                409,
                "not-enough-samples",
                f"no centroids yet: {n} samples stored, k = {k} are needed before the first "
                f"iteration; send {k - n} more",
                title="Not enough samples",
                needed=k - n,
                n_samples=n,
                k=k,
            )
        raise ProblemError(
            503,
            "centroids-pending",
            f"{n} samples stored; the first centroids are being computed, retry shortly",
            title="Centroids pending",
            headers={"Retry-After": "1"},
            needed=0,
            n_samples=n,
            k=k,
        )


async def get_context(request: Request) -> ServiceContext:
    """FastAPI dependency: the :class:`ServiceContext` of the request's model.

    The default model's (``NMBATCH_MODEL``), or under ``/models/{name}/...`` the named
    model's (:meth:`nmbatch.service.models.ModelManager.context`: ``404`` if unknown).
    ``async`` on purpose: FastAPI runs a plain ``def`` dependency in the thread pool,
    a hop to another thread and back on every request for one attribute read.
    """
    name = request.path_params.get("name")
    if name is None or not request.url.path.startswith("/models/"):
        return request.app.state.context
    return await request.app.state.models.context(name)


Context = Annotated[ServiceContext, Depends(get_context)]
