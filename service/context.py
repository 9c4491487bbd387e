"""What the routes share: the model a request names, body parsing, conditional headers.

The per-model routes (samples, centroids, assign, stats, dashboard) are mounted twice
(:func:`nmbatch.service.main.create_app`): under ``/models/{name}`` and, for the default
model (``NMBATCH_MODEL``), without the prefix. Both reach the model through
:data:`ModelDep` (:func:`get_model`): the ``name`` path parameter, or the default
model's name where the path has none, looked up in the app's one model registry
(``app.state.models``, :class:`nmbatch.service.models.ModelManager`). The routes hold no
state of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from nmbatch.service.metrics import RouteLabel
from nmbatch.service.models.registry import NAME_PATTERN
from nmbatch.service.parsing import JSON, NPY, NPZ, OCTET, media_type, parse_vectors, read_body
from nmbatch.service.problems import ProblemError
from nmbatch.service.schemas import VERSION_MAX
from nmbatch.service.usecases.serving import ModelHandle

__all__ = [
    "MODEL_PREFIX",
    "ModelDep",
    "Name",
    "VersionQuery",
    "etag_matches",
    "get_model",
    "model_path",
    "parse_body",
    "read_json_body",
    "wants_npy",
]

M = TypeVar("M", bound=BaseModel)

MODEL_PREFIX = "/models/{name}"
"""Path prefix of a model's own routes."""

_INLINE_BINARY_BYTES = 4 << 20  # .npy / raw bodies up to this size are parsed on the loop
_INLINE_JSON_BYTES = 16 << 10  # JSON bodies up to this size are parsed on the loop

Name = Annotated[
    str,
    Path(
        pattern=NAME_PATTERN,
        max_length=64,
        description="The model's name: 1 to 64 letters, digits, `_`, `.`, `-`, starting "
        "with a letter or digit (NMBATCH_MODEL names the default model).",
        examples=["tenant-a"],
    ),
]


VersionQuery = Annotated[
    int | None,
    Query(
        ge=1,
        le=VERSION_MAX,
        description="A kept version (GET versions) to answer from instead of the one "
        "served now (404 `version-not-kept` if it is not kept).",
        examples=[42],
    ),
]
"""``?version=`` of the reads that can answer from a kept version (``/centroids``,
``/assign``)."""


async def get_model(request: Request) -> ModelHandle:
    """FastAPI dependency: the :class:`ModelHandle` of the model the request names.

    The ``name`` path parameter, or the default model (``NMBATCH_MODEL``) on the routes
    without the prefix; a model that does not exist is the ``404`` ``unknown-model``
    problem. ``async`` on purpose: FastAPI runs a plain ``def`` dependency in the thread
    pool, a hop to another thread and back on every request for one lookup.
    """
    models = request.app.state.models
    name = request.path_params.get("name", models.default_name)
    return await models.handle(name)


ModelDep = Annotated[ModelHandle, Depends(get_model)]


async def model_path(request: Request, name: Name) -> None:
    """Dependency of the routes mounted under :data:`MODEL_PREFIX`.

    Declares (and validates) the ``name`` path parameter that :func:`get_model` reads,
    and labels the request's metrics with the prefixed template
    (``/models/{name}/centroids``, not the default model's ``/centroids``).
    """
    route = request.scope.get("route")
    path = getattr(route, "path", "")
    if not path.startswith(MODEL_PREFIX):
        request.scope["route"] = RouteLabel(MODEL_PREFIX + path)


async def parse_body(
    body: bytes | bytearray,
    content_type: str,
    *,
    parser: Callable[..., Any] = parse_vectors,
    **limits: int | None,
) -> Any:
    """:func:`service.parsing.parse_vectors` of a request body (or ``parser``: also
    :func:`~nmbatch.service.parsing.parse_samples`), on or off the event loop.

    Binary bodies (``.npy``, raw ``float32``) are parsed in place by a few numpy calls
    over the bytes (about 40 microseconds per 512 KiB), less than a hop to the thread pool
    and back costs (two thread wake-ups, and the GIL handed over twice): they are parsed
    on the loop up to 4 MiB. JSON builds a Python float per number (about 8 ms per
    1,000 x 128 vectors): above 16 KiB it goes to the thread pool, so the loop keeps
    serving other requests meanwhile (``.npz`` bodies count as binary: their members are
    copied once, then read in place). ``limits`` are ``parse_vectors``'s keywords.
    """
    kind = media_type(content_type)
    inline = _INLINE_BINARY_BYTES if kind in (NPY, NPZ, OCTET) else _INLINE_JSON_BYTES
    if len(body) <= inline:
        return parser(body, content_type, **limits)
    return await run_in_threadpool(partial(parser, body, content_type, **limits))


async def read_json_body(request: Request, schema: type[M], max_bytes: int) -> M:
    """A small JSON body (``PUT /models/{name}``, ``POST /pin``) as a ``schema`` object,
    read after the key check.

    Through the reader of ``POST /samples`` (:func:`~nmbatch.service.parsing.read_body`):
    at most ``max_bytes`` (or ``NMBATCH_MAX_BODY_BYTES`` if lower; 413 above, refused
    from ``Content-Length`` before anything is read), within
    ``NMBATCH_BODY_TIMEOUT_SECONDS`` (408). JSON only (415 otherwise); parsed and checked
    by pydantic in one step (off the event loop above 16 KiB, as :func:`parse_body`):
    bad JSON, unknown members, non-finite numbers (``NaN``,
    ``Infinity``, ``1e999``) and out-of-range values are a 422 problem naming them.
    """
    settings = request.app.state.settings
    kind = media_type(request.headers.get("content-type"))
    if kind not in (JSON, ""):
        raise ProblemError(
            415, "unsupported-media-type", f"{kind} is not accepted; send {JSON}",
            accepted=[JSON],
        )  # fmt: skip
    body = await read_body(request, min(max_bytes, settings.max_body_bytes),
                           settings.body_timeout_seconds)  # fmt: skip
    try:
        if len(body) <= _INLINE_JSON_BYTES:
            return schema.model_validate_json(bytes(body))
        return await run_in_threadpool(schema.model_validate_json, bytes(body))
    except ValidationError as exc:
        raise RequestValidationError(
            [e | {"loc": ("body", *e["loc"])} for e in exc.errors(include_input=False)]
        ) from None


# Two request headers parsed here rather than by a library: Starlette parses neither
# (its static files compare If-None-Match without "*"), and werkzeug's parsers would be
# a runtime dependency for twenty lines.
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
