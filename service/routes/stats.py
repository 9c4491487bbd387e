"""``GET /stats``: the algorithm's course (batch size, doublings, energy, bound savings)."""

from __future__ import annotations

from fastapi import APIRouter

from service.context import Context
from service.routes.centroids import iso_time
from service.schemas import DoublingOut, Stats

router = APIRouter(tags=["monitoring"])


@router.get("/stats", response_model=Stats, summary="Algorithm statistics")
async def get_stats(context: Context) -> Stats:
    stats = context.board.stats
    model = context.board.model
    return Stats(
        phase=stats.phase,
        version=model.version if model is not None else None,
        b=stats.batch_size,
        N=stats.n_samples,
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
                iteration=e.iteration, from_b=e.from_size, to_b=e.to_size, at=iso_time(e.at)
            )
            for e in stats.doublings
        ],
    )
