"""The worker lease of a model (``nmbatch:{model}:lock``) and the version reservation.

The lease value is ``{token}:{run id}:{client id}``, set with ``SET NX PX``. ``token`` is
random per process; ``run id`` (``INFO server``) and ``client id`` (``CLIENT ID``) name
the Redis server run and the connection of the holder's lease, so a contender can see
that the holder is gone (its connection closed: the process died; or Redis restarted
since) before the expiry. Renewed and released by compare-and-set Lua scripts.

The meta hash also holds ``versions_reserved``: the highest centroid version a worker may
have shown. A worker reserves versions in blocks before publishing them (fenced by the
lease, :func:`reserve_versions`), so a worker that starts after a crash numbers its
centroids above anything the dead one served, although the last snapshot may be older. A
clean stop lowers it to the version of the last snapshot. ``versions_reserved_by`` names
the lease that reserved last: a worker whose lease merely expired (Redis frozen) takes it
again only if nobody reserved since.
"""

from __future__ import annotations

import logging
import secrets

import redis

from nmbatch.service.storage.codec import as_str
from nmbatch.service.storage.errors import LeaseLostError
from nmbatch.service.storage.keys import ModelKeys

__all__ = ["WorkerLease", "held_by", "reserve_versions", "reserved_versions"]

log = logging.getLogger(__name__)


def held_by(value: bytes | str | None, token: str) -> bool:
    """True if the lease value ``value`` (None: nobody holds it) is the lease of ``token``."""
    if value is None:
        return False
    return as_str(value).startswith(token + ":")


def reserved_versions(client: redis.Redis, keys: ModelKeys) -> int:
    """``versions_reserved`` of the meta hash: no version shown so far is above it."""
    raw = client.hget(keys.meta, "versions_reserved")
    return int(raw) if raw is not None else 0


def reserve_versions(client: redis.Redis, keys: ModelKeys, lease_token: str, up_to: int) -> int:
    """Raise ``versions_reserved`` to at least ``up_to`` while holding the lease.

    Returns the reservation now stored; raises :class:`LeaseLostError` if the lease
    with ``lease_token`` is not held.
    """
    reply = client.eval(_RESERVE, 2, keys.lock, keys.meta, lease_token + ":", int(up_to))
    if int(reply) < 0:
        raise LeaseLostError("the worker lease is held by another process")
    return int(reply)


# KEYS[1] lock, KEYS[2] meta; ARGV[1] "token:"; ARGV[2] wanted reservation.
_RESERVE = """
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return -1 end
local current = tonumber(redis.call('HGET', KEYS[2], 'versions_reserved') or '0')
local wanted = tonumber(ARGV[2])
if wanted > current then
  redis.call('HSET', KEYS[2], 'versions_reserved', ARGV[2])
  current = wanted
end
redis.call('HSET', KEYS[2], 'versions_reserved_by', ARGV[1])
return current
"""

# KEYS[1] lock, KEYS[2] meta; ARGV[1] "token:", ARGV[2] new value, ARGV[3] ms.
# 1: renewed; 2: had expired and is taken again, as nobody reserved versions since (so
# nobody else worked); 0: lost.
_RENEW = """
local v = redis.call('GET', KEYS[1])
if not v then
  if redis.call('HGET', KEYS[2], 'versions_reserved_by') ~= ARGV[1] then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 2
end
if string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS[1] lock; ARGV[1] value seen, ARGV[2] new value, ARGV[3] ms.
_STEAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

# KEYS[1] lock, KEYS[2] meta; ARGV[1] "token:", ARGV[2] reservation to leave ('' : keep).
_RELEASE = """
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return 0 end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], 'versions_reserved', ARGV[2]) end
redis.call('HDEL', KEYS[2], 'versions_reserved_by')
redis.call('DEL', KEYS[1])
return 1
"""


class WorkerLease:
    """The lease that makes one process the worker of a model (``nmbatch:{model}:lock``).

    ``SET NX PX`` with a random token, renewed before it expires, released by a
    compare-and-delete script. A contender also takes the lease over at once when the
    holder's lease connection is gone from ``CLIENT LIST`` (the holder process died;
    the kernel closed its sockets), else when it expires (host lost, process frozen).

    Parameters
    ----------
    client : redis.Redis
        Created with ``single_connection_client=True``: its ``CLIENT ID`` names the holder.
    model : str
    seconds : float
        Expiry of the lease; renew it well within (a third of it).
    """

    def __init__(self, client: redis.Redis, model: str, seconds: float) -> None:
        self.client = client
        self.keys = ModelKeys(model)
        self.token = secrets.token_hex(16)
        self.ms = max(1, round(seconds * 1000))
        self._prefix = self.token + ":"
        self._check_holder = True

    def _run_id(self) -> str:
        """The Redis server's ``run_id`` (new at every start), or "-" if INFO is refused."""
        try:
            return str(self.client.info("server")["run_id"])
        except redis.ResponseError:  # INFO refused (ACL): restarts go unnoticed
            return "-"

    def _value(self) -> str:
        return f"{self.token}:{self._run_id()}:{self.client.client_id()}"

    def holder(self) -> str | None:
        """The stored lease value, or None when nobody holds it."""
        raw = self.client.get(self.keys.lock)
        return raw.decode() if isinstance(raw, bytes) else raw

    def held(self) -> bool:
        """True if this process holds the lease now."""
        return held_by(self.holder(), self.token)

    def acquire(self) -> bool:
        """Take the lease if free, ours already, or left by a dead holder; True if held."""
        value = self._value()
        if self.client.set(self.keys.lock, value, nx=True, px=self.ms):
            return True
        current = self.holder()
        if current is None:
            return bool(self.client.set(self.keys.lock, value, nx=True, px=self.ms))
        if current.startswith(self._prefix):
            return bool(self.client.eval(_STEAL, 1, self.keys.lock, current, value, self.ms))
        if self._holder_gone(current):
            taken = bool(self.client.eval(_STEAL, 1, self.keys.lock, current, value, self.ms))
            if taken:
                log.warning(
                    "took over the worker lease: its holder's connection (client id %s) is gone",
                    current.rpartition(":")[2],
                )
            return taken
        return False

    def _holder_gone(self, value: str) -> bool:
        """True if the holder's lease connection is not connected to Redis any more."""
        parts = value.split(":")
        if not self._check_holder or len(parts) != 3 or not parts[2].isdigit():
            return False
        run_id, client_id = parts[1], int(parts[2])
        try:
            current = self._run_id()
            if "-" not in (run_id, current) and run_id != current:
                return True  # Redis restarted since: that connection cannot be alive
            return not self.client.client_list(client_id=[client_id])
        except redis.ResponseError as exc:  # CLIENT LIST refused (ACL): wait for expiry
            log.warning("cannot look up the lease holder (%s); relying on expiry only", exc)
            self._check_holder = False
            return False

    def renew(self) -> bool:
        """Extend the lease; False if another process holds it now (we lost it).

        If it expired meanwhile (Redis was frozen or away longer than the expiry) and
        nobody else reserved versions since (``versions_reserved_by`` is still this
        lease), it is taken again.
        """
        reply = self.client.eval(
            _RENEW, 2, self.keys.lock, self.keys.meta, self._prefix, self._value(), self.ms
        )
        return int(reply) > 0

    def release(self, reserved: int | None = None) -> bool:
        """Delete the lease if held; ``reserved`` also resets ``versions_reserved``."""
        arg = "" if reserved is None else str(int(reserved))
        reply = self.client.eval(_RELEASE, 2, self.keys.lock, self.keys.meta, self._prefix, arg)
        return bool(reply)
