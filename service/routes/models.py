"""``/models``: create, list, describe and delete models.

A model's own routes (``/models/{name}/samples``, ``/centroids``, ``/assign``,
``/stats``, ``/dashboard``) are the per-model routers mounted under the prefix
(:func:`nmbatch.service.main.create_app`); ``/models/{NMBATCH_MODEL}/...`` is the
default model, the one of the routes without the prefix.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from nmbatch.service.context import Name
from nmbatch.service.models import ModelManager, ModelSpec
from nmbatch.service.problems import ProblemError, problem_responses
from nmbatch.service.security import OPTIONAL_KEY, require_admin_key, require_read_key
from nmbatch.service.usecases import catalog

__all__ = ["router"]

router = APIRouter(tags=["models"])


class ModelStatus(BaseModel):
    role: str = Field(description="'worker' or 'standby' in this process (see /readyz).")
    phase: str = Field(description="Worker phase: replaying, iterating, converged, ...")
    version: int | None = Field(description="Published centroid version (None: none yet).")
    n_samples: int = Field(description="Samples in the worker's store.")
    converged: bool


class ModelInfo(BaseModel):
    name: str
    default: bool = Field(description="True for the service's default model (NMBATCH_MODEL).")
    settings: dict[str, Any] = Field(description="The model's settings, as PUT.")
    max_samples: int | None = Field(
        description="The capacity (retention all) or retention size the model runs with: "
        "its max_samples, or the samples its memory limit holds (None: not planned yet)."
    )
    status: ModelStatus


class ModelList(BaseModel):
    models: list[ModelInfo]


class ModelDeleted(BaseModel):
    deleted: str
    keys_removed: int = Field(description="Redis keys of the model deleted.")


def _manager(request: Request) -> ModelManager:
    return request.app.state.models


PUT_REFUSED = (
    "`urn:nmbatch:problem:model-conflict`: the model exists with other settings (member "
    "`current`), or Redis holds data under this name with another k or dimension; "
    "`too-many-models`: NMBATCH_MAX_MODELS named models exist."
)
TOO_LARGE = (
    "Invalid settings, `dimension-too-large` (above NMBATCH_MAX_DIM), or "
    "`urn:nmbatch:problem:model-too-large`: its samples and centroids would not fit the "
    "memory one model may take (NMBATCH_MODEL_MAX_BYTES); members `setting`, "
    "`required_bytes`, `limit_bytes`, `max_samples_fitting`."
)


@router.put(
    "/models/{name}",
    response_model=ModelInfo,
    summary="Create a named model (or find it with the same settings)",
    description="201 when created (its worker starts at once), 200 when it exists with "
    "the same settings, 409 when they differ. Nothing is stored when refused.",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_admin_key)],
    responses={
        201: {"model": ModelInfo, "description": "Created"},
        **problem_responses(
            400, 401, 409, 422, 503, 507, described={409: PUT_REFUSED, 422: TOO_LARGE}
        ),
    },
)
async def put_model(
    request: Request, response: Response, name: Name, spec: ModelSpec
) -> dict[str, Any]:
    created, document = await catalog.create_model(_manager(request), name, spec)
    response.status_code = 201 if created else 200
    return document


@router.get(
    "/models",
    response_model=ModelList,
    summary="Every model with its settings and status",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_read_key)],
    responses=problem_responses(401, 503),
)
async def list_models(request: Request) -> dict[str, Any]:
    return {"models": await catalog.list_models(_manager(request))}


@router.get(
    "/models/{name}",
    response_model=ModelInfo,
    summary="One model's settings and status",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_read_key)],
    responses=problem_responses(401, 404, 409, 422, 503),
)
async def get_model(request: Request, name: Name) -> dict[str, Any]:
    return await catalog.describe_model(_manager(request), name)


@router.delete(
    "/models/{name}",
    response_model=ModelDeleted,
    summary="Delete a named model and all its data",
    description="Stops its worker and deletes its log, meta, snapshot, lease, idempotency "
    "records and retained bases from Redis. Needs `confirm` equal to the name.",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_admin_key)],
    responses=problem_responses(400, 401, 404, 409, 422, 503),
)
async def delete_model(
    request: Request,
    name: Name,
    confirm: Annotated[
        str | None,
        Query(description="The model's name again: the data cannot be recovered."),
    ] = None,
) -> dict[str, Any]:
    if confirm != name:
        raise ProblemError(
            400,
            "confirmation-required",
            f"deleting model '{name}' removes all its data: repeat its name in the query "
            f"parameter 'confirm' (DELETE /models/{name}?confirm={name})",
            title="Confirmation required",
            parameter="confirm",
        )
    removed = await catalog.delete_model(_manager(request), name)
    return {"deleted": name, "keys_removed": removed}
