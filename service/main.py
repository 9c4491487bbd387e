"""The FastAPI app: ``create_app(settings)`` assembles routes, errors and the lifespan.

What the app is made of, and where each part lives:

- the lifespan starts Redis (:func:`nmbatch.service.bootstrap.start_redis`) and the one
  model registry (:class:`nmbatch.service.models.ModelManager`, ``app.state.models``),
  which starts the default model and then the named ones, each through
  :func:`nmbatch.service.bootstrap.start_model`; for the server process it then freezes
  the heap (:func:`nmbatch.service.runtime.freeze_heap`);
- errors are RFC 9457 problem details (:mod:`nmbatch.service.problems`), Redis errors
  ``503``/``500`` problems (:mod:`nmbatch.service.redis_errors`);
- pure ASGI middlewares: the request's id and model for the log lines
  (:mod:`nmbatch.service.logs`) around its trace span when ``NMBATCH_TRACING`` is on
  (:mod:`nmbatch.service.tracing`) around request timing (:mod:`nmbatch.service.metrics`) around
  admission control (the concurrency limit and the in-flight body budget,
  :mod:`nmbatch.service.admission`) around the fast path of ``GET /assign``
  (:mod:`nmbatch.service.fastpath`);
- the routers of :mod:`nmbatch.service.routes`. The per-model ones (samples, centroids,
  assign, stats, versions, dashboard) are mounted twice: without a prefix for the default
  model, and under ``/models/{name}`` (:data:`nmbatch.service.context.MODEL_PREFIX`); the same
  handlers, whose model dependency (:func:`nmbatch.service.context.get_model`) looks the
  model up in the registry. The OpenAPI document states the app's limits (a named
  model's largest dimension; with ``NMBATCH_DIM`` set, the vectors' length).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import redis
from fastapi import Depends, FastAPI
from starlette.types import Scope

from nmbatch.service import runtime
from nmbatch.service.admission import AdmissionControl
from nmbatch.service.bootstrap import (
    REQUEST_SOCKET_TIMEOUT,
    StartupError,
    start_model,
    start_redis,
)
from nmbatch.service.config import Settings
from nmbatch.service.context import MODEL_PREFIX, model_path
from nmbatch.service.fastpath import AssignFastPath
from nmbatch.service.keys import load_keys
from nmbatch.service.logs import MODEL, RequestContext
from nmbatch.service.metrics import RequestTimingMiddleware, ServiceMetrics
from nmbatch.service.models import ModelManager
from nmbatch.service.openapi import with_dimension, with_key_refusals, with_model_limits
from nmbatch.service.problems import install_problem_handlers, problem_responses
from nmbatch.service.redis_errors import redis_error_handler
from nmbatch.service.routes import (
    assign,
    centroids,
    clusters,
    dashboard,
    events,
    health,
    models,
    samples,
    stats,
    versions,
)
from nmbatch.service.storage.capacity import memory_limit
from nmbatch.service.tracing import TracingMiddleware
from nmbatch.service.usecases.events import StreamSlots

__all__ = ["REQUEST_SOCKET_TIMEOUT", "StartupError", "create_app"]

PER_MODEL_ROUTES = (samples, centroids, assign, stats, versions, events, clusters, dashboard)
"""The routers of one model: mounted for the default model and under ``/models/{name}``."""


def create_app(settings: Settings | None = None, *, freeze_heap: bool = False) -> FastAPI:
    """Build the app; nothing starts until its lifespan runs (uvicorn, TestClient).

    ``freeze_heap``: once started, collect and freeze the heap
    (:mod:`nmbatch.service.runtime`); for the server process, not for a test process
    that builds many apps.
    """
    settings = settings if settings is not None else Settings()
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            url, client, embedded = await start_redis(settings, stack)
            start = partial(start_model, url=url, async_client=client, embedded=embedded)
            manager = ModelManager(
                settings, metrics, start, client, memory_limit(), with_redis=embedded is not None
            )
            stack.push_async_callback(manager.aclose)
            await manager.start_all()  # the default model, then every registered one
            app.state.models = manager
            if freeze_heap:
                runtime.freeze_heap(metrics)
            try:
                yield
            finally:
                app.state.models = None

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
    app.state.keys = load_keys(settings)  # KeyRingError on an unusable key or key file
    app.state.metrics = metrics
    app.state.models = None
    app.state.event_streams = StreamSlots(settings.events_max_connections)
    install_problem_handlers(app)

    def handoff_short(scope: Scope, incoming: int) -> tuple[int, int] | None:
        """The hand-off shortfall of the model the request ``scope`` writes to, the one
        :class:`RequestContext` named (:data:`MODEL`), as
        :meth:`~nmbatch.service.usecases.serving.ModelHandle.handoff_short` gives it; None
        while the app starts or when the model does not run here (the route answers that)."""
        manager, name = app.state.models, MODEL.get()
        running = manager.running.get(name) if manager is not None and name else None
        return None if running is None else running.handle.handoff_short(incoming)

    app.add_exception_handler(redis.RedisError, redis_error_handler(settings, metrics))
    # Inside the timing middleware: fast-path answers are timed and labelled as well.
    app.add_middleware(AssignFastPath, settings=settings)
    # Past the concurrency limit or the body budget: 503 before any route (timed too).
    app.add_middleware(AdmissionControl, settings=settings, handoff_short=handoff_short)
    app.add_middleware(RequestTimingMiddleware, metrics=metrics)
    if settings.tracing != "off":  # a span per request, inside the request's context
        app.add_middleware(TracingMiddleware)
    # Outermost: the request id and the model of every log line the request causes.
    app.add_middleware(
        RequestContext,
        default_model=settings.model,
        model_roots=frozenset(
            route.path.split("/")[1]
            for module in PER_MODEL_ROUTES
            for route in module.router.routes
        ),
    )
    for module in (
        samples, centroids, assign, stats, versions, events, clusters, health, dashboard,
        models,
    ):  # fmt: skip
        app.include_router(module.router)
    # A model's own routes: the same routers under /models/{name} (the dashboard too:
    # /models/{name}/dashboard, whose page asks for its files and data relative to its
    # own address).
    for module in PER_MODEL_ROUTES:
        app.include_router(
            module.router,
            prefix=MODEL_PREFIX,
            dependencies=[Depends(model_path)],
            responses=problem_responses(404, 422),
        )
    # After the routers: the methods /assign does not take (405, Allow: GET, POST).
    app.router.routes += [assign.OTHER_METHODS, assign.MODEL_OTHER_METHODS]
    app.openapi = _openapi_of(app, settings)  # type: ignore[method-assign]
    return app


def _openapi_of(app: FastAPI, settings: Settings) -> Callable[[], dict[str, Any]]:
    """``app.openapi`` whose document lists the 401/403 answers of every operation that
    takes a key and states this app's limits: a named model's largest dimension, and with
    ``NMBATCH_DIM`` set every vectors body's length."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = with_key_refusals(FastAPI.openapi(app))
            document = with_model_limits(document, settings.max_dim)
            if settings.dim is not None:
                document = with_dimension(document, settings.dim)
            app.openapi_schema = document
        return app.openapi_schema

    return openapi
