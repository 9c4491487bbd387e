"""Redis errors met while handling a request, as problem answers (``503`` or ``500``).

Every Redis client of the service has short socket timeouts and no automatic retries
(:mod:`nmbatch.service.bootstrap`): a request fails fast rather than hang. An error that
means "Redis is unavailable" (connection refused or lost, timeout, loading, read-only,
MISCONF: :func:`nmbatch.service.storage.redis_unavailable`) becomes a ``503``
``storage-unavailable`` problem with ``Retry-After`` in every route; requests that need
no Redis (``GET /centroids``, ``/assign``) go on answering from memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

from fastapi import Request
from starlette.responses import Response

from nmbatch.service.config import Settings
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.problems import ProblemError, problem_response
from nmbatch.service.storage import redis_unavailable

__all__ = ["redis_error_handler", "redis_problem"]

log = logging.getLogger("service")


def redis_problem(
    exc: Exception, settings: Settings, metrics: ServiceMetrics, where: str
) -> ProblemError:
    """The problem a Redis error met while handling the request ``where`` answers.

    Redis unavailable (down, timing out, loading its data, refusing writes): ``503``
    ``storage-unavailable`` with ``Retry-After`` (``NMBATCH_REDIS_RETRY_SECONDS``),
    counted in ``nmbatch_redis_unavailable{where="request"}``. A request that wrote to
    Redis got no ``2xx``: its samples are not acknowledged. Any other Redis error is a
    fault of the service: ``500`` ``storage-error``.
    """
    retry_after = str(max(1, math.ceil(settings.redis_retry_seconds)))
    if redis_unavailable(exc):
        metrics.redis_errors.labels("request").inc()
        log.warning("Redis unavailable on %s: %s", where, exc)
        return ProblemError(
            503,
            "storage-unavailable",
            f"Redis is unavailable ({type(exc).__name__}); nothing from this request is "
            f"acknowledged: retry in {retry_after} s",
            title="Storage unavailable",
            headers={"Retry-After": retry_after},
            retry_after=int(retry_after),
        )
    log.error("Redis error on %s", where, exc_info=exc)
    return ProblemError(
        500,
        "storage-error",
        f"Redis refused the operation ({type(exc).__name__}); the service's log has the "
        "details",
        title="Storage error",
    )


def redis_error_handler(
    settings: Settings, metrics: ServiceMetrics
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The exception handler of every Redis error raised while handling a request
    (:func:`redis_problem`)."""

    async def handle(request: Request, exc: Exception) -> Response:
        problem = redis_problem(exc, settings, metrics, f"{request.method} {request.url.path}")
        return problem_response(
            problem.status,
            "urn:nmbatch:problem:" + problem.slug,
            problem.title,
            problem.detail,
            headers=problem.headers or None,
            **problem.extensions,
        )

    return handle
