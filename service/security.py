"""API keys on the routes: ``Authorization: Bearer <key>``, each key with a scope.

The keys and their scopes are :mod:`nmbatch.service.keys` (``NMBATCH_API_KEY``,
``NMBATCH_API_KEYS``, ``NMBATCH_API_KEY_FILE``), loaded once into ``app.state.keys``.
With no key configured every route is open (the service then refuses to start on an
address other than loopback unless ``NMBATCH_ALLOW_ANONYMOUS=true``, see
:class:`~nmbatch.service.config.Settings`). With keys:

- :func:`require_admin_key`: ``PUT`` and ``DELETE /models/{name}``, ``POST`` and
  ``DELETE /pin`` (what every user of a model is served) need scope ``admin``;
- :func:`require_write_key`: ``POST /samples`` needs ``write`` (or ``admin``);
- :func:`require_read_key`: reads (``GET /centroids``, ``GET`` and ``POST /assign``,
  ``GET /stats``, ``GET /versions``, the dashboard, ``GET /models``, ``GET /metrics``)
  need ``read`` or above only with ``NMBATCH_API_KEY_READS=true``; else they stay open;
- ``GET /healthz`` and ``GET /readyz`` always stay open (orchestrators probe them; they
  tell no internals), and so do the API documentation pages.

A key restricted to model patterns reaches the routes of the models they match (the
``name`` path parameter, or ``NMBATCH_MODEL`` on the routes without the prefix) and no
route over every model (``GET /models``, ``/metrics``).

A missing or unknown key is a ``401`` problem with ``WWW-Authenticate: Bearer``
(``error="invalid_token"`` when a key was sent); a known key without the scope, or
outside its patterns, is a ``403`` ``forbidden`` problem (``error="insufficient_scope"``).
The checks run before any body is read, so an unauthenticated upload costs nothing.
Neither the keys nor the token sent are ever logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from nmbatch.service.keys import KeyRing
from nmbatch.service.problems import ProblemError

__all__ = [
    "OPTIONAL_KEY",
    "bearer_scheme",
    "key_matches",
    "require_admin_key",
    "require_read_key",
    "require_write_key",
]

REALM = "nmbatch"

#: Documents the scheme in OpenAPI; ``auto_error=False`` so the key stays optional and
#: every refusal is this module's problem answer.
bearer_scheme = HTTPBearer(
    scheme_name="apiKey",
    description="An API key (NMBATCH_API_KEY, NMBATCH_API_KEYS, NMBATCH_API_KEY_FILE), when "
    "the service has keys: scope read (reads, with NMBATCH_API_KEY_READS=true), write (POST "
    "samples) or admin (PUT and DELETE models, POST and DELETE pin). 401: no key or an "
    "unknown one; 403: the key lacks the scope or does not cover the model.",
    auto_error=False,
)

#: ``openapi_extra`` of every route with a key dependency: FastAPI lists the bearer scheme
#: as required; adding the empty requirement ``{}`` says "or none" (the key is optional).
OPTIONAL_KEY: dict[str, Any] = {"security": [{}]}

Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


def key_matches(token: str, key: str) -> bool:
    """True if ``token`` (a header value, latin-1 decoded) equals ``key``, in constant time."""
    sent = hashlib.sha256(token.encode("latin-1", errors="replace")).digest()
    wanted = hashlib.sha256(key.encode("utf-8")).digest()
    return hmac.compare_digest(sent, wanted)


def _authorize(
    request: Request, credentials: HTTPAuthorizationCredentials | None, scope: str
) -> None:
    """Raise the ``401``/``403`` problem unless the request's key allows ``scope`` on the
    model the request names."""
    keys: KeyRing = request.app.state.keys
    if credentials is None:
        raise ProblemError(
            401,
            "unauthorized",
            "this endpoint needs an API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": f'Bearer realm="{REALM}"'},
        )
    grant = keys.find(credentials.credentials)
    if grant is None:
        raise ProblemError(
            401,
            "unauthorized",
            "the API key sent in 'Authorization: Bearer' is not one of the service's",
            headers={"WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token"'},
        )
    model = _model_of(request)
    if not grant.allows(scope, model):
        what = f"model '{model}'" if model is not None else "every model"
        raise ProblemError(
            403,
            "forbidden",
            f"this API key does not allow scope '{scope}' on {what}",
            title="Forbidden",
            headers={
                "WWW-Authenticate": f'Bearer realm="{REALM}", error="insufficient_scope", '
                f'scope="{scope}"'
            },
            scope=scope,
        )


def _model_of(request: Request) -> str | None:
    """The model the request names, or None for a route over every model."""
    name = request.path_params.get("name")
    if name is not None:
        return str(name)
    if request.url.path.rstrip("/") in ("/models", "/metrics"):
        return None
    return str(request.app.state.settings.model)


async def require_admin_key(request: Request, credentials: Credentials) -> None:
    """FastAPI dependency of model creation and deletion: scope ``admin``, when keys exist."""
    if not request.app.state.keys.empty:
        _authorize(request, credentials, "admin")


async def require_write_key(request: Request, credentials: Credentials) -> None:
    """FastAPI dependency of write routes: scope ``write``, when keys exist."""
    if not request.app.state.keys.empty:
        _authorize(request, credentials, "write")


async def require_read_key(request: Request, credentials: Credentials) -> None:
    """FastAPI dependency of read routes: scope ``read`` with NMBATCH_API_KEY_READS=true."""
    if not request.app.state.keys.empty and request.app.state.settings.api_key_reads:
        _authorize(request, credentials, "read")
