"""``GET /assign`` (one vector in the query) and ``POST /assign`` (a batch).

Reads: they need the API key only with ``NMBATCH_API_KEY_READS=true``
(:mod:`service.security`). The nearest-centroid search runs off the event loop once it
touches more than a few ten thousand numbers (``k * d`` for one vector).
"""

from __future__ import annotations

import numpy as np
import orjson
from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from nmbatch.service.context import Context, assign, off_loop, parse_body
from nmbatch.service.parsing import parse_query_vector, read_body
from nmbatch.service.problems import problem_responses
from nmbatch.service.routes.samples import VECTORS_BODY
from nmbatch.service.schemas import AssignMany, AssignOne
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.state import PublishedModel

router = APIRouter(tags=["assign"], dependencies=[Depends(require_read_key)])


@router.get(
    "/assign",
    response_model=AssignOne,
    summary="Nearest centroid of one vector",
    openapi_extra=OPTIONAL_KEY,
    responses=problem_responses(401, 409, 422, 503),
)
async def get_assign(
    context: Context,
    vector: str = Query(
        description="The vector's coordinates, comma-separated.", examples=["0.5,1,-2"]
    ),
) -> AssignOne:
    model = await context.require_model()
    X = parse_query_vector(vector, dim=model.dim)
    labels, distances = await off_loop(model.centroids.size, assign, model, X)
    return AssignOne(version=model.version, cluster=int(labels[0]), distance=float(distances[0]))


@router.post(
    "/assign",
    response_model=AssignMany,
    summary="Nearest centroid of each vector of a batch",
    description="Same bodies as `POST /samples`; nothing is stored.",
    openapi_extra=VECTORS_BODY | OPTIONAL_KEY,
    responses=problem_responses(400, 401, 408, 409, 413, 415, 422, 503),
)
async def post_assign(request: Request, context: Context) -> Response:
    settings = context.settings
    # The model is taken once: every vector of the batch uses the same version.
    model = await context.require_model()
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout_seconds)
    X = await parse_body(  # binary bodies on the loop, JSON in the thread pool
        body,
        request.headers.get("content-type", ""),
        dim=model.dim,
        max_vectors=settings.max_vectors,
    )
    del body
    # Search and serialisation (100,000 labels and distances) both off the event loop.
    document = await off_loop(X.size * model.k, assign_json, model, X)
    return Response(document, media_type="application/json")


def assign_json(model: PublishedModel, X: np.ndarray) -> bytes:
    """The :class:`AssignMany` document of ``X`` (``(n, d)`` float32) under ``model``."""
    labels, distances = assign(model, X)
    payload = {"version": model.version, "clusters": labels, "distances": distances}
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
