"""The registry of named models in Redis, their settings, memory budget and removal.

``nmbatch:models`` (hash): one field per named model (``PUT /models/{name}``), its value
the model's :class:`ModelSpec` as JSON. Every service process on the Redis reads it at
start-up and starts every model it names, so a restart brings them all back and a second
process serves them too. The model's own keys are those of :mod:`nmbatch.service.
storage.keys` under the prefix ``nmbatch:{name}:`` (``log``, ``meta``, ``snapshot``,
``lock``, ``base:{g}``, ``idempotency:{sha256}``); :func:`purge_model` deletes them all.
A name cannot hold ``:``, so ``nmbatch:{name}:*`` matches no other model's keys, and
the registry's key (no trailing ``:``) is no model's key.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import redis.asyncio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nmbatch.service.config import Settings
from nmbatch.service.storage.capacity import (
    MEMORY_FRACTION,
    REDIS_SAMPLES,
    engine_bytes_per_vector,
    redis_bytes_per_vector,
)
from nmbatch.service.storage.keys import ModelKeys

__all__ = [
    "CENTROID_BYTES",
    "NAME_PATTERN",
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


class ModelSpec(BaseModel):
    """The settings of a named model: the body of ``PUT /models/{name}``.

    Each field is the ``NMBATCH_*`` setting of the same name with its bounds, checked by
    the same rules as :class:`~nmbatch.service.config.Settings` (a window or reservoir
    below ``k`` is refused, ``age`` needs ``max_age_seconds`` ...). Unlike the default
    model, ``dim`` is required (the memory a model may take is checked when it is
    created), and ``seed`` is a non-negative integer below 2^63.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

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


def required_bytes(spec: ModelSpec, max_samples: int, *, with_redis: bool) -> int:
    """Memory of a model holding ``max_samples`` samples: samples plus centroids."""
    return max_samples * _sample_bytes(spec, with_redis) + CENTROID_BYTES * spec.k * spec.dim


def fitting_samples(spec: ModelSpec, budget: int, *, with_redis: bool) -> int:
    """Most samples a model of ``spec`` holds within ``budget`` bytes (0 if none)."""
    free = budget - CENTROID_BYTES * spec.k * spec.dim
    return max(0, math.floor(free / _sample_bytes(spec, with_redis)))


# Creates the model's entry unless it exists or the registry is full, in one step.
# KEYS[1] registry; ARGV: name, spec JSON, most models.
# Returns {1, spec} created, {0, existing spec} existed, {-1, count} full.
_CREATE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then return {0, current} end
local count = redis.call('HLEN', KEYS[1])
if count >= tonumber(ARGV[3]) then return {-1, tostring(count)} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {1, ARGV[2]}
"""


class ModelRegistry:
    """The ``nmbatch:models`` hash, through the request handlers' async client."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self._create = client.register_script(_CREATE)

    async def all(self) -> dict[str, ModelSpec]:
        """Every registered model's spec, by name (entries that no longer validate are
        skipped)."""
        raw = await self.client.hgetall(REGISTRY_KEY)
        out: dict[str, ModelSpec] = {}
        for name, value in raw.items():
            spec = _parse(value)
            if spec is not None:
                out[name.decode() if isinstance(name, bytes) else name] = spec
        return dict(sorted(out.items()))

    async def get(self, name: str) -> ModelSpec | None:
        """The spec of ``name``, or None if no such model is registered."""
        return _parse(await self.client.hget(REGISTRY_KEY, name))

    async def create(self, name: str, spec: ModelSpec, max_models: int) -> tuple[int, Any]:
        """Register ``name`` unless it exists or ``max_models`` are registered.

        Returns ``(1, spec)`` created, ``(0, existing spec)`` (a :class:`ModelSpec`, or
        None if unreadable) or ``(-1, number registered)``.
        """
        body = orjson.dumps(spec.model_dump())
        status, value = await self._create(keys=[REGISTRY_KEY], args=[name, body, max_models])
        status = int(status)
        if status == 1:
            return 1, spec
        if status == 0:
            return 0, _parse(value)
        return -1, int(value)

    async def remove(self, name: str) -> bool:
        """Unregister ``name``; True if it was registered."""
        return bool(await self.client.hdel(REGISTRY_KEY, name))


def _parse(value: bytes | str | None) -> ModelSpec | None:
    if value is None:
        return None
    try:
        return ModelSpec.model_validate(orjson.loads(value))
    except (ValueError, ValidationError):
        return None


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
