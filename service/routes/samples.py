"""``POST /samples``: append vectors to the model's sample log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response

from nmbatch.service.context import ModelDep, parse_body
from nmbatch.service.openapi import VECTORS_BODY, VECTORS_REFUSED
from nmbatch.service.parsing import parse_samples, read_body
from nmbatch.service.problems import ProblemError, problem_of, problem_responses
from nmbatch.service.schemas import SamplesAccepted
from nmbatch.service.security import OPTIONAL_KEY, require_write_key
from nmbatch.service.storage import KEY_MAX_LENGTH, KEY_PATTERN
from nmbatch.service.usecases import serving
from nmbatch.service.usecases.errors import DomainError

router = APIRouter(tags=["samples"])

STORE_FULL = (
    "The model is full; nothing from this request is stored, and the service stays ready "
    "(reads, assignments, smaller batches that fit). `type` "
    "`urn:nmbatch:problem:store-full`, members `setting` (`NMBATCH_MAX_SAMPLES`), "
    "`max_samples` (the capacity, set or derived from the memory), `n_samples` (samples "
    "held) and `rejected` (vectors of this request). Also when Redis refuses the write "
    "for its memory (`maxmemory`), except for the next case."
)
"""Description of the ``507`` answer of ``POST /samples``."""
LOG_BACKLOG = (
    "Redis is unreachable (`storage-unavailable`), or, with a retention other than `all` and "
    "the embedded Redis, its log is at `maxmemory` until the worker trims the rows the "
    "retention retired (`urn:nmbatch:problem:log-backlog`, members `n_samples`, "
    "`rejected`). Or writes are shed so that reads keep their latency "
    "(`urn:nmbatch:problem:overloaded`, member `lag_ms`; NMBATCH_WRITE_SHED_LAG_MS). "
    "Nothing is stored; retry after `Retry-After` seconds."
)
"""Description of the ``503`` answer of ``POST /samples``."""


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
        "Validates the vectors (and their sample weights, if sent: the JSON member "
        "`weights`, or an `application/x-npz` body of `X` and `weights`) and their ids "
        "(the JSON member `ids`: one per vector, strings of 1 to 128 characters of "
        "letters, digits and `._:~@+=-`, or 64-bit integers; distinct, and unique per "
        "model: an id already stored is a 409 `duplicate-sample-id` problem), and appends "
        "them to the Redis sample log; answers once they are stored there, with every "
        "sample's id (those sent, else those assigned: `<log entry id>-<row>`). A rejected "
        "request stores nothing; a request that would take the model past its capacity "
        "(NMBATCH_MAX_SAMPLES) is refused whole with 507."
    ),
    openapi_extra=VECTORS_BODY | OPTIONAL_KEY,
    dependencies=[Depends(require_write_key)],
    responses={
        202: {"headers": {"Idempotent-Replayed": {"schema": {"type": "string"}}}},
        **problem_responses(
            400,
            401,
            408,
            409,
            413,
            415,
            422,
            503,
            507,
            described={422: VECTORS_REFUSED, 503: LOG_BACKLOG, 507: STORE_FULL},
        ),
    },
)
async def post_samples(
    request: Request,
    response: Response,
    handle: ModelDep,
    idempotency_key: IdempotencyKey = None,
) -> SamplesAccepted:
    settings = handle.settings
    try:
        body = await read_body(request, settings.max_body_bytes, settings.body_timeout_seconds)
        X, weights, ids = await parse_body(  # binary bodies on the loop, JSON in the thread pool
            body,
            request.headers.get("content-type", ""),
            parser=parse_samples,
            dim=await handle.known_dim(),
            max_vectors=settings.max_vectors,
            max_dim=settings.max_dim,
        )
        del body
        outcome = await serving.ingest(handle, X, idempotency_key, weights, ids)
    except (ProblemError, DomainError) as exc:  # counted by the problem's slug
        handle.metrics.samples_rejected.labels(problem_of(exc).slug).inc()
        raise
    if not outcome.stored:
        response.headers["Idempotent-Replayed"] = "true"
    return SamplesAccepted(accepted=outcome.accepted, n_samples=outcome.n_samples,
                           ids=outcome.ids)  # fmt: skip
