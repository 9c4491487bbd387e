"""Start-up of one app: Redis, and each model's checks, worker and handle.

:func:`start_redis` starts the embedded ``redis-server`` (only when ``NMBATCH_REDIS_URL``
is unset) and the request handlers' async client. :func:`start_model` starts one model
(the default one and every named one alike, called by
:class:`~nmbatch.service.models.ModelManager`), in this order (its exit stack stops them
in the reverse order): its Redis clients, the start-up checks (a ``k``, metric or
dimension that contradicts Redis stops here), the worker lease and the restored snapshot
(published at once, so ``GET /centroids`` answers before the log replay ends), the
kernels' warm-up (:mod:`nmbatch.service.runtime`), the worker thread, and, once the
dimension is known,
the model's capacity (:class:`~nmbatch.service.models.capacity.ModelCapacity`: logged,
and the embedded Redis's ``maxmemory`` set to match). On exit the worker writes a last
snapshot and releases the lease. The model's :class:`ModelHandle` reaches its worker
only as the use cases' :class:`~nmbatch.service.usecases.serving.WorkerPort`.

Redis clients: every client has short socket timeouts and no automatic retries (a
retried transaction could log a batch twice, and a request must fail fast rather than
hang); Redis errors during a request are answered by
:mod:`nmbatch.service.redis_errors`. A Redis that cannot be used at start-up (refused
connection, bad password or certificate) or settings that contradict it raise
:class:`StartupError`, with any password in the URL masked.
"""

from __future__ import annotations

import functools
import logging
import re
from contextlib import AsyncExitStack
from urllib.parse import unquote, urlsplit, urlunsplit

import numpy as np
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from starlette.concurrency import run_in_threadpool

from nmbatch.engine.seeding.given import given_centroids
from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.models.capacity import ModelCapacity
from nmbatch.service.models.manager import StartupError
from nmbatch.service.runtime import tune_worker_thread, warm_up_kernels
from nmbatch.service.state import ModelBoard
from nmbatch.service.storage import (
    AsyncSampleLog,
    LocalEntries,
    ModelConfigError,
    ModelRepository,
    WorkerLease,
)
from nmbatch.service.usecases.serving import ModelHandle
from nmbatch.service.worker import Worker
from nmbatch.service.worker.retention import retention_size

__all__ = [
    "CONNECT_TIMEOUT",
    "LEASE_SOCKET_TIMEOUT",
    "REQUEST_SOCKET_TIMEOUT",
    "WORKER_READ_BYTES",
    "WORKER_SOCKET_TIMEOUT",
    "StartupError",
    "safe_url",
    "start_model",
    "start_redis",
]

log = logging.getLogger("service")

REQUEST_SOCKET_TIMEOUT = 5.0
"""Seconds a request handler waits for a Redis reply before answering 503."""
CONNECT_TIMEOUT = 2.0
"""Seconds to open a connection to Redis."""
WORKER_SOCKET_TIMEOUT = 10.0
"""Seconds the worker waits for a Redis reply (log pages of up to 32 MiB)."""
WORKER_READ_BYTES = 4 << 20
"""Receive buffer of the worker's Redis connection (bytes read per ``recv``)."""
LEASE_SOCKET_TIMEOUT = 2.0
"""Seconds the lease connection waits for a reply (it renews every third of the expiry)."""


async def start_redis(
    settings: Settings, stack: AsyncExitStack
) -> tuple[str, redis.asyncio.Redis, EmbeddedRedis | None]:
    """Start the embedded Redis (``NMBATCH_REDIS_URL`` unset) and the request handlers'
    async client, registered on ``stack``; returns the URL, the client and the embedded
    Redis (None with an external one)."""
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
        log.info("embedded Redis at %s, data in %s", safe_url(url), embedded.data_dir)

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
    return url, async_client, embedded


async def start_model(
    settings: Settings,
    metrics: ServiceMetrics,
    stack: AsyncExitStack,
    *,
    url: str,
    async_client: redis.asyncio.Redis,
    embedded: EmbeddedRedis | None,
    memory: tuple[int, str],
    redis_needs: dict[str, int],
    warm_up: bool = True,
    capacity_setting: str = "NMBATCH_MAX_SAMPLES",
) -> ModelHandle:
    """Start one model (``settings.model``) on the Redis at ``url``; returns its handle.

    Its own Redis clients (the worker's and the lease's), start-up checks, worker (and
    engine process), all registered on ``stack``; ``async_client`` is shared by the
    request handlers of every model. ``memory``: bytes (and their origin) its capacity
    is derived from when ``max_samples`` is unset. ``redis_needs``: shared by the models
    of one app, so the embedded Redis's ``maxmemory`` covers them all. ``warm_up``: load
    the kernels first (once per process). ``capacity_setting``: what a ``507`` tells
    the client to raise.
    """
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
        raise _unusable(url, exc) from None
    stack.callback(lease_client.close)

    # Entries appended here reach this process's worker in memory (see LocalEntries).
    local_entries = LocalEntries()
    repository = ModelRepository(sync_client, settings.model, local_entries)
    try:
        dim = await run_in_threadpool(
            repository.check_meta, settings.k, settings.dim, settings.metric
        )
        settings = await run_in_threadpool(reclustered_settings, settings, repository)
        seed, dim = await run_in_threadpool(model_seed, settings, repository, dim)
        snapshot = await run_in_threadpool(repository.read_snapshot)
        if embedded is None and warm_up:  # once per process
            await run_in_threadpool(_warn_without_persistence, sync_client, url)
    except ModelConfigError as exc:
        log.error("start-up refused: %s", exc)
        raise StartupError(str(exc)) from None
    except redis.RedisError as exc:
        raise _unusable(url, exc) from None

    board = ModelBoard()
    worker = Worker(
        settings,
        repository,
        board,
        metrics,
        WorkerLease(lease_client, settings.model, settings.worker_lock_seconds),
        snapshot=snapshot,
        dim=dim,
        engine_nice=settings.engine_nice if settings.worker_process else 0,
        retention_size=functools.partial(
            retention_size, settings, memory=memory, with_redis=embedded is not None
        ),
        redis_url=url,
        seed=seed,
    )
    try:
        # Takes the lease if free and publishes the snapshot (renumbered above every
        # version a crashed worker may have shown), before the first request.
        await run_in_threadpool(worker.begin)
    except redis.RedisError as exc:
        raise _unusable(url, exc) from None
    if snapshot is not None:
        model = board.model
        log.info(
            "restored snapshot version %d (b = %d, iteration %d), served as version %d; role %s",
            snapshot.model.version,
            snapshot.model.state.batch_size,
            snapshot.model.state.iteration,
            model.version if model is not None else snapshot.model.version,
            worker.role,
        )
    if warm_up:
        seconds = await run_in_threadpool(warm_up_kernels)
        log.info("kernels loaded in %.2f s", seconds)
    worker.start()
    stack.push_async_callback(run_in_threadpool, worker.stop)
    # With the engine in a child process the worker thread mostly waits: it keeps the
    # default priority (lowered, it could be parked while holding the GIL), the child
    # gets the lower one.
    tune_worker_thread(settings.model, 0 if settings.worker_process else settings.engine_nice)

    sample_log = AsyncSampleLog(async_client, settings.model, local_entries)
    planner = ModelCapacity(
        settings, sample_log, metrics, memory=memory, embedded=embedded, redis_needs=redis_needs
    )
    planner.setting = capacity_setting
    handle = ModelHandle(settings, sample_log, board, metrics, worker, planner, dim)
    if dim is not None:  # else planned when the first batch fixes the dimension
        try:
            await planner.plan(dim)
        except redis.RedisError as exc:
            raise _unusable(url, exc) from None
    return handle


def reclustered_settings(settings: Settings, repository: ModelRepository) -> Settings:
    """``settings`` with the ``k`` a re-clustering gave the model, if one did (the
    default model's ``NMBATCH_K`` no longer applies then, nor its ``NMBATCH_INIT_FILE``:
    it seeds ``k-means++``)."""
    k = repository.reclustered_k()
    if k is None or k == settings.k:
        return settings
    log.warning("model '%s' was re-clustered to k = %d: NMBATCH_K = %d (and "
                "NMBATCH_INIT_FILE) no longer apply to it", settings.model, k,
                settings.k)  # fmt: skip
    init = "k-means++" if settings.init == "given" else settings.init
    return settings.model_copy(update={"k": k, "init": init, "init_file": None})


def model_seed(
    settings: Settings, repository: ModelRepository, dim: int | None
) -> tuple[np.ndarray | None, int | None]:
    """The seed of a seeded model (``init="given"``; ``(k, d)`` float32) and its
    dimension: the one Redis keeps; for the default model at its first start, the
    centroids of ``NMBATCH_INIT_FILE`` (checked as ``PUT`` checks ``init``:
    :func:`~nmbatch.engine.seeding.given.given_centroids`), kept in Redis then, which fix
    the dimension if nothing did. Raises :class:`ModelConfigError` if there is none, the
    file is not usable, or it holds other centroids than those the model was seeded with.
    """
    if settings.init != "given":
        return None, dim
    kept = repository.read_seed()
    path = settings.init_file
    if path is None:
        if kept is None:
            raise ModelConfigError(f"model '{settings.model}' has init=given but Redis keeps "
                                   "no seed centroids for it (NMBATCH_INIT_FILE)")  # fmt: skip
        return kept, dim
    try:
        given = given_centroids(np.load(path, allow_pickle=False), settings.k, dim,
                                settings.metric)  # fmt: skip
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"NMBATCH_INIT_FILE={path}: {exc}") from None
    if kept is not None and not np.array_equal(kept, given):
        raise ModelConfigError(
            f"NMBATCH_INIT_FILE={path} holds other centroids than model "
            f"'{settings.model}' was seeded with (kept in Redis): restore the file, or use "
            "another NMBATCH_MODEL for a new model"
        )
    if dim is None:  # the seed fixes the dimension, as a first batch would
        dim = repository.check_meta(settings.k, given.shape[1], settings.metric)
    return repository.keep_seed(given), dim


def _unusable(url: str, exc: redis.RedisError) -> StartupError:
    """Log that the Redis at ``url`` cannot be used, and the error to raise for it.

    The log has the details (the URL masked by :func:`safe_url`, Redis's message); the
    error, whose text may reach an HTTP client (a ``409`` to ``PUT /models/{name}``), names
    only the kind of failure: no host, port or URL.
    """
    log.error("start-up refused: Redis at %s unusable: %s", safe_url(url), _masked(str(exc), url))
    return StartupError(
        f"Redis at {safe_url(url)} is unusable: {_masked(str(exc), url)}",
        public=f"Redis is unusable ({type(exc).__name__}); the service's log has the details",
    )


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
            safe_url(url),
        )


_SECRET_PARAMETER = re.compile(r"pass|secret|token|auth|credential|username", re.IGNORECASE)


def safe_url(url: str) -> str:
    """``url`` with every credential redis-py would use masked as ``***``.

    The user information (``redis://user:password@``, ``redis://:password@``,
    ``rediss://``, ``unix://user:password@/path``, and a lone ``redis://name@``, which some
    write for a password) becomes ``***@``; query parameters that carry one
    (``?password=``, ``?username=``, any name with pass, secret, token, auth or
    credential) keep their names with the value ``***``; the rest is left as written.
    A URL that cannot be parsed is shown as its scheme only.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = "***@" + netloc.rsplit("@", 1)[1]
        fields = []
        for field in parts.query.split("&") if parts.query else []:
            name, equals, _ = field.partition("=")
            secret = _SECRET_PARAMETER.search(unquote(name))
            fields.append(f"{name}{equals}***" if secret else field)
        return urlunsplit(parts._replace(netloc=netloc, query="&".join(fields)))
    except ValueError:
        return f"{url.split(':', 1)[0][:16]}://***"


def _masked(text: str, url: str) -> str:
    """``text`` (an error message) without the password of ``url`` should it quote it."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return text
    return text.replace(password, "***") if password else text
