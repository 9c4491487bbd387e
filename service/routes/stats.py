"""``GET /stats``: the algorithm's course (batch size, doublings, energy, bound savings),
the capacity and the memory of the engine and Redis."""

from __future__ import annotations

import redis
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
    capacity = context.capacity
    if capacity is None and (dim := await context.known_dim()) is not None:
        capacity = await context.plan_capacity(dim)  # fixed by another process's batch
    try:
        memory = await context.sample_log.client.info("memory")
    except redis.ResponseError:  # INFO disabled (managed Redis)
        memory = {}
    n_logged = await context.sample_log.n_samples()
    log_entries, log_bytes = await context.sample_log.log_size()
    return Stats(
        phase=stats.phase,
        role=context.worker.role,
        version=model.version if model is not None else None,
        b=stats.batch_size,
        N=stats.n_samples,
        batch_size=stats.batch_size,
        n_samples=stats.n_samples,
        n_logged=n_logged,
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
        max_samples=capacity.max_samples if capacity is not None else None,
        max_samples_source=capacity.source if capacity is not None else None,
        max_samples_detail=capacity.detail if capacity is not None else None,
        retention=context.settings.retention,
        retained=stats.n_samples,
        n_retired=stats.n_retired,
        n_ingested=max(stats.n_ingested, n_logged),
        log_entries=log_entries,
        log_bytes=log_bytes,
        engine_bytes=stats.engine_bytes,
        redis_used_memory=memory.get("used_memory"),
        redis_maxmemory=memory.get("maxmemory"),
    )
