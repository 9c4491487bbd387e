"""``GET /stats``: the algorithm's course (batch size, doublings, energy, bound savings)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from nmbatch.service.context import Context
from nmbatch.service.problems import problem_responses
from nmbatch.service.routes.centroids import iso_time
from nmbatch.service.schemas import DoublingOut, Stats
from nmbatch.service.security import OPTIONAL_KEY, require_read_key

router = APIRouter(tags=["monitoring"], dependencies=[Depends(require_read_key)])


@router.get(
    "/stats",
    response_model=Stats,
    summary="Algorithm statistics",
    openapi_extra=OPTIONAL_KEY,
    responses=problem_responses(401, 503),
)
async def get_stats(context: Context) -> Stats:
    stats = context.board.stats
    model = context.board.model
    return Stats(
        phase=stats.phase,
        role=context.worker.role,
        version=model.version if model is not None else None,
        b=stats.batch_size,
        N=stats.n_samples,
        batch_size=stats.batch_size,
        n_samples=stats.n_samples,
        n_logged=await context.sample_log.n_samples(),
        iteration=stats.iteration,
        converged=stats.converged,
        energy=stats.energy,
        distances_computed=stats.distances_computed,
        distances_skipped=stats.distances_skipped,
        skipped_share=stats.skipped_share,
        last_iteration_seconds=stats.last_iteration_seconds,
        doublings=[
            DoublingOut(
                iteration=e.iteration,
                from_b=e.from_size,
                to_b=e.to_size,
                from_size=e.from_size,
                to_size=e.to_size,
                at=iso_time(e.at),
            )
            for e in stats.doublings
        ],
    )
