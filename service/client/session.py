"""What both clients' drivers share: headers, which transport errors are retried, and
answers to :class:`~service.client.operations.Answer` or typed errors."""

from __future__ import annotations

import httpx

from nmbatch.service.client.errors import ConnectionFailedError, error_from_answer
from nmbatch.service.client.operations import Answer, Call

__all__ = ["DEFAULT_TIMEOUT", "RETRIED_ERRORS", "client_headers", "final_answer", "no_answer"]

DEFAULT_TIMEOUT = 30.0
"""Seconds for each request's connect, read and write (and pool wait)."""

RETRIED_ERRORS: tuple[type[Exception], ...] = (
    httpx.NetworkError,  # connect, read, write, close
    httpx.TimeoutException,
    httpx.RemoteProtocolError,  # the server closed the connection mid-answer
)
"""Transport errors after which a request is repeated (no answer came)."""


def client_headers(api_key: str | None) -> dict[str, str]:
    """Headers of every request: the API key as a bearer token, when given."""
    headers = {"user-agent": "nmbatch-client"}
    if api_key is not None:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


def final_answer(response: httpx.Response, attempts: int) -> Answer:
    """The :class:`Answer` of a success (2xx, 304), or raise the typed error of the rest."""
    status = response.status_code
    if 200 <= status < 300 or status == 304:
        return Answer(status, response.headers, response.content, attempts)
    raise error_from_answer(status, response.headers, response.content, attempts=attempts)


def no_answer(call: Call, exc: Exception, attempts: int) -> ConnectionFailedError:
    """The error raised when ``call`` got no answer in ``attempts`` requests."""
    tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    return ConnectionFailedError(
        f"{call.method} {call.path}: no answer after {tries}: {type(exc).__name__}: {exc}",
        attempts=attempts,
    )
