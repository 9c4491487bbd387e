"""``GET /centroids``: the published centroids as JSON or ``.npy``, with ETag."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from nmbatch.service.context import ModelDep, VersionQuery, etag_matches, wants_npy
from nmbatch.service.openapi import VERSION_NOT_KEPT
from nmbatch.service.parsing import NPY
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import Centroids
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.usecases import serving, versions
from nmbatch.service.usecases.serving import off_loop

router = APIRouter(tags=["centroids"], dependencies=[Depends(require_read_key)])


@router.get(
    "/centroids",
    response_model=Centroids,
    summary="Current centroids",
    openapi_extra=OPTIONAL_KEY,
    description=(
        "JSON by default; `Accept: application/x-npy` gives the (k, d) float32 array. "
        "`ETag` is the version: send it in `If-None-Match` to get `304` while unchanged. "
        "The pinned version while one is pinned (POST pin); `?version=V`: a kept version."
    ),
    responses={
        200: {"content": {NPY: {"schema": {"type": "string", "format": "binary"}}}},
        304: {"description": "Not modified (same version)"},
        **problem_responses(401, 404, 409, 422, 503, described={404: VERSION_NOT_KEPT}),
    },
)
async def get_centroids(
    request: Request, handle: ModelDep, version: VersionQuery = None
) -> Response:
    model = await versions.read_model(handle, version)
    etag = f'"{model.version}"'
    headers = {"ETag": etag, "Vary": "Accept", "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    size = model.state.centroids.size
    if wants_npy(request.headers.get("accept")):
        body = await off_loop(size, serving.centroids_npy, model)
        return Response(body, media_type=NPY, headers=headers)
    settings = handle.settings
    body = await off_loop(
        size, serving.centroids_json, model, settings.retention, settings.metric
    )
    return Response(body, media_type="application/json", headers=headers)
