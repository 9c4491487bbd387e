"""``GET /versions``, ``POST /pin``, ``DELETE /pin``: a model's kept versions and its pin.

Mounted like the other per-model routers: under ``/models/{name}`` and, for the default
model, without the prefix. Listing is a read (scope ``read`` with
``NMBATCH_API_KEY_READS=true``); pinning and unpinning change what every user of the
model is served, so they need scope ``admin``, as ``PUT`` and ``DELETE /models/{name}``
do. ``?version=`` of ``/centroids`` and ``/assign`` is in their own routers.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path, Request

from nmbatch.service.context import ModelDep, read_json_body
from nmbatch.service.openapi import VERSION_NOT_KEPT
from nmbatch.service.parsing import JSON
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import VERSION_MAX, KeptVersion, Pin, PinRequest, Versions
from nmbatch.service.security import OPTIONAL_KEY, require_admin_key, require_read_key
from nmbatch.service.usecases import versions

__all__ = ["PIN_MAX_BYTES", "router"]

router = APIRouter(tags=["versions"])

PIN_MAX_BYTES = 1024
"""Largest ``POST /pin`` body (413 above): ``{"version": V}`` is a few bytes."""


@router.get(
    "/versions",
    response_model=Versions,
    summary="The kept versions",
    description="The versions kept in Redis, oldest first: one per snapshot written, at "
    "most `bound` (NMBATCH_KEEP_VERSIONS, NMBATCH_KEEP_VERSIONS_BYTES), the pinned one "
    "never forgotten. `GET centroids?version=V` and `GET assign?version=V` read one.",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_read_key)],
    responses=problem_responses(401, 503),
)
async def get_versions(handle: ModelDep) -> dict[str, Any]:
    return await versions.list_versions(handle)


@router.get(
    "/versions/{version}",
    response_model=KeptVersion,
    summary="One kept version",
    description="A kept version as `GET versions` lists it, with its `identities`: how "
    "its clusters relate to those of the version before it.",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_read_key)],
    responses=problem_responses(401, 404, 422, 503, described={404: VERSION_NOT_KEPT}),
)
async def get_version(
    handle: ModelDep, version: int = Path(ge=1, le=VERSION_MAX, description="A kept version.")
) -> dict[str, Any]:
    return await versions.version_summary(handle, version)


@router.post(
    "/pin",
    response_model=Pin,
    summary="Pin a kept version",
    description="Reads (`/centroids`, `/assign`, the dashboard) serve this version while "
    "training goes on, until `DELETE pin`; persisted in Redis (a restart keeps it; other "
    'processes follow within a few seconds). Body `{"version": V}`, V a kept version; '
    "refused (nothing changed) otherwise.",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": PinRequest.model_json_schema()}},
        }
    }
    | OPTIONAL_KEY,
    dependencies=[Depends(require_admin_key)],
    responses=problem_responses(
        400, 401, 404, 408, 413, 415, 422, 503, described={404: VERSION_NOT_KEPT}
    ),
)
async def post_pin(request: Request, handle: ModelDep) -> dict[str, Any]:
    body = await read_json_body(request, PinRequest, PIN_MAX_BYTES)
    return await versions.pin(handle, body.version)


@router.delete(
    "/pin",
    response_model=Pin,
    summary="Follow the newest version again",
    description="Lifts the pin (if any): reads serve the newest version again.",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_admin_key)],
    responses=problem_responses(401, 503),
)
async def delete_pin(handle: ModelDep) -> dict[str, Any]:
    return await versions.unpin(handle)
