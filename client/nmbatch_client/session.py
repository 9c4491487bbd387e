"""What both clients' drivers share: headers, which transport errors are retried, the
path prefix of a named model, and answers to :class:`~nmbatch_client.operations.Answer`
or typed errors."""

from __future__ import annotations

import re

import httpx

from nmbatch_client.errors import ConnectionFailedError, error_from_answer
from nmbatch_client.operations import Answer, Call
from nmbatch_client.retry import RETRIED_ERRORS

__all__ = [
    "DEFAULT_TIMEOUT",
    "NAME_PATTERN",
    "RETRIED_ERRORS",
    "client_headers",
    "final_answer",
    "model_prefix",
    "no_answer",
]

DEFAULT_TIMEOUT = 30.0
"""Seconds for each request's connect, read and write (and pool wait)."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
"""A model name, as the service checks it: 1 to 64 letters, digits, ``_``, ``.``, ``-``,
starting with a letter or digit. The same text as
:data:`nmbatch.service.models.registry.NAME_PATTERN`, copied because that module imports
the server's Redis and settings code (a test checks that the two are equal)."""


def model_prefix(model: str | None) -> str:
    """The path prefix of ``model``'s routes: ``""`` for None (the service's default
    model, ``/samples`` ...), else ``/models/{model}`` (``/models/{model}/samples`` ...).

    Raises TypeError when ``model`` is not a string and ValueError when it is not a
    model name (the service would answer ``404`` or ``422`` to every request).
    """
    if model is None:
        return ""
    if not isinstance(model, str):
        raise TypeError(f"model must be a str or None, got {type(model).__name__}")
    if re.fullmatch(NAME_PATTERN, model) is None:
        raise ValueError(
            f"model {model!r} is not a model name: 1 to 64 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return f"/models/{model}"


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
