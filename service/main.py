"""The FastAPI app: ``create_app(settings)`` assembles routes, errors and the lifespan.

The lifespan owns every long-lived thing, in this order on start and reversed on exit:
the embedded ``redis-server`` (only when ``NMBATCH_REDIS_URL`` is unset), the Redis
clients, the start-up checks (a ``k`` or dimension that contradicts Redis stops here),
the restored snapshot (published at once, so ``GET /centroids`` answers before the log
replay ends), and the worker thread. On exit the worker writes a last snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from service.config import Settings
from service.context import ServiceContext
from service.embedded_redis import EmbeddedRedis
from service.metrics import RequestTimingMiddleware, ServiceMetrics
from service.problems import install_problem_handlers
from service.redis_log import AsyncSampleLog, ModelConfigError, ModelRepository
from service.routes import assign, centroids, health, samples, stats
from service.state import ModelBoard, PublishedModel
from service.worker import Worker

__all__ = ["StartupError", "create_app"]

log = logging.getLogger("service")


class StartupError(RuntimeError):
    """The service cannot start (Redis unreachable, settings contradicting Redis ...)."""


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; nothing starts until its lifespan runs (uvicorn, TestClient)."""
    settings = settings if settings is not None else Settings()
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            app.state.context = await _start(settings, metrics, stack)
            try:
                yield
            finally:
                app.state.context = None

    app = FastAPI(
        title="nmbatch",
        version="0.1.0",
        summary="Streaming k-means (Nested Mini-Batch K-Means) over HTTP",
        description=(
            "POST samples, GET centroids and assignments while the centroids keep improving. "
            "Errors are RFC 9457 problem details (application/problem+json)."
        ),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.context = None
    install_problem_handlers(app)
    app.add_middleware(RequestTimingMiddleware, metrics=metrics)
    for module in (samples, centroids, assign, stats, health):
        app.include_router(module.router)
    return app


async def _start(
    settings: Settings, metrics: ServiceMetrics, stack: AsyncExitStack
) -> ServiceContext:
    """Start everything; every started thing is registered on ``stack`` for the exit."""
    url = settings.redis_url
    embedded: EmbeddedRedis | None = None
    if url is None:
        embedded = EmbeddedRedis(
            settings.data_dir,
            port=settings.embedded_redis_port,
            appendfsync=settings.appendfsync,
        )
        # Started on the event loop's own thread, not a pool thread: the child is told to
        # exit when the thread that started it ends (Linux), and pool threads come and go.
        url = embedded.start()
        stack.callback(embedded.stop)
        log.info("embedded Redis at %s, data in %s", url, embedded.data_dir)

    # Request handlers use the async client; the synchronous one serves the start-up checks
    # and then the worker thread only.
    async_client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=5.0)
    stack.push_async_callback(async_client.aclose)
    sync_client = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=5.0)
    stack.callback(sync_client.close)

    repository = ModelRepository(sync_client, settings.model)
    try:
        dim = await run_in_threadpool(repository.check_meta, settings.k, settings.dim)
        snapshot = await run_in_threadpool(repository.read_snapshot)
    except ModelConfigError as exc:
        log.error("start-up refused: %s", exc)
        raise StartupError(str(exc)) from None
    except redis.RedisError as exc:
        log.error("start-up refused: Redis at %s unusable: %s", _safe_url(url), exc)
        raise StartupError(f"Redis at {_safe_url(url)} is unusable: {exc}") from None

    board = ModelBoard()
    if snapshot is not None:
        board.publish(
            PublishedModel.build(
                version=snapshot.version,
                centroids=snapshot.centroids,
                counts=snapshot.counts,
                n_samples=snapshot.n_samples,
                batch_size=snapshot.batch_size,
                iteration=snapshot.iteration,
                converged=snapshot.converged,
                updated_at=snapshot.updated_at,
            )
        )
        metrics.centroid_version.set(snapshot.version)
        log.info(
            "restored snapshot version %d (b = %d, iteration %d)",
            snapshot.version,
            snapshot.batch_size,
            snapshot.iteration,
        )

    worker = Worker(
        settings,
        repository,
        board,
        metrics,
        snapshot=snapshot,
        dim=dim,
    )
    worker.start()
    stack.push_async_callback(run_in_threadpool, worker.stop)

    return ServiceContext(
        settings=settings,
        sample_log=AsyncSampleLog(async_client, settings.model),
        board=board,
        metrics=metrics,
        worker=worker,
        dim=dim,
        embedded_redis=embedded,
    )


def _safe_url(url: str) -> str:
    """``url`` without a password."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return urlunsplit(parts._replace(netloc=f"***@{netloc}"))
    return url
