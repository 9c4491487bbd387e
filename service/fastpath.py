"""``GET /assign`` of one vector, answered without FastAPI's layers (the hot read path).

A plain ``GET /assign?vector=...`` is the request the service serves most often and must
answer in well under a millisecond while ingestion runs on the same cores. Through
FastAPI it crosses a dozen middleware and routing layers, dependency resolution and a
response model, about ten times the cost of the answer itself. :class:`AssignFastPath`
is a pure ASGI middleware that answers that one request shape by calling the route's own
answer, :func:`service.parsing.parse_query_vector` then the use case
:func:`service.usecases.reads.assign_one_json` (same parser, same search, same bytes),
and passes every other request through untouched:

- only ``GET /assign`` whose query string is exactly one ``vector`` parameter (decoded
  as Starlette decodes it; ``?version=`` goes to the route), when reads need no API
  key, a model is served (the pinned version, if any, else the newest) and its ``k * d``
  is small enough to search on the event loop;
- a vector that the answer refuses (a zero vector under ``metric=cosine`` too) goes to
  FastAPI, whose route answers with the problem.

It sits inside :class:`service.metrics.RequestTimingMiddleware`, so the request is
timed and labelled ``/assign`` like the route's answers.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from nmbatch.service.config import Settings
from nmbatch.service.metrics import RouteLabel
from nmbatch.service.parsing import parse_query_vector
from nmbatch.service.problems import ProblemError
from nmbatch.service.usecases.errors import DomainError
from nmbatch.service.usecases.reads import assign_one_json

__all__ = ["AssignFastPath"]

MAX_INLINE_VALUES = 1 << 20
"""Largest ``k * d`` searched here (about a millisecond); bigger models take the route."""


_ASSIGN_ROUTE = RouteLabel("/assign")
_HEADERS = [(b"content-type", b"application/json")]


class AssignFastPath:
    """ASGI middleware: answers plain single-vector ``GET /assign`` requests itself."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        # With NMBATCH_API_KEY_READS the route checks the key: leave every read to it.
        self.enabled = not settings.has_keys or not settings.api_key_reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.enabled
            and scope["type"] == "http"
            and scope["path"] == "/assign"
            and scope["method"] == "GET"
        ):
            body = self.answer(scope)
            if body is not None:
                scope["route"] = _ASSIGN_ROUTE
                headers = [(b"content-length", str(len(body)).encode()), *_HEADERS]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    @staticmethod
    def answer(scope: Scope) -> bytes | None:
        """The ``200`` body for this request, or None to leave it to the FastAPI route."""
        pairs = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
        if len(pairs) != 1 or pairs[0][0] != "vector":
            return None
        app = scope.get("app")
        models = getattr(getattr(app, "state", None), "models", None)
        running = models.running.get(models.default_name) if models is not None else None
        model = running.handle.board.served if running is not None else None
        if model is None or model.state.centroids.size > MAX_INLINE_VALUES:
            return None
        try:
            X = parse_query_vector(pairs[0][1], dim=model.state.dim)
            return assign_one_json(model, X, running.handle.settings.metric)
        except (ProblemError, DomainError):
            return None  # the route answers with the same problem
