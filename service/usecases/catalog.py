"""The ``/models`` use cases: create, describe, list and delete models.

They work on the app's one model registry (:class:`nmbatch.service.models.ModelManager`)
and answer documents shaped like the ``ModelInfo`` schema. The default model
(``NMBATCH_MODEL``) is listed first and described like any other; it is created by the
service's settings, so ``PUT`` finds it only with those settings, and it cannot be
deleted.
"""

from __future__ import annotations

import logging
from typing import Any

from nmbatch.service.models.manager import ModelManager, RunningModel, StartupError, unknown_model
from nmbatch.service.models.registry import ModelSpec, purge_model, spec_of
from nmbatch.service.problems import ProblemError

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
    """The ``GET /models/{name}`` document of model ``name`` (``404`` if unknown)."""
    return _document(name, await models.running_model(name))


async def list_models(models: ModelManager) -> list[dict[str, Any]]:
    """Every model: the default one first, then the registered ones by name."""
    out = [await describe_model(models, models.default_name)]
    for name, spec in (await models.registry.all()).items():
        if name == models.default_name:
            continue
        try:
            out.append(await describe_model(models, name))
        except ProblemError as exc:
            if exc.status == 404:  # deleted in between
                continue
            # Registered but refused here (Redis holds other k/dim, memory): say why.
            status = {"role": "none", "phase": f"not started: {exc.detail}"[:300],
                      "version": None, "n_samples": 0, "converged": False}  # fmt: skip
            out.append({"name": name, "default": False, "settings": spec.model_dump(),
                        "max_samples": None, "status": status})  # fmt: skip
    return out


def _conflict(name: str, current: dict[str, Any] | None) -> ProblemError:
    return ProblemError(
        409,
        "model-conflict",
        f"model '{name}' exists with other settings; DELETE it first (its data goes "
        "with it) or PUT its current settings",
        title="Model conflict",
        model=name,
        current=current,
    )


async def create_model(
    models: ModelManager, name: str, spec: ModelSpec
) -> tuple[bool, dict[str, Any]]:
    """Create model ``name`` with ``spec``, or find it with the same spec.

    Returns ``(created, document)``. Problems: ``409`` ``model-conflict`` (another
    spec, or Redis holds the name's data with another ``k``/``dim``), ``409``
    ``too-many-models``, ``422`` ``model-too-large``, ``422`` ``dimension-too-large``.
    """
    settings = models.settings
    if name == models.default_name:
        current = spec_of(settings)
        if current != spec.model_dump():
            raise _conflict(name, current)
        return False, await describe_model(models, name)
    if spec.dim > settings.max_dim:
        raise ProblemError(
            422, "dimension-too-large",
            f"dim = {spec.dim} is above NMBATCH_MAX_DIM = {settings.max_dim}",
            title="Dimension too large", setting="NMBATCH_MAX_DIM",
            max_dim=settings.max_dim,
        )  # fmt: skip
    models.capacity(name, spec)  # 422 before anything is written
    async with models.lock:
        status, value = await models.registry.create(name, spec, settings.max_models)
        if status == -1:
            raise ProblemError(
                409, "too-many-models",
                f"{value} named models exist, NMBATCH_MAX_MODELS = "
                f"{settings.max_models}; delete one or raise the setting",
                title="Too many models", setting="NMBATCH_MAX_MODELS",
                max_models=settings.max_models,
            )  # fmt: skip
        if status == 0 and value != spec:
            raise _conflict(name, value.model_dump() if value is not None else None)
        try:
            await models.start_named(name, spec)
        except StartupError as exc:
            if status == 1:  # registered just now: leave no entry behind
                await models.registry.remove(name)
            raise ProblemError(
                409, "model-conflict", str(exc), title="Model conflict", model=name
            ) from None
    return status == 1, await describe_model(models, name)


async def delete_model(models: ModelManager, name: str) -> int:
    """Remove model ``name``: unregistered, its worker stopped, its keys deleted.

    Returns the number of Redis keys deleted. The default model cannot be deleted
    (``409`` ``default-model``); an unknown one is a ``404``.
    """
    if name == models.default_name:
        raise ProblemError(
            409, "default-model",
            f"'{name}' is the service's default model (NMBATCH_MODEL); it cannot be "
            "deleted through the API", title="Default model", model=name,
        )  # fmt: skip
    async with models.lock:
        registered = await models.registry.remove(name)
        stopped = await models.stop(name)
        if not registered and not stopped:
            raise unknown_model(name)
        removed = await purge_model(models.client, name)
    log.info("model '%s' deleted (%d Redis keys)", name, removed)
    return removed
