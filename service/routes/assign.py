"""``GET /assign`` (one vector in the query) and ``POST /assign`` (a batch).

Reads: they need the API key only with ``NMBATCH_API_KEY_READS=true``
(:mod:`service.security`). The nearest-centroid search runs off the event loop once it
touches more than a few ten thousand numbers (``k * d`` for one vector).

``GET /assign`` has one implementation, the query's vector parsed by
:func:`nmbatch.service.parsing.parse_query_vector` then the use case
:func:`nmbatch.service.usecases.reads.assign_one_json`: the route below calls both, and
so does :mod:`service.fastpath`, which answers the plain requests without FastAPI's
layers.
Any other method on ``/assign`` is a ``405`` problem with ``Allow: GET, POST``
(:data:`OTHER_METHODS`).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from nmbatch.service.context import ModelDep, VersionQuery, parse_body
from nmbatch.service.openapi import VECTORS_BODY, VECTORS_REFUSED, VERSION_NOT_KEPT
from nmbatch.service.parsing import parse_query_vector, read_body
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import AssignMany, AssignOne
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.usecases import reads, versions
from nmbatch.service.usecases.serving import off_loop

__all__ = ["MODEL_OTHER_METHODS", "OTHER_METHODS", "router"]

router = APIRouter(tags=["assign"], dependencies=[Depends(require_read_key)])

QUERY_VECTOR_REFUSED = (
    "The vector is refused. `type` names the fault: `urn:nmbatch:problem:wrong-dimension` "
    "when it has another number of coordinates than the model's centroids (members "
    "`expected_dim` and `got_dim`), `non-numeric`, `non-finite`, `not-a-matrix` (not "
    "comma-separated numbers), `invalid-request` (no `vector` parameter), and under "
    "`metric=cosine` `zero-vector` (a zero vector has no direction; member `row`, 0)."
)


@router.get(
    "/assign",
    response_model=AssignOne,
    summary="Nearest centroid of one vector",
    openapi_extra=OPTIONAL_KEY,
    responses=problem_responses(
        401,
        404,
        409,
        422,
        503,
        described={404: VERSION_NOT_KEPT, 422: QUERY_VECTOR_REFUSED},
    ),
)
async def get_assign(
    handle: ModelDep,
    vector: str = Query(
        description="The vector's coordinates, comma-separated.", examples=["0.5,1,-2"]
    ),
    version: VersionQuery = None,
) -> Response:
    model = await versions.read_model(handle, version)
    X = parse_query_vector(vector, dim=model.state.dim)  # one vector: on the loop
    document = await off_loop(
        model.state.centroids.size, reads.assign_one_json, model, X, handle.settings.metric
    )
    return Response(document, media_type="application/json")


@router.post(
    "/assign",
    response_model=AssignMany,
    summary="Nearest centroid of each vector of a batch",
    description="Same bodies as `POST /samples`; nothing is stored.",
    openapi_extra=VECTORS_BODY | OPTIONAL_KEY,
    responses=problem_responses(
        400,
        401,
        404,
        408,
        409,
        413,
        415,
        422,
        503,
        described={404: VERSION_NOT_KEPT, 422: VECTORS_REFUSED},
    ),
)
async def post_assign(request: Request, handle: ModelDep, version: VersionQuery = None) -> Response:
    settings = handle.settings
    # The model is taken once: every vector of the batch uses the same version.
    model = await versions.read_model(handle, version)
    body = await read_body(request, settings.max_body_bytes, settings.body_timeout_seconds)
    X = await parse_body(  # binary bodies on the loop, JSON in the thread pool
        body,
        request.headers.get("content-type", ""),
        dim=model.state.dim,
        max_vectors=settings.max_vectors,
    )
    del body
    # Search and serialisation (100,000 labels and distances) both off the event loop.
    document = await off_loop(
        X.size * model.state.k, reads.assign_json, model, X, settings.metric
    )
    return Response(document, media_type="application/json")


async def _method_not_allowed(request: Request) -> Response:
    raise HTTPException(405, headers={"Allow": "GET, POST"})


class _OtherMethods(Route):
    """Every method on ``/assign`` but ``GET`` and ``POST``: a ``405`` naming both.

    Starlette answers a method that no route of a path takes with the ``Allow`` header
    of the path's first route only (``GET``). Added to the app's routes after the
    routers (both methods match there first), this route matches ``/assign`` whatever
    the method (its own ``methods`` are not checked) and its endpoint raises the ``405``
    that the problem handler renders. It names itself the request's route, so the
    request metrics label these answers ``/assign``.
    """

    def __init__(self, path: str = "/assign") -> None:
        super().__init__(path, _method_not_allowed, include_in_schema=False)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is Match.NONE:
            return match, child_scope
        child_scope["route"] = self
        return Match.FULL, child_scope

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


OTHER_METHODS = _OtherMethods()
"""The route answering the methods ``/assign`` does not take (``405``, ``Allow: GET, POST``)."""
MODEL_OTHER_METHODS = _OtherMethods("/models/{name}/assign")
"""The same for a named model's ``/models/{name}/assign``."""
