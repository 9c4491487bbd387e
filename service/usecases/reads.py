"""The other read use cases of one model: assignments, statistics, readiness.

Each takes the model's published centroids or its
:class:`~nmbatch.service.usecases.serving.ModelHandle` and returns a document (``bytes``
already serialised where the routes send them as they are, a schema object otherwise).
Redis errors propagate (the app answers them). The inputs are validated by the caller
(the routes parse the request at the edge, :mod:`nmbatch.service.parsing`).
"""

from __future__ import annotations

import asyncio
import logging
import math

import numpy as np
import orjson
import redis
from pydantic_core import to_json

from nmbatch.engine import nearest
from nmbatch.engine.assign import nearest_one
from nmbatch.engine.metric import similarity
from nmbatch.service.schemas import DoublingOut, Readiness, Stats
from nmbatch.service.state import PublishedModel
from nmbatch.service.usecases.serving import ModelHandle, iso_time, metric_vectors

log = logging.getLogger("service")

__all__ = [
    "assign",
    "assign_json",
    "assign_one_json",
    "readiness",
    "stats",
]

_PING_TIMEOUT = 2.0


def assign(model: PublishedModel, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid of each row of ``X`` (``(n, d)`` float32) under ``model``.

    Returns labels ``(n,)`` int64 and squared Euclidean distances ``(n,)`` float64. One
    thread per request: the HTTP side answers many at once from its thread pool, and
    leaves the other cores to the engine.
    """
    return nearest(X, model.state.centroids, n_threads=1)


_NOT_ASSIGNED = "no vector of this request was assigned"


def assign_one_json(model: PublishedModel, X: np.ndarray, metric: str = "euclidean") -> bytes:
    """The :class:`AssignOne` document of the vector ``X`` (``(1, d)`` float32) under
    ``model``, a model of ``metric``.

    ``X`` is validated by the caller (the query's text parsed by
    :func:`service.parsing.parse_query_vector` at the edge); the nearest centroid is
    :func:`engine.assign.nearest_one` over the published (immutable) centroids, exact like
    ``engine.nearest``; the body is serialised by pydantic's JSON serialiser, as FastAPI
    serialises a response model. Under ``cosine`` the vector is normalised first
    (:func:`~nmbatch.service.usecases.serving.metric_vectors`: a zero vector raises
    :class:`~nmbatch.service.usecases.errors.ZeroVectorError`) and the document adds its
    ``similarity`` to the centroid, ``1 - distance^2 / 2``.
    """
    cosine = metric != "euclidean"
    if cosine:
        X = metric_vectors(X, metric, _NOT_ASSIGNED)
    label, sqdist = nearest_one(X[0], model.state.centroids)
    document = {"version": model.version, "cluster": label, "distance": math.sqrt(sqdist)}
    if cosine:
        document["similarity"] = float(similarity(sqdist))
    return to_json(document)


def assign_json(model: PublishedModel, X: np.ndarray, metric: str = "euclidean") -> bytes:
    """The :class:`AssignMany` document of ``X`` (``(n, d)`` float32) under ``model``, a
    model of ``metric`` (under ``cosine`` the vectors normalised first and the
    ``similarities`` added, as :func:`assign_one_json`)."""
    cosine = metric != "euclidean"
    if cosine:
        X = metric_vectors(X, metric, _NOT_ASSIGNED)
    labels, sqdist = assign(model, X)
    payload = {"version": model.version, "clusters": labels, "distances": np.sqrt(sqdist)}
    if cosine:
        payload["similarities"] = similarity(sqdist)
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


async def stats(handle: ModelHandle) -> Stats:
    """The ``/stats`` document: the algorithm's course, the capacity, the memory."""
    course = handle.board.stats
    model = handle.board.model
    capacity = handle.capacity
    if capacity is None and (dim := await handle.known_dim()) is not None:
        capacity = await handle.capacity_for(dim)  # fixed by another process's batch
    try:
        memory = await handle.sample_log.client.info("memory")
    except redis.ResponseError:  # INFO disabled (managed Redis)
        memory = {}
    n_logged = await handle.sample_log.n_samples()
    log_entries, log_bytes = await handle.sample_log.log_size()
    return Stats(
        phase=course.phase,
        role=handle.worker.role,
        version=model.version if model is not None else None,
        b=course.batch_size,
        N=course.n_samples,
        batch_size=course.batch_size,
        n_samples=course.n_samples,
        n_logged=n_logged,
        iteration=course.iteration,
        converged=course.converged,
        energy=course.energy,
        distances_computed=course.distances_computed,
        distances_skipped=course.distances_skipped,
        skipped_share=course.skipped_share,
        last_iteration_seconds=course.last_iteration_seconds,
        doublings=[
            DoublingOut(
                iteration=e.iteration,
                from_b=e.from_size,
                to_b=e.to_size,
                from_size=e.from_size,
                to_size=e.to_size,
                at=iso_time(e.at),
            )
            for e in course.doublings
        ],
        max_samples=capacity.max_samples if capacity is not None else None,
        max_samples_source=capacity.source if capacity is not None else None,
        max_samples_detail=capacity.detail if capacity is not None else None,
        retention=handle.settings.retention,
        metric=handle.settings.metric,
        retained=course.n_samples,
        n_retired=course.n_retired,
        drift=course.drift,
        drift_alarm=handle.settings.drift_alarm or None,
        n_ingested=max(course.n_ingested, n_logged),
        log_entries=log_entries,
        log_bytes=log_bytes,
        engine_bytes=course.engine_bytes,
        redis_used_memory=memory.get("used_memory"),
        redis_maxmemory=memory.get("maxmemory"),
        pinned_version=pinned.version if (pinned := handle.board.pinned) is not None else None,
        versions_kept=await handle.kept.count(),
    )


async def readiness(handle: ModelHandle) -> Readiness:
    """Redis reachable (within 2 s) and the worker thread alive; ``ready`` says both."""
    try:
        await asyncio.wait_for(handle.sample_log.client.ping(), _PING_TIMEOUT)
        redis_state = "ok"
    except Exception as exc:  # any failure means not ready; say which kind, log the rest
        # The route is open to anyone: no host, port, URL or Redis message in the answer.
        redis_state = f"unavailable ({type(exc).__name__})"
        log.warning("readiness: Redis unavailable: %s: %s", type(exc).__name__, exc)
    worker = handle.worker
    worker_state = worker.phase if worker.error is None else "failed (see the service's log)"
    ready = redis_state == "ok" and worker.alive()
    return Readiness(ready=ready, redis=redis_state, worker=worker_state, role=worker.role)
