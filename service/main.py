"""The FastAPI app: ``create_app(settings)`` assembles routes, errors and the lifespan.

The lifespan owns every long-lived thing, in this order on start and reversed on exit:
the embedded ``redis-server`` (only when ``NMBATCH_REDIS_URL`` is unset), the Redis
clients, the start-up checks (a ``k`` or dimension that contradicts Redis stops here),
the worker lease and the restored snapshot (published at once, so ``GET /centroids``
answers before the log replay ends), the kernels' warm-up, and the worker thread. On exit
the worker writes a last snapshot and releases the lease.

Warm-up and heap freeze: before the first request, every numba kernel of the engine and
of the JSON parser is loaded (``engine.warmup``), so no request and no iteration waits
for a compilation. The server process (``python -m nmbatch``) then freezes the heap
(``gc.collect(); gc.freeze()``): the modules, the app and the kernels' objects (about
170,000) leave the cyclic garbage collector's view. Without it, each collection of the
oldest generation walks them all, 60-120 ms holding the GIL, a stall of every request in
flight and the worst ``/assign`` latencies of the load benchmark.

Redis faults: every client has short socket timeouts and no automatic retries (a retried
transaction could log a batch twice, and a request must fail fast rather than hang), and
a Redis error that means "unavailable" (connection refused or lost, timeout, loading,
read-only, MISCONF) becomes a ``503`` problem with ``Retry-After`` in every route.
Requests that need no Redis (``GET /centroids``, ``/assign``) go on answering from memory.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
from fastapi import FastAPI, Request
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from nmbatch.engine.warmup import warm_up
from nmbatch.service.config import Settings
from nmbatch.service.context import ServiceContext
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.fastpath import AssignFastPath
from nmbatch.service.jsonfast import parse_json_matrix
from nmbatch.service.metrics import RequestTimingMiddleware, ServiceMetrics
from nmbatch.service.problems import install_problem_handlers, problem_response
from nmbatch.service.redis_log import (
    AsyncSampleLog,
    LocalEntries,
    ModelConfigError,
    ModelRepository,
    WorkerLease,
    redis_unavailable,
)
from nmbatch.service.routes import assign, centroids, health, samples, stats
from nmbatch.service.state import ModelBoard
from nmbatch.service.worker import Worker

__all__ = ["StartupError", "create_app"]

log = logging.getLogger("service")

REQUEST_SOCKET_TIMEOUT = 5.0
"""Seconds a request handler waits for a Redis reply before answering 503."""
CONNECT_TIMEOUT = 2.0
"""Seconds to open a connection to Redis."""
WORKER_SOCKET_TIMEOUT = 10.0
"""Seconds the worker waits for a Redis reply (log pages of up to 32 MiB)."""
WORKER_NICE = 10
"""Scheduling niceness of the engine's process (or of the worker thread when the engine
runs in it): the HTTP side wins the CPU when both want it."""
WORKER_READ_BYTES = 4 << 20
"""Receive buffer of the worker's Redis connection (bytes read per ``recv``)."""
LEASE_SOCKET_TIMEOUT = 2.0
"""Seconds the lease connection waits for a reply (it renews every third of the expiry)."""


class StartupError(RuntimeError):
    """The service cannot start (Redis unreachable, settings contradicting Redis ...)."""


def create_app(settings: Settings | None = None, *, freeze_heap: bool = False) -> FastAPI:
    """Build the app; nothing starts until its lifespan runs (uvicorn, TestClient).

    ``freeze_heap``: once started, collect and freeze the heap (see the module docstring);
    for the server process, not for a test process that builds many apps.
    """
    settings = settings if settings is not None else Settings()
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            app.state.context = await _start(settings, metrics, stack)
            if freeze_heap:
                _freeze_heap(metrics)
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
    app.add_exception_handler(redis.RedisError, _redis_error_handler(settings, metrics))
    # Inside the timing middleware: fast-path answers are timed and labelled as well.
    app.add_middleware(AssignFastPath, settings=settings)
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
    # and then the worker thread; the lease has a connection of its own (its CLIENT ID
    # names the holder). No retries: see the module docstring.
    async_client = redis.asyncio.Redis.from_url(
        url,
        socket_timeout=REQUEST_SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        retry=AsyncRetry(NoBackoff(), 0),
    )
    stack.push_async_callback(async_client.aclose)
    # The worker's operations are idempotent (reads, a snapshot write refusing an equal
    # version, a max() reservation, compare-and-set lease scripts): one immediate retry
    # on a broken connection (a socket Redis closed when it restarted) is safe.
    reconnect_once = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    sync_client = redis.Redis.from_url(
        url,
        socket_timeout=WORKER_SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        retry=reconnect_once,
        # Log pages are MiBs: a big receive buffer means few recv calls, each of which
        # needs the GIL back (with 64 KiB reads the worker queues for the GIL behind
        # the event loop hundreds of times per page and falls behind the ingestion).
        socket_read_size=WORKER_READ_BYTES,
    )
    stack.callback(sync_client.close)
    try:  # a single-connection client connects here: a bad password or certificate fails
        lease_client = redis.Redis.from_url(
            url,
            socket_timeout=min(LEASE_SOCKET_TIMEOUT, settings.worker_lock_seconds / 3),
            socket_connect_timeout=CONNECT_TIMEOUT,
            retry=reconnect_once,
            single_connection_client=True,
        )
    except redis.RedisError as exc:
        log.error("start-up refused: Redis at %s unusable: %s", _safe_url(url), exc)
        raise StartupError(f"Redis at {_safe_url(url)} is unusable: {exc}") from None
    stack.callback(lease_client.close)

    # Entries appended here reach this process's worker in memory (see LocalEntries).
    local_entries = LocalEntries()
    repository = ModelRepository(sync_client, settings.model, local_entries)
    try:
        dim = await run_in_threadpool(repository.check_meta, settings.k, settings.dim)
        snapshot = await run_in_threadpool(repository.read_snapshot)
        if embedded is None:
            await run_in_threadpool(_warn_without_persistence, sync_client, url)
    except ModelConfigError as exc:
        log.error("start-up refused: %s", exc)
        raise StartupError(str(exc)) from None
    except redis.RedisError as exc:
        log.error("start-up refused: Redis at %s unusable: %s", _safe_url(url), exc)
        raise StartupError(f"Redis at {_safe_url(url)} is unusable: {exc}") from None

    board = ModelBoard()
    worker = Worker(
        settings,
        repository,
        board,
        metrics,
        WorkerLease(lease_client, settings.model, settings.worker_lock_seconds),
        snapshot=snapshot,
        dim=dim,
        engine_nice=WORKER_NICE if settings.worker_process else 0,
    )
    try:
        # Takes the lease if free and publishes the snapshot (renumbered above every
        # version a crashed worker may have shown), before the first request.
        await run_in_threadpool(worker.begin)
    except redis.RedisError as exc:
        log.error("start-up refused: Redis at %s unusable: %s", _safe_url(url), exc)
        raise StartupError(f"Redis at {_safe_url(url)} is unusable: {exc}") from None
    if snapshot is not None:
        model = board.model
        log.info(
            "restored snapshot version %d (b = %d, iteration %d), served as version %d; role %s",
            snapshot.version,
            snapshot.batch_size,
            snapshot.iteration,
            model.version if model is not None else snapshot.version,
            worker.role,
        )
    seconds = await run_in_threadpool(_warm_up_kernels)
    log.info("kernels loaded in %.2f s", seconds)
    worker.start()
    stack.push_async_callback(run_in_threadpool, worker.stop)
    # With the engine in a child process the worker thread mostly waits: it keeps the
    # default priority (lowered, it could be parked while holding the GIL), the child
    # gets the lower one.
    _tune_worker_thread(settings.model, 0 if settings.worker_process else WORKER_NICE)

    return ServiceContext(
        settings=settings,
        sample_log=AsyncSampleLog(async_client, settings.model, local_entries),
        board=board,
        metrics=metrics,
        worker=worker,
        dim=dim,
        embedded_redis=embedded,
    )


def _warm_up_kernels() -> float:
    """Load the numba kernels of the engine and of the JSON parser; returns seconds."""
    seconds = warm_up()
    parse_json_matrix(b'{"vectors": [[1.0, -2.5e-3], [3, 4E2]]}')
    return seconds


def _freeze_heap(metrics: ServiceMetrics) -> None:
    """Collect, then move every live object out of the garbage collector's generations."""
    gc.collect()
    gc.freeze()
    metrics.gc_frozen_objects.set(gc.get_freeze_count())
    log.info("heap frozen: %d objects out of the garbage collector's scans",
             gc.get_freeze_count())  # fmt: skip


def _tune_worker_thread(model: str, nice: int) -> None:
    """Give the worker thread of ``model`` the niceness ``nice`` and the OS name (Linux).

    The worker's kernels run without the GIL and would take a whole core; on a small
    machine the event loop thread must win the CPU whenever it has a request to serve
    (a loop thread preempted while holding the GIL stalls every thread). Threads the
    worker starts later inherit the value. The OS thread name ``nmbatch-worker`` shows
    it in ``top -H`` and ``/proc``. Elsewhere, or if refused, nothing changes.
    """
    if not hasattr(os, "setpriority"):
        return
    for thread in threading.enumerate():
        tid = thread.native_id
        if thread.name != f"nmbatch-worker-{model}" or tid is None:
            continue
        try:
            if nice > 0:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            with open(f"/proc/self/task/{tid}/comm", "w") as comm:
                comm.write("nmbatch-worker")
        except OSError as exc:
            log.warning("could not lower the worker thread's priority: %s", exc)


def _warn_without_persistence(client: redis.Redis, url: str) -> None:
    """Log a warning if the Redis at ``url`` keeps no append-only file."""
    try:
        config = client.config_get("appendonly")
    except redis.ResponseError:  # CONFIG disabled (managed Redis): nothing to check
        return
    if config.get("appendonly", config.get(b"appendonly")) in ("no", b"no"):
        log.warning(
            "Redis at %s runs without appendonly: accepted samples are lost if it restarts; "
            "run it with --appendonly yes",
            _safe_url(url),
        )


def _redis_error_handler(
    settings: Settings, metrics: ServiceMetrics
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The exception handler of every Redis error raised while handling a request.

    Redis unavailable (down, timing out, loading its data, refusing writes): ``503``
    ``storage-unavailable`` with ``Retry-After`` (``NMBATCH_REDIS_RETRY_SECONDS``). A
    request that wrote to Redis got no ``2xx``: its samples are not acknowledged. Any
    other Redis error is a fault of the service: ``500``.
    """
    retry_after = str(max(1, math.ceil(settings.redis_retry_seconds)))

    async def handle(request: Request, exc: Exception) -> Response:
        if redis_unavailable(exc):
            metrics.redis_errors.labels("request").inc()
            log.warning("Redis unavailable on %s %s: %s", request.method, request.url.path, exc)
            return problem_response(
                503,
                "urn:nmbatch:problem:storage-unavailable",
                "Storage unavailable",
                f"Redis is unavailable ({type(exc).__name__}); nothing from this request is "
                f"acknowledged: retry in {retry_after} s",
                headers={"Retry-After": retry_after},
                retry_after=int(retry_after),
            )
        log.error("Redis error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(
            500,
            "urn:nmbatch:problem:storage-error",
            "Storage error",
            f"Redis refused the operation ({type(exc).__name__}: {exc})"[:300],
        )

    return handle


def _safe_url(url: str) -> str:
    """``url`` without a password."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.rsplit("@", 1)[-1]
        return urlunsplit(parts._replace(netloc=f"***@{netloc}"))
    return url
