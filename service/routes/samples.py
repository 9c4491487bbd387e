"""``POST /samples``: append vectors to the model's sample log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response

from nmbatch.service.context import Context, parse_body
from nmbatch.service.idempotency import KEY_MAX_LENGTH, KEY_PATTERN, append_once
from nmbatch.service.parsing import JSON, NPY, OCTET, read_body
from nmbatch.service.problems import ProblemError, problem_responses
from nmbatch.service.schemas import SamplesAccepted, VectorsIn
from nmbatch.service.security import OPTIONAL_KEY, require_write_key

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

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=KEY_MAX_LENGTH,
        pattern=KEY_PATTERN,
        description=(
            "Makes a retry safe: a request with the same key and the same vectors is "
            "answered like the first one and stores nothing (`Idempotent-Replayed: true`); "
            "the same key with other vectors is a 409 problem. 1 to 255 visible ASCII "
            "characters (a UUID, say); kept for NMBATCH_IDEMPOTENCY_SECONDS."
        ),
    ),
]


@router.post(
    "/samples",
    status_code=202,
    response_model=SamplesAccepted,
    summary="Add samples",
    description=(
        "Validates the vectors and appends them to the Redis sample log; answers once they "
        "are stored there. A rejected request stores nothing."
    ),
    openapi_extra=VECTORS_BODY | OPTIONAL_KEY,
    dependencies=[Depends(require_write_key)],
    responses={
        202: {"headers": {"Idempotent-Replayed": {"schema": {"type": "string"}}}},
        **problem_responses(400, 401, 408, 409, 413, 415, 422, 503),
    },
)
async def post_samples(
    request: Request,
    response: Response,
    context: Context,
    idempotency_key: IdempotencyKey = None,
) -> SamplesAccepted:
    settings = context.settings
    try:
        body = await read_body(request, settings.max_body_bytes, settings.body_timeout_seconds)
        X = await parse_body(  # binary bodies on the loop, JSON in the thread pool
            body,
            request.headers.get("content-type", ""),
            dim=await context.known_dim(),
            max_vectors=settings.max_vectors,
            max_dim=settings.max_dim,
        )
        del body
        if idempotency_key is None:
            return SamplesAccepted(
                accepted=int(X.shape[0]), n_samples=await context.append_samples(X)
            )
        outcome = await append_once(context, X, idempotency_key)
    except ProblemError as exc:
        context.metrics.samples_rejected.labels(exc.slug).inc()
        raise
    if not outcome.stored:
        response.headers["Idempotent-Replayed"] = "true"
    return SamplesAccepted(accepted=outcome.accepted, n_samples=outcome.n_samples)
