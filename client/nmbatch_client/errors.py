"""The client's exceptions: one class per kind of answer, carrying the problem+json fields.

Every error answer of the service is an RFC 9457 problem (:mod:`service.problems`):
``type`` (``urn:nmbatch:problem:<slug>``), ``title``, ``status``, ``detail`` and extension
members. :func:`error_from_answer` turns an answer into the most specific class below
(by ``type`` first, then by status), so callers can write::

    try:
        client.push(X)
    except WrongDimensionError as exc:
        print(exc.extensions["expected_dim"], exc.extensions["got_dim"])

An answer that is not a problem document (a proxy's HTML page, say) becomes the class of
its status with ``type`` ``about:blank`` and the start of its body as ``detail``.
:class:`ConnectionFailedError` is raised when no answer came (after the retries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

try:  # faster where it is installed (the server's distribution has it); not a dependency
    from orjson import loads as json_loads
except ImportError:  # pragma: no cover - the slim client's venv (tests/test_client_slim.py)
    from json import loads as json_loads

__all__ = [
    "BadRequestError",
    "ConflictError",
    "ConnectionFailedError",
    "IdempotencyKeyReusedError",
    "InvalidVectorsError",
    "NmbatchError",
    "NotEnoughSamplesError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ProblemError",
    "ServerError",
    "StoreFullError",
    "UnauthorizedError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
    "WaitTimeoutError",
    "WrongDimensionError",
    "error_from_answer",
]

TYPE_PREFIX = "urn:nmbatch:problem:"


class NmbatchError(Exception):
    """Base class of every exception the client raises."""


class ConnectionFailedError(NmbatchError):
    """No answer from the service (refused, reset, timed out) after every attempt.

    ``attempts`` is the number of requests made; the last transport error is the cause.
    """

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class WaitTimeoutError(NmbatchError, TimeoutError):
    """:meth:`Client.wait_for` gave up; ``last`` is the last centroids seen (or None)."""

    def __init__(self, message: str, last: Any = None) -> None:
        super().__init__(message)
        self.last = last


class ProblemError(NmbatchError):
    """An error answer of the service, with the members of its problem document.

    Attributes
    ----------
    type, title, status, detail :
        The RFC 9457 members (``type`` is ``about:blank`` for non-problem answers).
    extensions : dict
        Every other member (``expected_dim``, ``limit``, ``retry_after`` ...).
    headers : dict
        The answer's headers, lower-case names (``retry-after``, ``www-authenticate``).
    attempts : int
        Requests made before this answer was final (more than 1 after retries).
    """

    def __init__(
        self,
        *,
        type: str,
        title: str,
        status: int,
        detail: str,
        extensions: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.type = type
        self.title = title
        self.status = status
        self.detail = detail
        self.extensions = dict(extensions or {})
        self.headers = dict(headers or {})
        self.attempts = attempts

    @property
    def slug(self) -> str | None:
        """The fault's name, ``type`` without ``urn:nmbatch:problem:`` (None otherwise)."""
        return self.type.removeprefix(TYPE_PREFIX) if self.type.startswith(TYPE_PREFIX) else None

    def to_dict(self) -> dict[str, Any]:
        """The problem document (members as the service sent them)."""
        return {
            "type": self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            **self.extensions,
        }


class BadRequestError(ProblemError):
    """400: a malformed body (not JSON, a broken ``.npy``)."""


class UnauthorizedError(ProblemError):
    """401: the API key is missing or wrong."""


class NotFoundError(ProblemError):
    """404: no such route (a wrong base URL)."""


class ConflictError(ProblemError):
    """409: the request conflicts with the model's state."""


class NotEnoughSamplesError(ConflictError):
    """409 ``not-enough-samples``: no centroids yet (fewer than ``k`` samples stored)."""


class IdempotencyKeyReusedError(ConflictError):
    """409 ``idempotency-key-reused``: the key was used for other vectors."""


class PayloadTooLargeError(ProblemError):
    """413: too many vectors or bytes in one request (``limit`` says how many fit)."""


class UnsupportedMediaTypeError(ProblemError):
    """415: a body type the service does not read."""


class InvalidVectorsError(ProblemError):
    """422: vectors refused (``non-finite``, ``non-numeric``, ``not-a-matrix``, ...)."""


class WrongDimensionError(InvalidVectorsError):
    """422 ``wrong-dimension``: members ``expected_dim`` and ``got_dim``."""


class ServerError(ProblemError):
    """5xx other than 503: a fault of the service."""


class UnavailableError(ServerError):
    """503: Redis away, centroids pending, ... still so after the retries."""


class StoreFullError(ServerError):
    """507: the model is at its capacity (``max_samples``); nothing was stored."""


_BY_SLUG: dict[str, type[ProblemError]] = {
    "wrong-dimension": WrongDimensionError,
    "idempotency-key-reused": IdempotencyKeyReusedError,
    "not-enough-samples": NotEnoughSamplesError,
}
_BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: InvalidVectorsError,
    503: UnavailableError,
    507: StoreFullError,
}


def error_class(status: int, type_: str) -> type[ProblemError]:
    """The class of an error answer: by problem ``type``, else by status."""
    slug = type_.removeprefix(TYPE_PREFIX) if type_.startswith(TYPE_PREFIX) else ""
    if slug in _BY_SLUG:
        return _BY_SLUG[slug]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else ProblemError


def error_from_answer(
    status: int, headers: Mapping[str, str], content: bytes, *, attempts: int = 1
) -> ProblemError:
    """The exception for an error answer (``status`` >= 400) of the service.

    ``headers`` may be any mapping (httpx's headers are case-insensitive); they are kept
    with lower-case names. A body that is not a JSON object with ``type`` and ``title``
    is summarised in ``detail`` (its first 300 characters).
    """
    document: Any = None
    with contextlib.suppress(ValueError):  # both libraries' decode errors are ValueErrors
        document = json_loads(content) if content else None
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    if isinstance(document, dict) and "type" in document and "title" in document:
        members = dict(document)
        type_ = str(members.pop("type"))
        title = str(members.pop("title"))
        detail = str(members.pop("detail", ""))
        members.pop("status", None)
    else:
        type_, title, members = "about:blank", phrase, {}
        detail = content[:300].decode("utf-8", errors="replace").strip() or phrase
    cls = error_class(status, type_)
    return cls(
        type=type_,
        title=title,
        status=status,
        detail=detail,
        extensions=members,
        headers={name.lower(): value for name, value in headers.items()},
        attempts=attempts,
    )
