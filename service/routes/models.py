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

from nmbatch.service.context import Name, read_json_body
from nmbatch.service.models import ModelManager, ModelSpec
from nmbatch.service.parsing import JSON
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


SPEC_MAX_BYTES = 16 * 1024
"""Largest ``PUT /models/{name}`` body (413 above): a spec is a few hundred bytes."""


async def read_spec(request: Request) -> ModelSpec:
    """The :class:`ModelSpec` of a ``PUT /models/{name}`` body, read after the key check
    (:func:`~nmbatch.service.context.read_json_body`, at most :data:`SPEC_MAX_BYTES`)."""
    return await read_json_body(request, ModelSpec, SPEC_MAX_BYTES)


SPEC_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": ModelSpec.model_json_schema()}},
    }
}
"""``openapi_extra`` of ``PUT /models/{name}``: the body FastAPI no longer reads itself."""


PUT_REFUSED = (
    "`urn:nmbatch:problem:model-conflict`: the model exists with other settings (member "
    "`current`), or Redis holds data under this name with another k, metric or dimension; "
    "`too-many-models`: NMBATCH_MAX_MODELS named models exist."
)
NOT_OWNED = (
    "`urn:nmbatch:problem:model-not-owned`: the model is another service's default model "
    "(its NMBATCH_MODEL), was created by another service on the same Redis, or Redis holds "
    "data under this name that no registered model owns; only the service that created a "
    "model may replace or delete it, and no service may delete a default model."
)
DELETE_REFUSED = (
    "`urn:nmbatch:problem:confirmation-required`: `confirm` is not the model's name (member "
    "`parameter`); `default-model`: the service's own default model."
)
TOO_LARGE = (
    "Invalid settings, `dimension-too-large` (above NMBATCH_MAX_DIM), or "
    "`urn:nmbatch:problem:model-too-large`: its samples and centroids would not fit the "
    "memory one model may take (NMBATCH_MODEL_MAX_BYTES); members `setting`, "
    "`required_bytes`, `limit_bytes`, `max_samples_fitting`; or "
    "`urn:nmbatch:problem:unsupported-metric`: `metric` cosine on a service whose engine "
    "is the Ray cluster (NMBATCH_RAY_ADDRESS), which runs euclidean only; members `model`, "
    "`metric`, `setting`."
)


@router.put(
    "/models/{name}",
    response_model=ModelInfo,
    summary="Create a named model (or find it with the same settings)",
    description="201 when created (its worker starts at once), 200 when it exists with "
    "the same settings, 409 when they differ. Nothing is stored when refused. The body is "
    "read only once the key is checked, at most 16 KiB.",
    openapi_extra=SPEC_BODY | OPTIONAL_KEY,
    dependencies=[Depends(require_admin_key)],
    responses={
        201: {"model": ModelInfo, "description": "Created"},
        **problem_responses(
            400, 401, 403, 408, 409, 413, 415, 422, 503, 507,
            described={403: NOT_OWNED, 409: PUT_REFUSED, 422: TOO_LARGE},
        ),
    },
)
async def put_model(request: Request, response: Response, name: Name) -> dict[str, Any]:
    spec = await read_spec(request)
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
    "records and retained bases from Redis. Needs `confirm` equal to the name (409 "
    "`confirmation-required` otherwise). Only the service that created a model deletes "
    "it; no service deletes a default model (403 `model-not-owned`, 409 `default-model`).",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_admin_key)],
    responses=problem_responses(
        400, 401, 403, 404, 409, 422, 503, described={403: NOT_OWNED, 409: DELETE_REFUSED}
    ),
)
async def delete_model(
    request: Request,
    name: Name,
    confirm: Annotated[
        str,
        Query(description="The model's name again: the data cannot be recovered."),
    ],
) -> dict[str, Any]:
    if confirm != name:
        raise ProblemError(
            409,
            "confirmation-required",
            f"deleting model '{name}' removes all its data: repeat its name in the query "
            f"parameter 'confirm' (DELETE /models/{name}?confirm={name})",
            title="Confirmation required",
            parameter="confirm",
        )
    removed = await catalog.delete_model(_manager(request), name)
    return {"deleted": name, "keys_removed": removed}
