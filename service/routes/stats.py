"""``GET /stats``: the algorithm's course (batch size, doublings, energy, bound savings),
the capacity and the memory of the engine and Redis."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from nmbatch.service.context import ModelDep
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import Stats
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.usecases import reads

router = APIRouter(tags=["monitoring"], dependencies=[Depends(require_read_key)])


@router.get(
    "/stats",
    response_model=Stats,
    summary="Algorithm statistics",
    openapi_extra=OPTIONAL_KEY,
    responses=problem_responses(401, 503),
)
async def get_stats(request: Request, handle: ModelDep) -> Stats:
    stats = await reads.stats(handle)
    invalid = request.app.state.models.invalid  # the registry's, seen by the last sync
    return stats.model_copy(update={"invalid_models": dict(invalid)}) if invalid else stats
