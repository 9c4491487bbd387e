"""Optional API key: ``Authorization: Bearer <NMBATCH_API_KEY>`` on writes, and on reads too.

With ``NMBATCH_API_KEY`` unset every route is open. When it is set:

- writes (``POST /samples``) need the key;
- with ``NMBATCH_API_KEY_READS=true`` reads need it too (``GET /centroids``, ``GET`` and
  ``POST /assign``, ``GET /stats``, ``GET /metrics``);
- ``GET /healthz`` and ``GET /readyz`` always stay open, for orchestrators and load
  balancers, and so do the API documentation pages.

A missing or wrong key is a ``401`` problem with ``WWW-Authenticate: Bearer``
(``error="invalid_token"`` when a key was sent). The check runs before the body is read,
so an unauthenticated upload costs nothing. The comparison is constant-time
(:func:`hmac.compare_digest` over SHA-256 digests, so not even the key's length shows in
the timing), and neither the key nor the token sent is ever logged or echoed: the
setting is a :class:`pydantic.SecretStr`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from nmbatch.service.config import Settings
from nmbatch.service.problems import ProblemError

__all__ = [
    "OPTIONAL_KEY",
    "bearer_scheme",
    "key_matches",
    "require_read_key",
    "require_write_key",
]

REALM = "nmbatch"

#: Documents the scheme in OpenAPI; ``auto_error=False`` so the key stays optional and
#: every refusal is this module's problem answer.
bearer_scheme = HTTPBearer(
    scheme_name="apiKey",
    description="NMBATCH_API_KEY, when the service has one (writes; reads too with "
    "NMBATCH_API_KEY_READS=true).",
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


def _verify(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> None:
    assert settings.api_key is not None
    if credentials is None:
        raise ProblemError(
            401,
            "unauthorized",
            "this endpoint needs the service's API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": f'Bearer realm="{REALM}"'},
        )
    if not key_matches(credentials.credentials, settings.api_key.get_secret_value()):
        raise ProblemError(
            401,
            "unauthorized",
            "the API key sent in 'Authorization: Bearer' is not the service's",
            headers={"WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token"'},
        )


async def require_write_key(request: Request, credentials: Credentials) -> None:
    """FastAPI dependency of write routes: the API key, when one is configured."""
    settings: Settings = request.app.state.settings
    if settings.api_key is not None:
        _verify(settings, credentials)


async def require_read_key(request: Request, credentials: Credentials) -> None:
    """FastAPI dependency of read routes: the API key when configured for reads too."""
    settings: Settings = request.app.state.settings
    if settings.api_key is not None and settings.api_key_reads:
        _verify(settings, credentials)
