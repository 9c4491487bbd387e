"""The registry of named models in Redis, their settings, memory budget and removal.

``nmbatch:models`` (hash): one field per named model (``PUT /models/{name}``), its value
the model's :class:`ModelSpec` as JSON. Every service process on the Redis reads it at
start-up and starts every model it names, so a restart brings them all back and a second
process serves them too. The model's own keys are those of :mod:`nmbatch.service.
storage.keys` under the prefix ``nmbatch:{name}:`` (``log``, ``meta``, ``snapshot``,
``lock``, ``base:{g}``, ``idempotency:{sha256}``); :func:`purge_model` deletes them all.
A name cannot hold ``:``, so ``nmbatch:{name}:*`` matches no other model's keys, and
the registry's keys (no trailing ``:``) are no model's keys.

Who may do what (several services, each with its own ``NMBATCH_MODEL``, may share one
Redis): a service is named by its default model's name. ``nmbatch:model-owners`` (hash)
records, per named model, the service that created it; ``nmbatch:default-models`` (hash)
every name some service runs as its default model (set when it starts, never removed).
``PUT`` creates a model only if no service runs it as a default and Redis holds no data
under its name; it finds or replaces nothing of a model another service created (403,
its settings not shown). ``DELETE`` removes only a model this service created (or one
registered before owners were recorded), never a default model. Creating and deleting
set and delete the model's ``generation`` key in the same script as its entry
(:mod:`nmbatch.service.storage.keys`), which every append checks.

An entry that does not validate (written by hand, or by another version) is kept apart
(:meth:`ModelRegistry.entries`): its model is not started, nor is its data ever purged
for it; it still counts toward ``NMBATCH_MAX_MODELS``, and ``/stats`` and ``GET
/models`` show it until it is fixed or deleted.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

import numpy as np
import orjson
import redis.asyncio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nmbatch.service.config import Settings
from nmbatch.service.storage.capacity import (
    MEMORY_FRACTION,
    REDIS_SAMPLES,
    engine_bytes_per_vector,
    redis_bytes_per_vector,
    versions_footprint,
)
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.storage.seed import encode_seed, seed_bytes

__all__ = [
    "CENTROID_BYTES",
    "CREATED",
    "DEFAULTS_KEY",
    "DEFAULT_MODEL",
    "EXISTS",
    "FULL",
    "NAME_PATTERN",
    "NOT_OWNED",
    "ORPHAN_DATA",
    "OWNERS_KEY",
    "REGISTRY_KEY",
    "ModelRegistry",
    "ModelSpec",
    "fitting_samples",
    "model_budget",
    "purge_model",
    "required_bytes",
    "settings_for",
    "spec_of",
]

REGISTRY_KEY = "nmbatch:models"
"""Hash of the named models: field = name, value = the :class:`ModelSpec` as JSON."""
OWNERS_KEY = "nmbatch:model-owners"
"""Hash: field = a named model, value = the service (its ``NMBATCH_MODEL``) that created it."""
DEFAULTS_KEY = "nmbatch:default-models"
"""Hash: field = the default model of a service that started on this Redis, value = when."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
"""A model name: 1 to 64 letters, digits, ``_``, ``.``, ``-``, starting with a letter or
digit (so never ``.`` or ``..`` in a URL path)."""
CENTROID_BYTES = 16
"""Bytes per centroid coordinate allowed for in a model's memory (``16 k d``): the
``float32`` centroids and a few ``float32``/``float64`` copies and sums the engine keeps
while it iterates and publishes. An allowance, not a measurement."""

_F = Settings.model_fields  # the same bounds and descriptions as the NMBATCH_* settings
Init = _F["init"].annotation  # Literal["k-means++", "first"]
Retention = _F["retention"].annotation  # Literal["all", "window", "age", "reservoir"]
Metric = _F["metric"].annotation  # Literal["euclidean", "cosine"]


class ModelSpec(BaseModel):
    """The settings of a named model: the body of ``PUT /models/{name}``.

    Each field is the ``NMBATCH_*`` setting of the same name with its bounds, checked by
    the same rules as :class:`~nmbatch.service.config.Settings` (a window or reservoir
    below ``k`` is refused, ``age`` needs ``max_age_seconds`` ...). Unlike the default
    model, ``dim`` is required (the memory a model may take is checked when it is
    created), and ``seed`` is a non-negative integer below 2^63. An entry written before
    ``metric`` existed has none: its model is Euclidean, as it was.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    k: int = _F["k"]
    dim: int = Field(ge=1, le=1_000_000, description="Dimension of the vectors (required).")
    rho: float = _F["rho"]
    batch_size: int = Field(5000, ge=1, le=1 << 62, description="Initial nested batch size b.")
    seed: int | None = Field(
        None, ge=0, lt=1 << 63, description="Seed of the store shuffle and the init."
    )
    init: Init = _F["init"]  # type: ignore[valid-type]
    retention: Retention = _F["retention"]  # type: ignore[valid-type]
    max_samples: int | None = _F["max_samples"]
    max_age_seconds: float | None = _F["max_age_seconds"]
    metric: Metric = _F["metric"]  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _settings_rules(self) -> ModelSpec:
        try:
            Settings.model_validate(self.model_dump())  # the rules of config.py, no env read
        except ValidationError as exc:
            messages = [str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()]
            raise ValueError(_field_names("; ".join(messages))) from None
        return self


def _field_names(text: str) -> str:
    """``text`` with the ``NMBATCH_*`` names of the spec's fields as the fields' names."""
    for name in ModelSpec.model_fields:
        text = text.replace(f"NMBATCH_{name.upper()}", name)
    return text


def spec_of(settings: Settings) -> dict[str, Any]:
    """The spec fields of ``settings`` (the default model's, as ``GET /models`` shows)."""
    return {name: getattr(settings, name) for name in ModelSpec.model_fields}


def settings_for(base: Settings, name: str, spec: ModelSpec, max_samples: int) -> Settings:
    """The service ``base`` settings with the model ``name``'s spec.

    ``max_samples``: the capacity (or retention size) the model runs with: the spec's,
    or the one its memory budget fits (:func:`fitting_samples`).
    """
    values = spec.model_dump() | {"model": name, "max_samples": max_samples}
    return base.model_copy(update=values)


def model_budget(settings: Settings, memory: tuple[int, str]) -> tuple[int, str]:
    """Bytes one named model may fill, and where the figure comes from.

    ``NMBATCH_MODEL_MAX_BYTES``, else ``MEMORY_FRACTION`` of ``memory`` (the process's
    limit, :func:`~nmbatch.service.storage.capacity.memory_limit`) shared by
    ``NMBATCH_MAX_MODELS + 1`` models.
    """
    if settings.model_max_bytes is not None:
        return settings.model_max_bytes, "NMBATCH_MODEL_MAX_BYTES"
    total, origin = memory
    share = int(MEMORY_FRACTION * total) // (settings.max_models + 1)
    return share, (
        f"{MEMORY_FRACTION:g} x {total / 2**30:.2f} GiB ({origin}) / "
        f"(NMBATCH_MAX_MODELS + 1 = {settings.max_models + 1})"
    )


def _sample_bytes(spec: ModelSpec, with_redis: bool) -> int:
    """Bytes per retained sample: the engine's, and Redis's times what its log may hold."""
    redis_part = redis_bytes_per_vector(spec.dim) * REDIS_SAMPLES[spec.retention]
    return engine_bytes_per_vector(spec.dim, spec.k) + (redis_part if with_redis else 0)


def _fixed_bytes(spec: ModelSpec, keep: tuple[int, int], with_redis: bool) -> int:
    """Bytes that do not grow with the samples: centroids, the versions of ``keep``
    (``NMBATCH_KEEP_VERSIONS``, ``NMBATCH_KEEP_VERSIONS_BYTES``; :func:`versions_footprint`),
    and the seed's centroids in Redis of a seeded model (``init="given"``: ``4 k d``)."""
    versions = versions_footprint(keep, spec.k, spec.dim, with_redis=with_redis)
    seed = seed_bytes(spec.k, spec.dim) if spec.init == "given" and with_redis else 0
    return CENTROID_BYTES * spec.k * spec.dim + versions + seed


def required_bytes(
    spec: ModelSpec, max_samples: int, *, with_redis: bool, keep: tuple[int, int] = (0, 0)
) -> int:
    """Memory of a model holding ``max_samples`` samples: samples, centroids, and the
    versions it keeps."""
    return max_samples * _sample_bytes(spec, with_redis) + _fixed_bytes(spec, keep, with_redis)


def fitting_samples(
    spec: ModelSpec, budget: int, *, with_redis: bool, keep: tuple[int, int] = (0, 0)
) -> int:
    """Most samples a model of ``spec`` holds within ``budget`` bytes (0 if none)."""
    free = budget - _fixed_bytes(spec, keep, with_redis)
    return max(0, math.floor(free / _sample_bytes(spec, with_redis)))


# Creates the model's entry unless it exists, the registry is full, the name is a default
# model or holds data nobody registered, in one step; sets its new generation.
# KEYS: registry, owners, defaults, the model's generation, meta, log, snapshot, seed.
# ARGV: name, spec JSON, most models, owner (this service), generation token, the seed's
# centroids (raw float32; '' for none), its k, its dim.
# Returns {1, spec} created, {0, existing spec} exists (this service's, or ownerless),
# {-1, count} full, {-2, ''} a default model, {-3, ''} another service's, {-4, ''} data.
_CREATE = """
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return {-2, ''} end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local owner = redis.call('HGET', KEYS[2], ARGV[1])
  if owner and owner ~= ARGV[4] then return {-3, ''} end
  return {0, current}
end
if redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[7]) > 0 then return {-4, ''} end
local count = redis.call('HLEN', KEYS[1])
if count >= tonumber(ARGV[3]) then return {-1, tostring(count)} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
redis.call('SET', KEYS[4], ARGV[5])
redis.call('DEL', KEYS[8])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[8], 'k', ARGV[7], 'dim', ARGV[8], 'x', ARGV[6])
end
return {1, ARGV[2]}
"""

# Unregisters a model and deletes its generation, in one step, unless it is a default
# model or another service's. KEYS: registry, owners, defaults, the model's generation.
# ARGV: name, owner (this service). Returns 1 removed, 0 not registered, -2 a default
# model, -3 another service's.
_REMOVE = """
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return -2 end
local owner = redis.call('HGET', KEYS[2], ARGV[1])
if owner and owner ~= ARGV[2] then return -3 end
redis.call('DEL', KEYS[4])
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
"""

# The generation of a running model: its own, set now if it has none (a model of an
# earlier version), only while it is registered (a named one) or always (a default one).
# KEYS: the model's generation, registry. ARGV: name, new token, 1 if named.
_CLAIM = """
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return false end
redis.call('SET', KEYS[1], ARGV[2], 'NX')
return redis.call('GET', KEYS[1])
"""

# A model re-clustered with another k, in one step: its spec (a named model's entry, only
# while it is the one read: ARGV[2]), the meta's k and reclustered_at, the snapshot and the
# seed deleted (a worker still on the old k then writes no snapshot: write_snapshot checks
# the meta's k under its watch of the snapshot). Samples, log, versions and pin are kept.
# KEYS: registry, meta, snapshot, seed. ARGV: name ('' for a default model), the spec JSON
# read, the new spec JSON, the new k, the time. Returns 1 done, 0 the entry changed since.
_RECLUSTER = """
if ARGV[1] ~= '' then
  if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
redis.call('HSET', KEYS[2], 'k', ARGV[4], 'reclustered_at', ARGV[5])
redis.call('DEL', KEYS[3], KEYS[4])
return 1
"""

CREATED, EXISTS, FULL, DEFAULT_MODEL, NOT_OWNED, ORPHAN_DATA = 1, 0, -1, -2, -3, -4
"""Outcomes of :meth:`ModelRegistry.create` (and, the two refusals, of ``remove``)."""


class ModelRegistry:
    """The ``nmbatch:models`` hash and its companions, through the handlers' async client.

    ``owner``: the service's name (its default model's, ``NMBATCH_MODEL``), recorded as
    the creator of the models it creates.
    """

    def __init__(self, client: redis.asyncio.Redis, owner: str = "default") -> None:
        self.client = client
        self.owner = owner
        self._create = client.register_script(_CREATE)
        self._remove = client.register_script(_REMOVE)
        self._claim = client.register_script(_CLAIM)
        self._recluster = client.register_script(_RECLUSTER)

    async def entries(self) -> tuple[dict[str, ModelSpec], dict[str, str]]:
        """Every registered model's spec by name, and, apart, the entries that do not
        validate (name -> why)."""
        raw = await self.client.hgetall(REGISTRY_KEY)
        valid: dict[str, ModelSpec] = {}
        invalid: dict[str, str] = {}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            try:
                valid[name] = _validate(value)
            except ValueError as exc:
                invalid[name] = str(exc)
        return dict(sorted(valid.items())), dict(sorted(invalid.items()))

    async def all(self) -> dict[str, ModelSpec]:
        """Every registered model's spec, by name (entries that do not validate are left
        out: :meth:`entries` has them)."""
        return (await self.entries())[0]

    async def get(self, name: str) -> ModelSpec | None:
        """The spec of ``name``, or None if no such model is registered. Raises
        ``ValueError`` (why) if its entry does not validate."""
        value = await self.client.hget(REGISTRY_KEY, name)
        return None if value is None else _validate(value)

    async def registered(self, name: str) -> bool:
        """True if ``name`` has an entry, valid or not."""
        return bool(await self.client.hexists(REGISTRY_KEY, name))

    async def mark_default(self, name: str) -> None:
        """Record ``name`` as a service's default model (never created nor deleted
        through another service)."""
        await self.client.hsetnx(DEFAULTS_KEY, name, repr(time.time()))

    async def create(
        self, name: str, spec: ModelSpec, max_models: int, seed: np.ndarray | None = None
    ) -> tuple[int, Any]:
        """Register ``name`` unless it exists or ``max_models`` are registered; with
        ``seed`` (``(k, d)`` float32, for ``init="given"``), keep it as the model's seed
        (:mod:`~nmbatch.service.storage.seed`) in the same step.

        Returns ``(CREATED, spec)``, ``(EXISTS, existing spec)`` (a :class:`ModelSpec`,
        or None if unreadable), ``(FULL, number registered)``, or ``(DEFAULT_MODEL |
        NOT_OWNED | ORPHAN_DATA, None)``.
        """
        keys = ModelKeys(name)
        body = orjson.dumps(spec.model_dump())
        fields = encode_seed(seed) if seed is not None else {"x": b"", "k": 0, "dim": 0}
        status, value = await self._create(
            keys=[REGISTRY_KEY, OWNERS_KEY, DEFAULTS_KEY, keys.generation, keys.meta,
                  keys.log, keys.snapshot, keys.seed],
            args=[name, body, max_models, self.owner, secrets.token_hex(16),
                  fields["x"], fields["k"], fields["dim"]],
        )  # fmt: skip
        status = int(status)
        if status == CREATED:
            return status, spec
        if status == EXISTS:
            try:
                return status, _validate(value)
            except ValueError:
                return status, None
        if status == FULL:
            return status, int(value)
        return status, None

    async def remove(self, name: str) -> int:
        """Unregister ``name`` (and delete its generation): 1 removed, 0 not registered,
        ``DEFAULT_MODEL`` or ``NOT_OWNED`` refused."""
        keys = ModelKeys(name)
        return int(
            await self._remove(
                keys=[REGISTRY_KEY, OWNERS_KEY, DEFAULTS_KEY, keys.generation],
                args=[name, self.owner],
            )
        )

    async def recluster(
        self, name: str, k: int, *, current: ModelSpec | None, new: ModelSpec | None
    ) -> bool:
        """Change model ``name``'s ``k`` in one step (see ``_RECLUSTER``): a named model's
        entry from ``current`` to ``new`` (False, nothing changed, if the entry is no
        longer ``current``); a default model (both None) only in its meta."""
        keys = ModelKeys(name)
        named = current is not None and new is not None
        done = await self._recluster(
            keys=[REGISTRY_KEY, keys.meta, keys.snapshot, keys.seed],
            args=[name if named else "",
                  orjson.dumps(current.model_dump()) if named else b"",
                  orjson.dumps(new.model_dump()) if named else b"",
                  k, repr(time.time())],
        )  # fmt: skip
        return bool(int(done))

    async def seed(self, name: str) -> bytes | None:
        """The raw ``float32`` centroids model ``name`` was seeded with, or None."""
        value = await self.client.hget(ModelKeys(name).seed, "x")
        return bytes(value) if value is not None else None

    async def claim_generation(self, name: str, *, named: bool) -> str | None:
        """The generation token of model ``name`` (set now if it has none); None if it is
        ``named`` and no longer registered."""
        value = await self._claim(
            keys=[ModelKeys(name).generation, REGISTRY_KEY],
            args=[name, secrets.token_hex(16), 1 if named else 0],
        )
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    async def generations(self, names: list[str]) -> list[str | None]:
        """The generation token of each model of ``names`` (None: it has none)."""
        if not names:
            return []
        values = await self.client.mget([ModelKeys(n).generation for n in names])
        return [v.decode() if isinstance(v, bytes) else v for v in values]


def _validate(value: bytes | str) -> ModelSpec:
    """The spec of a registry entry; ``ValueError`` saying why if it does not validate."""
    try:
        return ModelSpec.model_validate(orjson.loads(value))
    except ValidationError as exc:
        raise ValueError(
            "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
                      for e in exc.errors(include_input=False))
        ) from None
    except ValueError as exc:  # orjson.JSONDecodeError
        raise ValueError(f"not JSON: {exc}") from None


async def purge_model(client: redis.asyncio.Redis, name: str) -> int:
    """Delete every key of model ``name`` (``nmbatch:{name}:*``); returns how many."""
    removed = 0
    pattern = ModelKeys(name).prefix + "*"
    batch: list[bytes] = []
    async for key in client.scan_iter(match=pattern, count=500):
        batch.append(key)
        if len(batch) >= 500:
            removed += int(await client.delete(*batch))
            batch = []
    if batch:
        removed += int(await client.delete(*batch))
    return removed
