"""Error answers as RFC 9457 problem details (``application/problem+json``).

Every error the service returns, its own and the framework's (unknown route, wrong
method, invalid query parameter), has the members ``type``, ``title``, ``status`` and
``detail``; some add extension members (``expected_dim``, ``needed`` ...). ``type`` is a
URN naming the fault (``urn:nmbatch:problem:wrong-dimension``), so clients can branch on
it without parsing the English ``detail``.

Two kinds of exceptions become problems. The edge of the service (parsing a body,
checking the API key, a route's own checks) raises :class:`ProblemError`, which names its
status and ``type`` itself. The application layer (the use cases and the model registry)
raises the domain errors of :mod:`nmbatch.service.usecases.errors`, which know nothing of
HTTP: :data:`DOMAIN_PROBLEMS` is the one table that says what each is answered with (the
status, the ``type``, the title, headers such as ``Retry-After``, and which of its
attributes become extension members), and :func:`problem_of` applies it. Both the app's
exception handler and the dashboard's document (``/dashboard/data``) go through it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import compile_path

from nmbatch.service.usecases import errors

__all__ = [
    "DOMAIN_PROBLEMS",
    "PROBLEM_MEDIA_TYPE",
    "DomainProblem",
    "Problem",
    "ProblemError",
    "install_problem_handlers",
    "problem_document",
    "problem_of",
    "problem_response",
    "problem_responses",
]

PROBLEM_MEDIA_TYPE = "application/problem+json"
_TYPE_PREFIX = "urn:nmbatch:problem:"

log = logging.getLogger(__name__)


class Problem(BaseModel):
    """An RFC 9457 problem details object (extension members may follow)."""

    type: str = Field(description="URI naming the kind of fault, e.g. urn:nmbatch:problem:...")
    title: str = Field(description="Short summary of the kind of fault.")
    status: int = Field(description="HTTP status code.")
    detail: str = Field(description="What went wrong with this request, in plain words.")

    model_config = {"extra": "allow"}


class ProblemError(Exception):
    """Raised anywhere in request handling to answer with a problem response.

    Parameters
    ----------
    status : int
        HTTP status code.
    slug : str
        Name of the fault; the ``type`` member is ``urn:nmbatch:problem:{slug}``.
    detail : str
        Explanation for this occurrence.
    title : str or None
        Summary of the kind of fault; default: the HTTP reason phrase.
    headers : dict or None
        Extra response headers (``Retry-After`` ...).
    **extensions
        Extension members added to the body (JSON-serialisable values).
    """

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.status = int(status)
        self.slug = slug
        self.detail = detail
        self.title = title or HTTPStatus(self.status).phrase
        self.headers = headers or {}
        self.extensions = extensions


@dataclass(frozen=True)
class DomainProblem:
    """How one kind of domain error is answered.

    Attributes
    ----------
    status : int
        HTTP status code.
    slug : str
        Name of the fault; the ``type`` member is ``urn:nmbatch:problem:{slug}``.
    title : str or None
        Summary of the kind of fault; None: the HTTP reason phrase.
    members : tuple of str
        The error's attributes that become extension members, in this order (same name).
    headers : dict
        Extra response headers.
    """

    status: int
    slug: str
    title: str | None = None
    members: tuple[str, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)


_RETRY_SHORTLY = {"Retry-After": "1"}

DOMAIN_PROBLEMS: dict[type[errors.DomainError], DomainProblem] = {
    # samples in
    errors.WrongDimensionError: DomainProblem(
        422, "wrong-dimension", members=("expected_dim", "got_dim")
    ),
    errors.ZeroVectorError: DomainProblem(422, "zero-vector", "Zero vector", ("row",)),
    errors.IdempotencyKeyReusedError: DomainProblem(
        409, "idempotency-key-reused", "Idempotency-Key reused"
    ),
    errors.DuplicateSampleIdError: DomainProblem(
        409, "duplicate-sample-id", "Duplicate sample id", ("model", "sample_id")
    ),
    errors.UnknownSampleError: DomainProblem(
        404, "unknown-sample", "Unknown sample", ("model", "sample_id")
    ),
    errors.SamplesUnavailableError: DomainProblem(
        503, "samples-unavailable", "Samples unavailable", ("model",), _RETRY_SHORTLY
    ),
    errors.StoreFullError: DomainProblem(
        507, "store-full", "Store full", ("setting", "max_samples", "n_samples", "rejected")
    ),
    errors.LogBacklogError: DomainProblem(
        503, "log-backlog", "Log backlog", ("n_samples", "rejected"), _RETRY_SHORTLY
    ),
    # centroids out
    errors.NotEnoughSamplesError: DomainProblem(
        409, "not-enough-samples", "Not enough samples", ("needed", "n_samples", "k")
    ),
    errors.CentroidsPendingError: DomainProblem(
        503,
        "centroids-pending",
        "Centroids pending",
        ("needed", "n_samples", "k"),
        _RETRY_SHORTLY,
    ),
    # the models
    errors.UnknownModelError: DomainProblem(404, "unknown-model", "Unknown model", ("model",)),
    errors.ModelConflictError: DomainProblem(
        409, "model-conflict", "Model conflict", ("model", "current")
    ),
    errors.ModelCannotStartError: DomainProblem(
        409, "model-conflict", "Model conflict", ("model",)
    ),
    errors.TooManyModelsError: DomainProblem(
        409, "too-many-models", "Too many models", ("setting", "max_models")
    ),
    errors.DimensionTooLargeError: DomainProblem(
        422, "dimension-too-large", "Dimension too large", ("setting", "max_dim")
    ),
    errors.ModelTooLargeError: DomainProblem(
        422,
        "model-too-large",
        "Model too large",
        ("setting", "limit_setting", "required_bytes", "limit_bytes", "max_samples_fitting"),
    ),
    errors.DefaultModelError: DomainProblem(409, "default-model", "Default model", ("model",)),
    errors.ModelDeletedError: DomainProblem(409, "model-deleted", "Model deleted", ("model",)),
    errors.ModelNotOwnedError: DomainProblem(
        403, "model-not-owned", "Model not owned", ("model",)
    ),
    errors.InvalidModelEntryError: DomainProblem(
        409, "invalid-model-entry", "Invalid model entry", ("model",)
    ),
    # seeding, re-clustering, choosing k
    errors.InvalidInitError: DomainProblem(
        422, "invalid-init", "Invalid initial centroids", ("model", "fault", "row")
    ),
    errors.SweepRefusedError: DomainProblem(
        422, "k-refused", "k refused", ("model", "setting")
    ),
    errors.SweepBusyError: DomainProblem(
        503, "sweep-busy", "Sweep busy", headers={"Retry-After": "5"}
    ),
    # kept versions
    errors.VersionNotKeptError: DomainProblem(
        404, "version-not-kept", "Version not kept", ("model", "version", "kept")
    ),
    # events
    errors.TooManyEventStreamsError: DomainProblem(
        503, "too-many-event-streams", "Too many event streams", ("setting", "max_streams"),
        _RETRY_SHORTLY,
    ),
}
"""Domain error class -> its answer: one entry per class (a test checks that none is
missing, so no refusal reaches a client as a ``500``)."""


def problem_of(exc: ProblemError | errors.DomainError) -> ProblemError:
    """The problem ``exc`` is answered with: itself, or the domain error's entry of
    :data:`DOMAIN_PROBLEMS` applied (its detail, its attributes as members)."""
    if isinstance(exc, ProblemError):
        return exc
    rule = DOMAIN_PROBLEMS[type(exc)]
    return ProblemError(
        rule.status,
        rule.slug,
        exc.detail,
        title=rule.title,
        headers=dict(rule.headers),
        **{name: getattr(exc, name) for name in rule.members},
    )


def problem_response(
    status: int,
    type_: str,
    title: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> Response:
    """A ``Response`` carrying one problem details object."""
    body = {"type": type_, "title": title, "status": int(status), "detail": detail}
    body.update(extensions)
    return Response(
        orjson.dumps(body), status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers
    )


def problem_responses(
    *statuses: int, described: dict[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem answers with these statuses.

    Each is described by its reason phrase, or by ``described[status]`` when given (what
    the problem means for this operation: the ``type`` URNs, the extension members).
    """
    schema = Problem.model_json_schema()
    described = described or {}
    return {
        status: {
            "description": described.get(status, HTTPStatus(status).phrase),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": schema}},
        }
        for status in statuses
    }


def problem_document(exc: ProblemError | errors.DomainError) -> dict[str, Any]:
    """The problem details object ``exc`` is answered with (the body, as a dict)."""
    exc = problem_of(exc)
    body = {"type": _TYPE_PREFIX + exc.slug, "title": exc.title, "status": exc.status,
            "detail": exc.detail}  # fmt: skip
    body.update(exc.extensions)
    return body


def _from_problem_error(request: Request, exc: Exception) -> Response:
    # A ProblemError, or a domain error (of any class: Starlette looks handlers up along
    # the exception's MRO) mapped through DOMAIN_PROBLEMS.
    assert isinstance(exc, ProblemError | errors.DomainError)
    exc = problem_of(exc)
    return Response(
        orjson.dumps(problem_document(exc)),
        status_code=exc.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=exc.headers or None,
    )


_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def _allowed_methods(request: Request) -> str | None:
    """The methods the OpenAPI document gives the request's path (``Allow`` of a 405).

    Starlette's 405 names the methods of the path's first route only (``PUT`` for
    ``/models/{name}``, which ``GET`` and ``DELETE`` routes serve too).
    """
    path = request.scope.get("path", "")
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        if compile_path(template)[0].match(path):
            methods |= {method.upper() for method in operations if method in _METHODS}
    return ", ".join(sorted(methods)) if methods else None


def _from_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).description
    headers = exc.headers
    if status == 404 and detail == "Not Found":
        detail = f"no resource at {request.url.path}"
    elif status == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
        allow = _allowed_methods(request)
        if allow is not None:
            headers = {**(headers or {}), "Allow": allow}
    return problem_response(status, "about:blank", HTTPStatus(status).phrase, detail,
                            headers=headers)  # fmt: skip


def _from_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    parts = []
    errors = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
        errors.append({"loc": [str(p) for p in error.get("loc", ())], "msg": error.get("msg")})
    return problem_response(
        422,
        _TYPE_PREFIX + "invalid-request",
        "Invalid request",
        "; ".join(parts) or "the request is invalid",
        errors=errors,
    )


def _from_unexpected_error(request: Request, exc: Exception) -> Response:
    # A bug, not the client's fault: logged with its traceback, answered without details.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(
        500,
        _TYPE_PREFIX + "internal-error",
        "Internal Server Error",
        "the service met an unexpected error; it has been logged",
    )


def install_problem_handlers(app: FastAPI) -> None:
    """Make every error of ``app`` a problem details response (also unexpected ones: 500).

    Domain errors are answered as :data:`DOMAIN_PROBLEMS` says; Redis errors have a
    handler of their own (:mod:`nmbatch.service.redis_errors`).
    """
    app.add_exception_handler(ProblemError, _from_problem_error)
    app.add_exception_handler(errors.DomainError, _from_problem_error)
    app.add_exception_handler(StarletteHTTPException, _from_http_exception)
    app.add_exception_handler(RequestValidationError, _from_validation_error)
    app.add_exception_handler(Exception, _from_unexpected_error)
