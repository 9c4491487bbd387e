"""``POST /models/{name}/recluster``: the retained samples clustered again with another k.

A re-clustering is a restart of the model with another ``k``: the same path a restart
takes (:meth:`~nmbatch.service.models.ModelManager.restart`: the worker stops after a
last snapshot, a new engine replays the retained log, :mod:`nmbatch.service.worker`),
after one Redis script has changed the model's ``k`` (a named model's registry entry, its
meta's ``k`` and ``reclustered_at``) and deleted its snapshot and its seed
(:meth:`~nmbatch.service.models.registry.ModelRegistry.recluster`). Nothing else is
deleted: the log and the retained base (so every retained sample is clustered again),
the kept versions (readable with ``?version=``; a pin stays, and reads keep serving the
pinned version of the old ``k`` until it is lifted), and the version numbers, which go
on increasing (the reservation in the meta is above every version shown). The new
engine seeds with the model's seeding method (``k-means++`` for a model seeded with given
centroids, which have the old ``k``).

Other processes serving the model: a named model is restarted there at their next
registry sync (its spec changed); a worker still on the old ``k`` writes no snapshot
(:meth:`~nmbatch.service.storage.ModelRepository.write_snapshot` checks ``k``). The
default model of another process takes the new ``k`` at its next restart.
"""

from __future__ import annotations

import logging
from typing import Any

from nmbatch.service.models.manager import ModelManager, StartupError
from nmbatch.service.models.registry import ModelSpec, spec_of
from nmbatch.service.usecases.catalog import describe_model
from nmbatch.service.usecases.errors import (
    ModelCannotStartError,
    ModelConflictError,
    SweepRefusedError,
)

__all__ = ["recluster"]

log = logging.getLogger("service")


def _new_spec(name: str, spec: dict[str, Any], k: int, dim: int | None) -> ModelSpec:
    """``spec`` with ``k`` (and ``init`` k-means++ if it was given centroids), checked by
    the rules of a spec (a window or reservoir below ``k`` ...): :class:`SweepRefusedError`
    naming the rule."""
    init = "k-means++" if spec["init"] == "given" else spec["init"]
    values = spec | {"k": k, "init": init}
    if values.get("dim") is None:  # the default model before its first batch: any dim
        values["dim"] = dim or 1
    try:
        return ModelSpec.model_validate(values)
    except ValueError as exc:
        raise SweepRefusedError(name, "k", f"k = {k} cannot apply to model '{name}': "
                                f"{exc}; nothing changed") from None  # fmt: skip


async def recluster(models: ModelManager, name: str, k: int) -> dict[str, Any]:
    """Cluster model ``name``'s retained samples again with ``k`` clusters; returns its
    ``ModelInfo`` document (the model restarted, replaying its log).

    Raises :class:`UnknownModelError`, :class:`SweepRefusedError` (``k`` breaks a rule
    of its settings), :class:`ModelTooLargeError` (a named model's memory with ``k``),
    :class:`ModelConflictError` (its settings changed meanwhile), or
    :class:`ModelCannotStartError`. Nothing changes when refused.
    """
    running = await models.running_model(name)
    default = running.default
    current = None if default else ModelSpec.model_validate(running.spec)
    new = _new_spec(name, spec_of(running.handle.settings) if default else running.spec, k,
                    running.handle.dim)  # fmt: skip
    if not default:
        models.capacity(name, new)  # ModelTooLargeError before anything changes
    async with models.lock:
        if models.running.get(name) is not running:
            raise ModelConflictError(name, None)  # deleted or restarted in between
        old_k = running.handle.settings.k
        if not await models.registry.recluster(
            name, k, current=current, new=None if default else new
        ):
            raise ModelConflictError(name, running.spec)
        try:
            await models.restart(name, None if default else new)
        except StartupError as exc:
            raise ModelCannotStartError(name, exc.public) from None
    log.info("model '%s' re-clustered: k %d -> %d (the retained log replayed)", name, old_k, k)
    return await describe_model(models, name)
