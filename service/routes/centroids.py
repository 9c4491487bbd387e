"""``GET /centroids``: the published centroids as JSON or ``.npy``, with ETag."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import numpy as np
import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from nmbatch.service.context import Context, off_loop
from nmbatch.service.parsing import NPY
from nmbatch.service.problems import problem_responses
from nmbatch.service.schemas import Centroids
from nmbatch.service.security import OPTIONAL_KEY, require_read_key
from nmbatch.service.state import PublishedModel

router = APIRouter(tags=["centroids"], dependencies=[Depends(require_read_key)])


def iso_time(unix: float) -> str:
    """Unix time as ISO 8601 UTC with milliseconds."""
    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="milliseconds")


def centroids_json(model: PublishedModel, retention: str = "all") -> bytes:
    """The :class:`Centroids` document of ``model`` (kept under ``retention``), serialised."""
    state = model.state
    return orjson.dumps(
        {
            "version": model.version,
            "k": state.k,
            "dim": state.dim,
            "centroids": state.centroids,
            "counts": state.counts,
            "n_samples": state.n_samples,
            "n_ingested": max(state.n_ingested, state.n_samples),
            "retention": retention,
            "batch_size": state.batch_size,
            "iteration": state.iteration,
            "converged": state.converged,
            "updated_at": iso_time(model.updated_at),
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def centroids_npy(model: PublishedModel) -> bytes:
    """The ``(k, d)`` float32 centroids in ``.npy`` format."""
    out = io.BytesIO()
    np.save(out, model.state.centroids, allow_pickle=False)
    return out.getvalue()


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """True if an ``If-None-Match`` header names ``etag`` (weak comparison) or is ``*``."""
    if not if_none_match:
        return False
    for token in if_none_match.split(","):
        token = token.strip()
        if token == "*" or token.removeprefix("W/") == etag:
            return True
    return False


def wants_npy(accept: str | None) -> bool:
    """True if the ``Accept`` header asks for ``application/x-npy`` (with q > 0)."""
    for item in (accept or "").split(","):
        media, *params = (p.strip() for p in item.split(";"))
        if media.lower() == NPY:
            q = next((p[2:] for p in params if p.lower().startswith("q=")), "1")
            try:
                return float(q) > 0
            except ValueError:
                return True
    return False


@router.get(
    "/centroids",
    response_model=Centroids,
    summary="Current centroids",
    openapi_extra=OPTIONAL_KEY,
    description=(
        "JSON by default; `Accept: application/x-npy` gives the (k, d) float32 array. "
        "`ETag` is the version: send it in `If-None-Match` to get `304` while unchanged."
    ),
    responses={
        200: {"content": {NPY: {"schema": {"type": "string", "format": "binary"}}}},
        304: {"description": "Not modified (same version)"},
        **problem_responses(401, 409, 503),
    },
)
async def get_centroids(request: Request, context: Context) -> Response:
    model = await context.require_model()
    etag = f'"{model.version}"'
    headers = {"ETag": etag, "Vary": "Accept", "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    size = model.state.centroids.size
    if wants_npy(request.headers.get("accept")):
        body = await off_loop(size, centroids_npy, model)
        return Response(body, media_type=NPY, headers=headers)
    body = await off_loop(size, centroids_json, model, context.settings.retention)
    return Response(body, media_type="application/json", headers=headers)
