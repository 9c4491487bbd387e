"""The ``/models`` use cases: create, describe, list and delete models.

They work on the app's one model registry (:class:`nmbatch.service.models.ModelManager`)
and answer documents shaped like the ``ModelInfo`` schema. The default model
(``NMBATCH_MODEL``) is listed first and described like any other; it is created by the
service's settings, so ``PUT`` finds it only with those settings, and it cannot be
deleted. Refusals are the domain errors of :mod:`nmbatch.service.usecases.errors`.
"""

from __future__ import annotations

import logging
from typing import Any

from nmbatch.service.models.manager import ModelManager, RunningModel, StartupError
from nmbatch.service.models.registry import ModelSpec, purge_model, spec_of
from nmbatch.service.usecases.errors import (
    DefaultModelError,
    DimensionTooLargeError,
    DomainError,
    ModelCannotStartError,
    ModelConflictError,
    TooManyModelsError,
    UnknownModelError,
)

__all__ = ["create_model", "delete_model", "describe_model", "list_models"]

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


async def list_models(models: ModelManager) -> list[dict[str, Any]]:
    """Every model: the default one first, then the registered ones by name."""
    out = [await describe_model(models, models.default_name)]
    for name, spec in (await models.registry.all()).items():
        if name == models.default_name:
            continue
        try:
            out.append(await describe_model(models, name))
        except UnknownModelError:  # deleted in between
            continue
        except DomainError as exc:
            # Registered but refused here (Redis holds other k/dim, memory): say why.
            status = {"role": "none", "phase": f"not started: {exc.detail}"[:300],
                      "version": None, "n_samples": 0, "converged": False}  # fmt: skip
            out.append({"name": name, "default": False, "settings": spec.model_dump(),
                        "max_samples": None, "status": status})  # fmt: skip
    return out


async def create_model(
    models: ModelManager, name: str, spec: ModelSpec
) -> tuple[bool, dict[str, Any]]:
    """Create model ``name`` with ``spec``, or find it with the same spec.

    Returns ``(created, document)``. Raises :class:`ModelConflictError` (another
    spec), :class:`ModelCannotStartError` (Redis holds the name's data with another
    ``k``/``dim``), :class:`TooManyModelsError`, :class:`ModelTooLargeError`,
    :class:`DimensionTooLargeError`.
    """
    settings = models.settings
    if name == models.default_name:
        current = spec_of(settings)
        if current != spec.model_dump():
            raise ModelConflictError(name, current)
        return False, await describe_model(models, name)
    if spec.dim > settings.max_dim:
        raise DimensionTooLargeError(spec.dim, settings.max_dim)
    models.capacity(name, spec)  # ModelTooLargeError before anything is written
    async with models.lock:
        status, value = await models.registry.create(name, spec, settings.max_models)
        if status == -1:
            raise TooManyModelsError(value, settings.max_models)
        if status == 0 and value != spec:
            raise ModelConflictError(name, value.model_dump() if value is not None else None)
        try:
            await models.start_named(name, spec)
        except StartupError as exc:
            if status == 1:  # registered just now: leave no entry behind
                await models.registry.remove(name)
            raise ModelCannotStartError(name, exc.public) from None
    return status == 1, await describe_model(models, name)


async def delete_model(models: ModelManager, name: str) -> int:
    """Remove model ``name``: unregistered, its worker stopped, its keys deleted.

    Returns the number of Redis keys deleted. The default model cannot be deleted
    (:class:`DefaultModelError`); an unknown one raises :class:`UnknownModelError`.
    """
    if name == models.default_name:
        raise DefaultModelError(name)
    async with models.lock:
        registered = await models.registry.remove(name)
        stopped = await models.stop(name)
        if not registered and not stopped:
            raise UnknownModelError(name)
        removed = await purge_model(models.client, name)
    log.info("model '%s' deleted (%d Redis keys)", name, removed)
    return removed
