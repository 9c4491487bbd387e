"""``GET /assign`` (one vector in the query) and ``POST /assign`` (a batch)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from service.context import Context, assign, off_loop
from service.parsing import parse_query_vector, parse_vectors, read_body
from service.problems import problem_responses
from service.routes.samples import VECTORS_BODY
from service.schemas import AssignMany, AssignOne

router = APIRouter(tags=["assign"])


@router.get(
    "/assign",
    response_model=AssignOne,
    summary="Nearest centroid of one vector",
    responses=problem_responses(409, 422, 503),
)
async def get_assign(
    context: Context,
    vector: str = Query(
        description="The vector's coordinates, comma-separated.", examples=["0.5,1,-2"]
    ),
) -> AssignOne:
    model = await context.require_model()
    X = parse_query_vector(vector, dim=model.dim)
    labels, distances = assign(model, X)
    return AssignOne(version=model.version, cluster=int(labels[0]), distance=float(distances[0]))


@router.post(
    "/assign",
    response_model=AssignMany,
    summary="Nearest centroid of each vector of a batch",
    description="Same bodies as `POST /samples`; nothing is stored.",
    openapi_extra=VECTORS_BODY,
    responses=problem_responses(400, 409, 413, 415, 422, 503),
)
async def post_assign(request: Request, context: Context) -> Response:
    settings = context.settings
    # The model is taken once: every vector of the batch uses the same version.
    model = await context.require_model()
    body = await read_body(request, settings.max_body_bytes)
    X = await run_in_threadpool(
        parse_vectors,
        body,
        request.headers.get("content-type", ""),
        dim=model.dim,
        max_vectors=settings.max_vectors,
    )
    labels, distances = await off_loop(X.size * model.k, assign, model, X)
    payload = {"version": model.version, "clusters": labels, "distances": distances}
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
    )
