"""The ``/models`` use cases: create, describe, list and delete models.

They work on the app's one model registry (:class:`nmbatch.service.models.ModelManager`)
and answer documents shaped like the ``ModelInfo`` schema. The default model
(``NMBATCH_MODEL``) is listed first and described like any other; it is created by the
service's settings, so ``PUT`` finds it only with those settings, and it cannot be
deleted. A service creates, finds and deletes only the named models it created (their
registry entry records it, :mod:`nmbatch.service.models.registry`): another service's
default model, a model another service created, and a name under which Redis holds data
nobody registered are refused (:class:`ModelNotOwnedError`) without showing their
settings. Refusals are the domain errors of :mod:`nmbatch.service.usecases.errors`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from nmbatch.engine.metric import ZeroRowError
from nmbatch.engine.seeding.given import GivenCentroidsError, given_centroids
from nmbatch.service.models.manager import ModelManager, RunningModel, StartupError
from nmbatch.service.models.registry import (
    CREATED,
    DEFAULT_MODEL,
    FULL,
    NOT_OWNED,
    ORPHAN_DATA,
    ModelSpec,
    purge_model,
    spec_of,
)
from nmbatch.service.usecases.errors import (
    DefaultModelError,
    DimensionTooLargeError,
    DomainError,
    InvalidInitError,
    ModelCannotStartError,
    ModelConflictError,
    ModelNotOwnedError,
    TooManyModelsError,
    UnknownModelError,
)

__all__ = ["create_model", "delete_model", "describe_model", "list_models", "seed_of"]

log = logging.getLogger("service")


def _document(name: str, running: RunningModel) -> dict[str, Any]:
    """The ``ModelInfo`` document of a running model."""
    handle = running.handle
    course = handle.board.stats
    model = handle.board.model
    worker = handle.worker
    if running.default:  # its NMBATCH_MAX_SAMPLES may be unset: the planned capacity
        max_samples = handle.capacity.max_samples if handle.capacity else None
    else:
        max_samples = handle.settings.max_samples
    return {
        "name": name,
        "default": running.default,
        "settings": running.spec,
        "max_samples": max_samples,
        "status": {
            "role": str(worker.role),
            "phase": str(worker.phase) if worker.error is None else "failed",
            "version": model.version if model is not None else None,
            "n_samples": course.n_samples,
            "converged": course.converged,
        },
    }


async def describe_model(models: ModelManager, name: str) -> dict[str, Any]:
    """The ``GET /models/{name}`` document of model ``name``.

    Raises :class:`UnknownModelError` if there is none, :class:`ModelCannotStartError`
    or :class:`ModelTooLargeError` if it cannot start here.
    """
    return _document(name, await models.running_model(name))


def _not_started(name: str, why: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The ``ModelInfo`` document of a registered model that does not run here."""
    status = {"role": "none", "phase": f"not started: {why}"[:300], "version": None,
              "n_samples": 0, "converged": False}  # fmt: skip
    return {"name": name, "default": False, "settings": settings, "max_samples": None,
            "status": status}  # fmt: skip


async def list_models(models: ModelManager) -> list[dict[str, Any]]:
    """Every model: the default one first, then the registered ones by name (those whose
    entry does not validate too, with why)."""
    out = [await describe_model(models, models.default_name)]
    registered, invalid = await models.registry.entries()
    for name, why in invalid.items():
        out.append(_not_started(name, f"its registry entry is not valid ({why})", {}))
    for name, spec in registered.items():
        if name == models.default_name:
            continue
        try:
            out.append(await describe_model(models, name))
        except UnknownModelError:  # deleted in between
            continue
        except DomainError as exc:
            # Registered but refused here (Redis holds other k/dim, memory): say why.
            out.append(_not_started(name, exc.detail, spec.model_dump()))
    return [out[0], *sorted(out[1:], key=lambda doc: doc["name"])]


def seed_of(name: str, spec: ModelSpec, init: object) -> np.ndarray:
    """The centroids ``init`` (a ``(k, dim)`` matrix: a list of lists, an array) as model
    ``name`` of ``spec`` starts from (:func:`~nmbatch.engine.seeding.given.given_centroids`:
    ``float32``, finite, unit rows under cosine). Raises :class:`InvalidInitError` naming
    the fault."""
    try:
        return given_centroids(init, spec.k, spec.dim, spec.metric)
    except ZeroRowError as exc:
        raise InvalidInitError(name, "zero-row", str(exc), row=exc.row) from None
    except GivenCentroidsError as exc:
        raise InvalidInitError(name, exc.what, str(exc)) from None


async def create_model(
    models: ModelManager, name: str, spec: ModelSpec, init: object = None
) -> tuple[bool, dict[str, Any]]:
    """Create model ``name`` with ``spec``, or find it with the same spec.

    ``init``: the initial centroids (``(k, dim)``; with ``spec.init == "given"``), checked
    by :func:`seed_of` before anything is written and kept with the model's entry in one
    step; the same spec with other centroids is a conflict.

    Returns ``(created, document)``. Raises :class:`ModelConflictError` (another
    spec), :class:`ModelNotOwnedError` (another service's default model or model, or
    Redis holds data under the name that no registered model owns),
    :class:`ModelCannotStartError` (it cannot start here), :class:`TooManyModelsError`,
    :class:`ModelTooLargeError`, :class:`DimensionTooLargeError`,
    :class:`InvalidInitError` (centroids missing, or not usable).
    """
    settings = models.settings
    seed = None
    if spec.init == "given" or init is not None:
        if init is None or spec.init != "given":
            raise InvalidInitError(name, "missing", "init=given and the centroids go together "
                                   "(init as a list of lists, or an npy body)")  # fmt: skip
        seed = seed_of(name, spec, init)
    if name == models.default_name:
        current = spec_of(settings)
        if current != spec.model_dump():
            raise ModelConflictError(name, current)
        return False, await describe_model(models, name)
    if spec.dim > settings.max_dim:
        raise DimensionTooLargeError(spec.dim, settings.max_dim)
    models.capacity(name, spec)  # ModelTooLargeError before anything is written
    async with models.lock:
        status, value = await models.registry.create(name, spec, settings.max_models, seed)
        if status == FULL:
            raise TooManyModelsError(value, settings.max_models)
        if status in (DEFAULT_MODEL, NOT_OWNED, ORPHAN_DATA):
            raise _not_owned(name, status)
        if status != CREATED and (value != spec or (
            seed is not None and await models.registry.seed(name) != seed.astype("<f4").tobytes()
        )):  # fmt: skip
            raise ModelConflictError(name, value.model_dump() if value is not None else None)
        try:
            await models.start_named(name, spec)
        except StartupError as exc:
            if status == CREATED:  # registered just now: leave nothing behind
                await models.registry.remove(name)
                await purge_model(models.client, name)
            raise ModelCannotStartError(name, exc.public) from None
    return status == CREATED, await describe_model(models, name)


def _not_owned(name: str, status: int) -> ModelNotOwnedError:
    """Why this service may not create or delete model ``name`` (a registry refusal)."""
    why = {
        DEFAULT_MODEL: "it is the default model (NMBATCH_MODEL) of another service on "
        "this Redis",
        NOT_OWNED: "it was created by another service on this Redis; only that service "
        "may replace or delete it",
        ORPHAN_DATA: "Redis holds data under this name that no registered model owns "
        "(another service's default model, or what a deletion left behind a moment ago)",
    }[status]
    return ModelNotOwnedError(name, f"model '{name}' is not this service's: {why}")


async def delete_model(models: ModelManager, name: str) -> int:
    """Remove model ``name``: unregistered, its worker stopped, its keys deleted.

    Returns the number of Redis keys deleted. The default model cannot be deleted
    (:class:`DefaultModelError`), nor another service's default model or a model another
    service created (:class:`ModelNotOwnedError`); an unknown one raises
    :class:`UnknownModelError`. The entry and the model's generation go in one step
    before anything else: an append in flight stores nothing from then on.
    """
    if name == models.default_name:
        raise DefaultModelError(name)
    async with models.lock:
        registered = await models.registry.remove(name)
        if registered in (DEFAULT_MODEL, NOT_OWNED):
            raise _not_owned(name, registered)
        stopped = await models.stop(name)
        if not registered and not stopped:
            raise UnknownModelError(name)
        removed = await purge_model(models.client, name)
    log.info("model '%s' deleted (%d Redis keys)", name, removed)
    return removed
