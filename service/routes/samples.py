"""``POST /samples``: append vectors to the model's sample log."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service.context import Context
from service.parsing import JSON, NPY, OCTET, parse_vectors, read_body
from service.problems import ProblemError, problem_responses
from service.schemas import SamplesAccepted, VectorsIn

router = APIRouter(tags=["samples"])

VECTORS_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            JSON: {"schema": VectorsIn.model_json_schema()},
            NPY: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "One 2-D real numeric array in NumPy .npy format.",
                }
            },
            OCTET: {
                "schema": {
                    "type": "string",
                    "format": "binary",
                    "description": "Raw little-endian float32, row-major, n x d values "
                    "(the model's dimension must be known).",
                }
            },
        },
    }
}


@router.post(
    "/samples",
    status_code=202,
    response_model=SamplesAccepted,
    summary="Add samples",
    description=(
        "Validates the vectors and appends them to the Redis sample log; answers once they "
        "are stored there. A rejected request stores nothing."
    ),
    openapi_extra=VECTORS_BODY,
    responses=problem_responses(400, 409, 413, 415, 422, 503),
)
async def post_samples(request: Request, context: Context) -> SamplesAccepted:
    settings = context.settings
    try:
        body = await read_body(request, settings.max_body_bytes)
        X = await run_in_threadpool(
            parse_vectors,
            body,
            request.headers.get("content-type", ""),
            dim=await context.known_dim(),
            max_vectors=settings.max_vectors,
        )
        total = await context.append_samples(X)
    except ProblemError as exc:
        context.metrics.samples_rejected.labels(exc.slug).inc()
        raise
    return SamplesAccepted(accepted=int(X.shape[0]), n_samples=total)
