"""Error answers as RFC 9457 problem details (``application/problem+json``).

Every error the service returns, its own and the framework's (unknown route, wrong
method, invalid query parameter), has the members ``type``, ``title``, ``status`` and
``detail``; some add extension members (``expected_dim``, ``needed`` ...). ``type`` is a
URN naming the fault (``urn:nmbatch:problem:wrong-dimension``), so clients can branch on
it without parsing the English ``detail``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "Problem",
    "ProblemError",
    "install_problem_handlers",
    "problem_document",
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


def problem_document(exc: ProblemError) -> dict[str, Any]:
    """The problem details object ``exc`` is answered with (the body, as a dict)."""
    body = {"type": _TYPE_PREFIX + exc.slug, "title": exc.title, "status": exc.status,
            "detail": exc.detail}  # fmt: skip
    body.update(exc.extensions)
    return body


def _from_problem_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)
    return Response(
        orjson.dumps(problem_document(exc)),
        status_code=exc.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=exc.headers or None,
    )


def _from_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).description
    if status == 404 and detail == "Not Found":
        detail = f"no resource at {request.url.path}"
    elif status == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    return problem_response(
        status, "about:blank", HTTPStatus(status).phrase, detail, headers=exc.headers
    )


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

    Redis errors have a handler of their own (:mod:`nmbatch.service.redis_errors`).
    """
    app.add_exception_handler(ProblemError, _from_problem_error)
    app.add_exception_handler(StarletteHTTPException, _from_http_exception)
    app.add_exception_handler(RequestValidationError, _from_validation_error)
    app.add_exception_handler(Exception, _from_unexpected_error)
