"""``/models``: create, list, describe and delete models.

A model's own routes (``/models/{name}/samples``, ``/centroids``, ``/assign``,
``/stats``, ``/dashboard``) are the per-model routers mounted under the prefix
(:func:`nmbatch.service.main.create_app`); ``/models/{NMBATCH_MODEL}/...`` is the
default model, the one of the routes without the prefix.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from nmbatch.service.context import Name, parse_body, read_json_body
from nmbatch.service.models import ModelManager, ModelSpec
from nmbatch.service.parsing import JSON, NPY, media_type, read_body
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


SPEC_MAX_BYTES = 1 << 20
"""Largest JSON ``PUT /models/{name}`` body (413 above): a spec is a few hundred bytes,
its ``init`` as a list of lists up to some 50,000 numbers; larger centroids travel as an
npy body (bounded by ``NMBATCH_MAX_BODY_BYTES``, parsed in place)."""

_SPEC_FIELDS = {n: (f.annotation, f) for n, f in ModelSpec.model_fields.items() if n != "init"}
ModelRequest = create_model(  # ModelSpec, with init also a (k, dim) list of lists
    "ModelRequest",
    __config__=ConfigDict(extra="forbid", allow_inf_nan=False),
    init=(
        ModelSpec.model_fields["init"].annotation | list[list[float]],
        Field("k-means++", description="A seeding method, or the initial centroids "
              "(k lists of dim numbers; the model's init is then 'given')."),
    ),
    **_SPEC_FIELDS,  # type: ignore[call-overload]
)


def _spec(values: dict[str, Any], where: str) -> ModelSpec:
    """:class:`ModelSpec` of ``values``, its refusal a 422 naming the fields under
    ``where`` (``body`` or ``query``)."""
    try:
        return ModelSpec.model_validate(values)
    except ValidationError as exc:
        raise RequestValidationError(
            [e | {"loc": (where, *e["loc"])} for e in exc.errors(include_input=False)]
        ) from None


async def read_spec(request: Request) -> tuple[ModelSpec, object]:
    """The :class:`ModelSpec` of a ``PUT /models/{name}`` request and its initial
    centroids (None: none), read after the key check.

    JSON (:func:`~nmbatch.service.context.read_json_body`, at most
    :data:`SPEC_MAX_BYTES`): the spec, ``init`` a method or the centroids as a list of
    lists. ``application/x-npy``: the centroids ``(k, dim)`` as the body (the capped,
    timed reader of ``POST /samples``), ``k`` and ``dim`` their shape, the other fields
    as query parameters (``?metric=cosine&seed=7``).
    """
    settings = request.app.state.settings
    if media_type(request.headers.get("content-type")) != NPY:
        body = await read_json_body(request, ModelRequest, SPEC_MAX_BYTES)
        values = body.model_dump()
        init = values["init"] if isinstance(values["init"], list) else None
        if init is not None:
            values["init"] = "given"
        return _spec(values, "body"), init
    raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_seconds)
    C = await parse_body(raw, NPY, dim=None, max_vectors=100_000, max_dim=settings.max_dim)
    values = {"k": C.shape[0], "dim": C.shape[1], **request.query_params, "init": "given"}
    return _spec(values, "query"), C


SPEC_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            JSON: {"schema": ModelRequest.model_json_schema()},
            NPY: {"schema": {"type": "string", "format": "binary"}},
        },
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
    "`required_bytes`, `limit_bytes`, `max_samples_fitting`."
)


@router.put(
    "/models/{name}",
    response_model=ModelInfo,
    summary="Create a named model (or find it with the same settings)",
    description="201 when created (its worker starts at once), 200 when it exists with "
    "the same settings (and initial centroids), 409 when they differ. Nothing is stored "
    "when refused. The body is read only once the key is checked: JSON at most 1 MiB, "
    "`init` a seeding method or the initial centroids (k lists of dim numbers); or the "
    "centroids as an `application/x-npy` body (k, dim from its shape; the other settings "
    "as query parameters), at most NMBATCH_MAX_BODY_BYTES. A seeded model publishes the "
    "given centroids as its first version. 422 `invalid-init` (member `fault`: shape, "
    "values, zero-row, missing) when they cannot seed it.",
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
    spec, init = await read_spec(request)
    created, document = await catalog.create_model(_manager(request), name, spec, init)
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
