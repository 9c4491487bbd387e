"""API keys and what each may do: scopes (``read``, ``write``, ``admin``) and model patterns.

Where keys come from (all three may be combined; a key given twice is refused):

- ``NMBATCH_API_KEY``: one key, scope ``admin`` on every model (the shorthand);
- ``NMBATCH_API_KEYS``: entries separated by ``;`` or new lines, each
  ``<key> <scope> [<pattern> ...]``;
- ``NMBATCH_API_KEY_FILE``: a file of the same entries, one per line (``#`` starts a
  comment; a line with only a key is ``admin``). Keys in a file stay out of
  ``/proc/<pid>/environ`` and of the environment every child process inherits.

Scopes nest: ``read`` (``GET`` centroids, assign, stats, versions, dashboard, models;
``POST /assign``; ``/metrics``) < ``write`` (also ``POST /samples``) < ``admin`` (also
``PUT`` and ``DELETE /models/{name}``, ``POST`` and ``DELETE /pin``). Patterns are
:func:`fnmatch.fnmatchcase` patterns of model names (``tenant-a``, ``tenant-*``); a key
with patterns reaches only the models they match, and no route that spans every model
(``GET /models``, ``/metrics``). A key without patterns reaches every model.

:meth:`KeyRing.find` compares the token sent with every key, each with
:func:`hmac.compare_digest` over SHA-256 digests, and never stops at the first match: the
time it takes shows neither which key matched nor any key's length.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from nmbatch.service.config import Settings

__all__ = ["SCOPES", "Grant", "KeyRing", "KeyRingError", "load_keys", "parse_entries"]

log = logging.getLogger("service")

SCOPES = ("read", "write", "admin")
"""Scopes from the least to the most allowed; each allows what those before it allow."""

MIN_KEY_LENGTH = 16
_KEY_CHARS = re.compile(r"^[A-Za-z0-9\-._~+/=]+$")  # RFC 6750's b64token


class KeyRingError(ValueError):
    """An API key entry cannot be used; the message never contains the key."""


@dataclass(frozen=True)
class Grant:
    """What one key allows: ``scope`` (one of :data:`SCOPES`) on the models ``patterns``
    match (empty: every model)."""

    digest: bytes
    scope: str
    patterns: tuple[str, ...] = ()

    def allows(self, scope: str, model: str | None) -> bool:
        """True if this key may use a route needing ``scope`` on ``model`` (None: a route
        over every model)."""
        if SCOPES.index(self.scope) < SCOPES.index(scope):
            return False
        if not self.patterns:
            return True
        return model is not None and any(fnmatch.fnmatchcase(model, p) for p in self.patterns)


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class KeyRing:
    """Every API key of the service (as SHA-256 digests) with its :class:`Grant`."""

    def __init__(self, grants: list[Grant]) -> None:
        self.grants = list(grants)

    @property
    def empty(self) -> bool:
        """True when no key is configured: every route is open."""
        return not self.grants

    def find(self, token: str) -> Grant | None:
        """The grant of ``token`` (a header value, latin-1 decoded), or None; constant
        time in the token and over the keys."""
        sent = _digest(token.encode("latin-1", errors="replace"))
        found: Grant | None = None
        for grant in self.grants:
            if hmac.compare_digest(sent, grant.digest) and found is None:
                found = grant
        return found


def _parse_entry(text: str, where: str, default_scope: str | None) -> Grant:
    fields = text.split()
    key = fields[0]
    if len(key) < MIN_KEY_LENGTH:
        raise KeyRingError(f"{where}: a key has fewer than {MIN_KEY_LENGTH} characters")
    if not _KEY_CHARS.match(key):
        raise KeyRingError(f"{where}: a key has a character outside letters, digits, -._~+/=")
    if len(fields) == 1:
        if default_scope is None:
            raise KeyRingError(f"{where}: an entry has no scope (read, write or admin)")
        scope = default_scope
    else:
        scope = fields[1]
    if scope not in SCOPES:
        raise KeyRingError(f"{where}: scope {scope!r} is not one of read, write, admin")
    return Grant(_digest(key.encode("utf-8")), scope, tuple(fields[2:]))


def parse_entries(text: str, where: str, *, default_scope: str | None = None) -> list[Grant]:
    """The grants of ``text``: entries separated by ``;`` or new lines, ``#`` comments.

    ``where`` names the source in error messages (which never quote a key).
    """
    grants = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        for entry in line.split(";"):
            if entry.strip():
                grants.append(_parse_entry(entry, where, default_scope))
    return grants


def load_keys(settings: Settings) -> KeyRing:
    """The key ring of ``settings`` (``NMBATCH_API_KEY``, ``NMBATCH_API_KEYS``,
    ``NMBATCH_API_KEY_FILE``); raises :class:`KeyRingError` on an unusable entry or file."""
    grants: list[Grant] = []
    if settings.api_key is not None:
        key = settings.api_key.get_secret_value()
        grants.append(Grant(_digest(key.encode("utf-8")), "admin"))
    if settings.api_keys is not None:
        grants += parse_entries(settings.api_keys.get_secret_value(), "NMBATCH_API_KEYS")
    if settings.api_key_file is not None:
        path = Path(settings.api_key_file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise KeyRingError(f"NMBATCH_API_KEY_FILE {path}: {exc.strerror}") from None
        if path.stat().st_mode & 0o077:
            log.warning("NMBATCH_API_KEY_FILE %s can be read by other users: chmod 600 it", path)
        grants += parse_entries(text, f"NMBATCH_API_KEY_FILE {path}", default_scope="admin")
    if len({g.digest for g in grants}) != len(grants):
        raise KeyRingError("the same API key is given twice (with NMBATCH_API_KEY, "
                           "NMBATCH_API_KEYS or NMBATCH_API_KEY_FILE)")  # fmt: skip
    return KeyRing(grants)
