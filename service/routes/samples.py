"""``POST /samples``: append vectors to the model's sample log; one sample by its id:
``GET`` and ``DELETE /samples/{id}``, ``POST /samples/delete``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response

from nmbatch.service.context import ModelDep, parse_body, read_json_body
from nmbatch.service.openapi import VECTORS_BODY, VECTORS_REFUSED
from nmbatch.service.parsing import parse_samples, read_body
from nmbatch.service.problems import ProblemError, problem_of, problem_responses
from nmbatch.service.sampleids import any_id
from nmbatch.service.schemas import DeleteSamples, SampleInfo, SamplesAccepted, SamplesDeleted
from nmbatch.service.security import OPTIONAL_KEY, require_read_key, require_write_key
from nmbatch.service.storage import KEY_MAX_LENGTH, KEY_PATTERN
from nmbatch.service.usecases import samples, serving
from nmbatch.service.usecases.errors import DomainError, UnknownSampleError

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
        "(the JSON member `ids`, or the `.npz` member `ids`: one per vector, strings of 1 "
        "to 128 characters of "
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


SampleId = Annotated[str, Path(description="A sample's id: one sent with it, or assigned.")]
_DELETE_BODY_BYTES = 2 << 20  # 10,000 ids of at most 128 bytes, quoted, with commas
_WORKER = (
    "This process is not the model's worker (a standby replica), or the worker did not "
    "answer in time (starting, replaying), or Redis is away: retry after `Retry-After`."
)


def _worker_route(*problems: int, write: bool) -> dict[str, Any]:
    """The route options of the requests the model's worker answers (one sample, the
    deletions): the key they need (``write``: a write key, else a read key) and their
    problem answers, ``401``, ``problems``, then ``503`` (:data:`_WORKER`)."""
    return {
        "openapi_extra": OPTIONAL_KEY,
        "dependencies": [Depends(require_write_key if write else require_read_key)],
        "responses": problem_responses(401, *problems, 503, described={503: _WORKER}),
    }


@router.post(
    "/samples/delete",
    response_model=SamplesDeleted,
    summary="Delete samples",
    description=(
        'Deletes many samples as `DELETE /samples/{id}` does one: `{"ids": [...]}`, at '
        "most 10,000 distinct ids; answers which were deleted and which not found."
    ),
    **_worker_route(413, 422, write=True),
)
async def post_delete_samples(request: Request, handle: ModelDep) -> SamplesDeleted:
    body = await read_json_body(request, DeleteSamples, _DELETE_BODY_BYTES)
    ids = [any_id(value, row) for row, value in enumerate(body.ids)]
    if len(set(ids)) != len(ids):
        raise ProblemError(422, "invalid-ids", "the ids must be distinct")
    deleted, not_found = await samples.delete_samples(handle, ids)
    return SamplesDeleted(deleted=deleted, not_found=not_found)


@router.get(
    "/samples/{sample_id}",
    response_model=SampleInfo,
    response_model_exclude_none=True,
    summary="One sample",
    description=(
        "The centroid the sample's row is nearest to now, the distance (and similarity "
        "under cosine), answered by the model's worker from its engine."
    ),
    **_worker_route(404, 409, 422, write=False),
)
async def get_sample(handle: ModelDep, sample_id: SampleId) -> SampleInfo:
    checked = _path_id(handle, sample_id)
    return SampleInfo(**await samples.describe_sample(handle, checked))


@router.delete(
    "/samples/{sample_id}",
    status_code=204,
    summary="Delete one sample",
    description=(
        "Removes the sample from the model exactly (its vote leaves the sums at once, a "
        "new version is published) and from every replay: a tombstone in Redis first. "
        "404 if the model has no such sample."
    ),
    **_worker_route(404, 422, write=True),
)
async def delete_sample(handle: ModelDep, sample_id: SampleId) -> Response:
    checked = _path_id(handle, sample_id)
    deleted, _ = await samples.delete_samples(handle, [checked])
    if not deleted:
        raise UnknownSampleError(handle.name, checked)
    return Response(status_code=204)


def _path_id(handle: ModelDep, sample_id: str) -> str:
    """``sample_id`` of a path checked; one no sample can have is a 404."""
    try:
        return any_id(sample_id)
    except ProblemError:
        raise UnknownSampleError(handle.name, sample_id[:200]) from None
