"""``GET /healthz`` (alive), ``GET /readyz`` (Redis and worker), ``GET /metrics``.

``/healthz`` and ``/readyz`` never need the API key (orchestrators probe them);
``/metrics`` is a read: it needs the key with ``NMBATCH_API_KEY_READS=true``.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from nmbatch.service.context import Context
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import Health, Readiness
from nmbatch.service.security import OPTIONAL_KEY, require_read_key

router = APIRouter(tags=["monitoring"])

_PING_TIMEOUT = 2.0


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness: Redis reachable and worker alive (503 otherwise)",
    responses={503: {"model": Readiness, "description": "Not ready"}},
)
async def readyz(context: Context) -> Response:
    try:
        await asyncio.wait_for(context.sample_log.client.ping(), _PING_TIMEOUT)
        redis_state = "ok"
    except Exception as exc:  # any failure means not ready; say which
        redis_state = f"{type(exc).__name__}: {exc}"[:200]
    worker = context.worker
    worker_state = worker.phase if worker.error is None else f"failed: {worker.error!r}"[:200]
    ready = redis_state == "ok" and worker.alive()
    body = Readiness(ready=ready, redis=redis_state, worker=worker_state, role=worker.role)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    openapi_extra=OPTIONAL_KEY,
    response_class=Response,
    dependencies=[Depends(require_read_key)],
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
        **problem_responses(401),
    },
)
async def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
