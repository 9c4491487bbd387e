"""``POST /recluster`` and ``POST /sweep``: a model's ``k``, changed and chosen.

Mounted like the other per-model routers: under ``/models/{name}`` and, for the default
model, without the prefix; both reach the same use cases. Re-clustering changes what
every user of the model is served, so it needs scope ``admin`` (as ``PUT`` and ``POST
/pin``); a sweep changes nothing but costs CPU, so it needs scope ``write``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from nmbatch.service.context import ModelDep, read_json_body
from nmbatch.service.models import ModelManager
from nmbatch.service.parsing import JSON
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import Sweep
from nmbatch.service.security import OPTIONAL_KEY, require_admin_key, require_write_key
from nmbatch.service.usecases import choosing
from nmbatch.service.usecases import recluster as reclustering

__all__ = ["router"]

router = APIRouter(tags=["models"])

SMALL_BODY_BYTES = 4096
"""Largest ``POST /recluster`` and ``POST /sweep`` body (413 above)."""


class ReclusterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    k: int = Field(ge=1, le=100_000, description="The new number of clusters.")


class SweepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ks: list[Annotated[int, Field(ge=1, le=100_000)]] = Field(
        min_length=1, max_length=64,
        description="The values of k to fit (at most NMBATCH_SWEEP_MAX_KS, each at most "
        "NMBATCH_SWEEP_MAX_K).",
    )  # fmt: skip


def _name(request: Request) -> tuple[ModelManager, str]:
    """The app's models and the name of the model the path names (the default model's on
    the routes without the prefix)."""
    models: ModelManager = request.app.state.models
    return models, str(request.path_params.get("name", models.default_name))


def _body(schema: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True,
                            "content": {JSON: {"schema": schema.model_json_schema()}}}}


@router.post(
    "/recluster",
    summary="Cluster the retained samples again with another k",
    description="Body `{\"k\": K}`. The model restarts with K clusters and replays its "
    "retained samples (nothing is deleted): its next version has K centroids; the kept "
    "versions stay readable with `?version=` (a pin stays too), version numbers go on "
    "increasing. A model seeded with given centroids seeds k-means++ from then on. 422 "
    "`k-refused` (member `setting`) when K breaks a rule of its settings (a window or "
    "reservoir below K), `model-too-large` when its memory would not hold it.",
    openapi_extra=_body(ReclusterRequest) | OPTIONAL_KEY,
    dependencies=[Depends(require_admin_key)],
    responses=problem_responses(400, 401, 403, 404, 408, 409, 413, 415, 422, 503),
)
async def post_recluster(request: Request) -> dict[str, Any]:
    body = await read_json_body(request, ReclusterRequest, SMALL_BODY_BYTES)
    models, name = _name(request)
    return await reclustering.recluster(models, name, body.k)


@router.post(
    "/sweep",
    response_model=Sweep,
    summary="Fit several k on the retained samples and recommend one",
    description="Body `{\"ks\": [8, 16, 32]}`. Fits each k on a uniform sample of at "
    "most NMBATCH_SWEEP_MAX_ROWS retained samples (20% held out) and answers, per k, the "
    "held-out energy, the silhouette (on at most 2,000 held-out samples) and the fit's "
    "time, with a recommended k and the rule used (the elbow of the held-out energy on a "
    "log k axis). Synchronous, one sweep at a time per process (503 `sweep-busy` "
    "otherwise), on one core at low priority; the model's training goes on. Changes "
    "nothing. 422 `k-refused` (member `setting`) past NMBATCH_SWEEP_MAX_KS or "
    "NMBATCH_SWEEP_MAX_K, or a k above the samples a fit gets.",
    openapi_extra=_body(SweepRequest) | OPTIONAL_KEY,
    dependencies=[Depends(require_write_key)],
    responses=problem_responses(400, 401, 403, 404, 408, 413, 415, 422, 503),
)
async def post_sweep(request: Request, handle: ModelDep) -> dict[str, Any]:
    body = await read_json_body(request, SweepRequest, SMALL_BODY_BYTES)
    return await choosing.sweep_model(handle, body.ks)
