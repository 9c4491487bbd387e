"""``GET /healthz`` (alive), ``GET /readyz`` (Redis and worker), ``GET /metrics``.

``/healthz`` and ``/readyz`` never need the API key (orchestrators probe them);
``/metrics`` is a read: it needs the key with ``NMBATCH_API_KEY_READS=true``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from nmbatch.service.context import ModelDep
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import Health, Readiness
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.usecases import reads

router = APIRouter(tags=["monitoring"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness: Redis reachable and worker alive (503 otherwise)",
    responses={503: {"model": Readiness, "description": "Not ready"}},
)
async def readyz(handle: ModelDep) -> Response:
    body = await reads.readiness(handle)
    return JSONResponse(body.model_dump(), status_code=200 if body.ready else 503)


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
