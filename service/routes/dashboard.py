"""``GET /dashboard``: the live dashboard page, its static files, and the data it polls.

The page (``service/dashboard/``, shipped as package data) is static: HTML, two scripts,
one style sheet and the vendored charting library uPlot (MIT, ``vendor/``, provenance in
its ``README.md``). It needs no build step and polls one address, ``GET /dashboard/data``,
which answers ``200`` to an authorised caller with valid parameters, so the browser logs no
failed request in any state of the service (before the first centroids, Redis away). The
document holds:

- what ``/readyz``, ``/stats`` and ``/centroids`` answer, built by the same use cases
  (:mod:`nmbatch.service.usecases.reads`) those routes call: the readiness, the
  ``/stats`` document or the problem ``/stats`` would answer (as its body), the
  ``/centroids`` document or its problem (a domain error rendered by
  :func:`nmbatch.service.problems.problem_document`, as the app's handler does). With
  ``since=<version>`` the centroids are left out while that version is still served;
- the energy history (:attr:`ModelBoard.energy_history`: the last 500 versions' energy
  as ``/stats`` showed it, kept in memory by this process), from ``energy_since``;
- what only the metrics hold: the ``/assign`` latency quantiles, the error counts, Redis
  availability as the worker sees it and the server's memory;
- the last ``POST /sweep`` this process answered for the model (its curve of held-out
  energy by k, with the recommended k).

The 2-D map's PCA of the centroids runs in the browser.

The page and its files are open (they hold no data); ``/dashboard/data`` is a read like
``/metrics``: it needs the API key with ``NMBATCH_API_KEY_READS=true``. The page asks
for the key when an answer is ``401`` and sends it as ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Iterable
from functools import cache
from importlib import resources
from typing import Any, TypeVar

import orjson
import redis
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from nmbatch.service.context import ModelDep, etag_matches
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.problems import Problem, ProblemError, problem_document, problem_responses
from nmbatch.service.redis_errors import redis_problem
from nmbatch.service.schemas import Centroids, Readiness, Stats, Sweep
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.usecases import reads, serving
from nmbatch.service.usecases.errors import DomainError
from nmbatch.service.usecases.serving import ModelHandle, off_loop

__all__ = ["ASSETS", "DashboardData", "histogram_quantile", "router"]

router = APIRouter(tags=["monitoring"])

#: The files served under ``/dashboard/static/``, with their media types; nothing else.
ASSETS: dict[str, str] = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "pca.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "vendor/uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "vendor/uPlot.min.css": "text/css; charset=utf-8",
    "vendor/uPlot.LICENSE": "text/plain; charset=utf-8",
}

#: The page loads only its own files and talks only to this service.
_PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_QUANTILES = (0.5, 0.9, 0.99)
_STARTED = time.monotonic()

T = TypeVar("T")


@cache
def _asset(name: str) -> tuple[bytes, str]:
    """The bytes of ``dashboard/<name>`` in the installed package, and their ETag."""
    body = (resources.files("nmbatch.service") / "dashboard" / name).read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:20] + '"'


def _file_response(request: Request, name: str, media_type: str, **headers: str) -> Response:
    body, etag = _asset(name)
    headers.update({"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media_type, headers=headers)


@router.get("/dashboard", include_in_schema=False)
async def dashboard_page(request: Request) -> Response:
    """The dashboard's HTML page."""
    return _file_response(
        request,
        "index.html",
        "text/html; charset=utf-8",
        **{"Content-Security-Policy": _PAGE_POLICY, "Referrer-Policy": "no-referrer"},
    )


@router.get("/dashboard/static/{asset:path}", include_in_schema=False)
async def dashboard_asset(request: Request, asset: str) -> Response:
    """One of the :data:`ASSETS`; any other name is a ``404`` problem."""
    media_type = ASSETS.get(asset)
    if media_type is None:
        raise ProblemError(404, "not-found", f"the dashboard has no file '{asset[:100]}'")
    return _file_response(request, asset, media_type)


# -- health figures ------------------------------------------------------------------------
class LatencyOut(BaseModel):
    """Latency of the successful ``/assign`` answers (GET and POST) since the start."""

    count: int = Field(description="Successful /assign answers timed.")
    p50: float | None = Field(description="Median latency in seconds (None: no answer yet).")
    p90: float | None = Field(description="90th percentile in seconds.")
    p99: float | None = Field(description="99th percentile in seconds.")


class EnergyPointOut(BaseModel):
    """The energy estimate ``/stats`` showed with one centroid version."""

    version: int
    energy: float
    at: str = Field(description="When it was first shown, ISO 8601 UTC.")


class DashboardData(BaseModel):
    """Everything the dashboard draws, in one answer that is ``200`` in every state.

    ``ready``, ``stats`` and ``centroids`` are what ``/readyz``, ``/stats`` and
    ``/centroids`` answer; when ``/stats`` or ``/centroids`` would answer a problem
    (``409``/``503`` before the first centroids, ``503`` while Redis is away) the document
    is None and ``stats_problem`` / ``centroids_problem`` is that problem's body.

    The health figures are what ``/stats`` does not show: request health, Redis as the
    worker sees it, memory. Quantiles are estimated from the ``nmbatch_request_seconds``
    histogram buckets by linear interpolation inside the bucket (as Prometheus'
    ``histogram_quantile``), so each lies within the bounds of the bucket holding the
    true quantile.
    """

    time: str = Field(description="Server time, ISO 8601 UTC.")
    model: str = Field(description="The model drawn (NMBATCH_MODEL's, or a named one's).")
    uptime_seconds: float = Field(description="Seconds since this process loaded the app.")
    ready: Readiness = Field(description="What /readyz answers (200 or 503).")
    stats: Stats | None = Field(description="What /stats answers; None: see stats_problem.")
    stats_problem: Problem | None = Field(description="The problem /stats answers, if any.")
    centroids_version: int | None = Field(description="The served version (None: none yet).")
    centroids: Centroids | None = Field(
        description="What /centroids answers (JSON); None when it is the version `since` "
        "names, or when there is none (see centroids_problem)."
    )
    centroids_problem: Problem | None = Field(
        description="The problem /centroids answers, if any."
    )
    energy_history: list[EnergyPointOut] = Field(
        description="Energy by version, oldest first: the last 500 versions this process "
        "showed, from version `energy_since` when given."
    )
    assign_latency: LatencyOut
    requests: int = Field(description="HTTP requests answered by this process.")
    client_errors: int = Field(description="Answers with a 4xx status.")
    server_errors: int = Field(description="Answers with a 5xx status.")
    assign_errors: int = Field(description="/assign answers with a 5xx status.")
    redis_up: bool = Field(description="The worker thread reaches Redis (not backing off).")
    redis_unavailable: int = Field(
        description="Redis calls that failed because Redis was unavailable (all callers)."
    )
    engine_restarts: int = Field(description="Times the worker rebuilt its engine process.")
    server_rss_bytes: int | None = Field(
        description="Resident memory of this server process (None where /proc is absent)."
    )
    sweep: Sweep | None = Field(
        description="The last POST /sweep this process answered for the model (None: none "
        "since it started): the held-out energy by k, drawn as a curve."
    )


def histogram_quantile(q: float, bounds: list[float], cumulative: list[float]) -> float | None:
    """The ``q``-quantile of a histogram, interpolated linearly inside its bucket.

    ``bounds``: the buckets' upper bounds, increasing, the last one ``inf``;
    ``cumulative``: the observations ``<=`` each bound (same length). The first bucket
    starts at 0. A quantile in the ``+Inf`` bucket is the largest finite bound. None when
    there is no observation.
    """
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank and count > below:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _samples(metric: object) -> Iterable[tuple[str, dict[str, str], float]]:
    for family in metric.collect():  # type: ignore[attr-defined]
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def _latency(metrics: ServiceMetrics) -> tuple[LatencyOut, int, int, int, int]:
    """The ``/assign`` latency and the answer counts of the request histogram."""
    buckets: dict[float, float] = {}
    requests = client = server = assign_errors = 0
    for name, labels, value in _samples(metrics.request_seconds):
        status = labels.get("status", "")
        if name.endswith("_count"):
            n = int(value)
            requests += n
            client += n if status.startswith("4") else 0
            server += n if status.startswith("5") else 0
            if labels.get("route") == "/assign" and status.startswith("5"):
                assign_errors += n
        elif name.endswith("_bucket") and labels.get("route") == "/assign" and status[:1] == "2":
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
    bounds = sorted(buckets)
    cumulative = [buckets[b] for b in bounds]
    quantiles = [histogram_quantile(q, bounds, cumulative) for q in _QUANTILES]
    latency = LatencyOut(
        count=int(cumulative[-1]) if cumulative else 0,
        p50=quantiles[0],
        p90=quantiles[1],
        p99=quantiles[2],
    )
    return latency, requests, client, server, assign_errors


def _counter_total(metric: object) -> int:
    return int(sum(v for name, _, v in _samples(metric) if name.endswith("_total")))


def _rss_bytes() -> int | None:
    """Resident memory of this process from ``/proc/self/statm`` (None elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


# -- the document -------------------------------------------------------------------------
async def _answer(request: Request, call: Awaitable[T]) -> tuple[T | None, Any]:
    """``(result, None)`` of ``call``, or ``(None, problem)``: for a problem or a Redis
    error, the body the route calling the same use case would answer with."""
    try:
        return await call, None
    except (ProblemError, DomainError) as exc:
        return None, problem_document(exc)  # a domain error through DOMAIN_PROBLEMS
    except redis.RedisError as exc:  # anything else is a bug: a real 500
        state = request.app.state
        where = f"{request.method} {request.url.path}"
        return None, problem_document(redis_problem(exc, state.settings, state.metrics, where))


async def _centroids(handle: ModelHandle, since: int | None) -> tuple[int, bytes | None]:
    """The served version and its ``/centroids`` JSON (None when it is ``since``)."""
    model = await serving.require_model(handle)
    if model.version == since:
        return model.version, None
    size = model.state.centroids.size
    return model.version, await off_loop(
        size, serving.centroids_json, model, handle.settings.retention, handle.settings.metric
    )


@router.get(
    "/dashboard/data",
    response_model=DashboardData,
    summary="Everything the dashboard draws",
    description="Readiness, the /stats and /centroids documents (or the problems those "
    "routes answer, as members: this answer is 200 in every state of the service), the "
    "energy by version, the /assign latency quantiles, error counts, Redis availability "
    "and the server's memory.",
    openapi_extra=OPTIONAL_KEY,
    dependencies=[Depends(require_read_key)],
    responses=problem_responses(401, 422),
)
async def dashboard_data(
    request: Request,
    handle: ModelDep,
    since: int | None = Query(
        None, description="The centroid version held: its centroids are not sent again."
    ),
    energy_since: int | None = Query(
        None, description="Send the energy points from this version on (the last one held)."
    ),
) -> Response:
    metrics: ServiceMetrics = request.app.state.metrics
    ready, (stats, stats_problem), (served, centroids_problem) = await asyncio.gather(
        reads.readiness(handle),
        _answer(request, reads.stats(handle)),
        _answer(request, _centroids(handle, since)),
    )
    version, centroids = served if served is not None else (None, None)
    latency, requests, client, server, assign_errors = _latency(metrics)
    history = [
        {"version": p.version, "energy": p.energy, "at": serving.iso_time(p.at)}
        for p in handle.board.energy_history
        if energy_since is None or p.version >= energy_since
    ]
    doc = {
        "time": serving.iso_time(time.time()),
        "model": handle.settings.model,
        "uptime_seconds": round(time.monotonic() - _STARTED, 3),
        "ready": ready.model_dump(mode="json"),
        "stats": stats.model_dump(mode="json") if stats is not None else None,
        "stats_problem": stats_problem,
        "centroids_version": version,
        "centroids_problem": centroids_problem,
        "energy_history": history,
        "assign_latency": latency.model_dump(),
        "requests": requests,
        "client_errors": client,
        "server_errors": server,
        "assign_errors": assign_errors,
        # The model's own series (its worker's Redis, its engine); Redis errors: the process's.
        "redis_up": any(v > 0 for _, _, v in _samples(handle.metrics.redis_up)),
        "redis_unavailable": _counter_total(metrics.redis_errors),
        "engine_restarts": _counter_total(handle.metrics.engine_restarts),
        "server_rss_bytes": _rss_bytes(),
        "sweep": handle.last_sweep,
    }
    # The centroids go in as /centroids serialised them (not parsed again).
    body = orjson.dumps(doc)[:-1] + b',"centroids":' + (centroids or b"null") + b"}"
    return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})
