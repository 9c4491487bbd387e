"""The named models of one app: started, looked up, created and deleted.

One :class:`ModelManager` lives in ``app.state.models`` beside the default model's
context (``NMBATCH_MODEL``). Each named model is started by
:func:`nmbatch.service.bootstrap.start_model` with an exit stack of its own: its own
Redis clients, lease, worker thread and engine process, its own metrics registry; they
share the request handlers' async Redis client and, with the embedded Redis, its
``maxmemory`` (the sum of the models' needs). Nothing else is shared: each model's
iterations run in its own engine process, which the OS schedules beside the others.

Models come from the registry in Redis (:mod:`nmbatch.service.models.registry`): all of
them at start-up, a new one on ``PUT``; and every :data:`SYNC_SECONDS` the registry is
read again (:meth:`ModelManager.sync`): a model another process registered starts here
too (as a standby of its worker, ready to take over), one another process deleted is
stopped here. A request naming a model registered since the last sync starts it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from nmbatch.service.bootstrap import StartupError, start_model
from nmbatch.service.config import Settings
from nmbatch.service.context import ServiceContext
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.models.registry import (
    ModelRegistry,
    ModelSpec,
    fitting_samples,
    model_budget,
    purge_model,
    required_bytes,
    settings_for,
    spec_of,
)
from nmbatch.service.problems import ProblemError

__all__ = ["SYNC_SECONDS", "ModelManager", "RunningModel"]

log = logging.getLogger("service")

SYNC_SECONDS = 2.0
"""Seconds between two reads of the registry by :meth:`ModelManager.sync`."""


@dataclass
class RunningModel:
    """A named model started in this process."""

    spec: ModelSpec
    context: ServiceContext
    stack: AsyncExitStack


def unknown_model(name: str) -> ProblemError:
    """The ``404`` problem of a model that does not exist."""
    return ProblemError(
        404,
        "unknown-model",
        f"no model named '{name}': create it with PUT /models/{name}",
        title="Unknown model",
        model=name,
    )


class ModelManager:
    """The named models of one app, and the operations of ``/models``.

    Parameters
    ----------
    settings : Settings
        The service's settings (the default model's, the limits).
    default : ServiceContext
        The default model's context (``NMBATCH_MODEL``).
    url : str
        The Redis every model uses.
    """

    def __init__(self, settings: Settings, default: ServiceContext, url: str) -> None:
        self.settings = settings
        self.default = default
        self.url = url
        self.client: redis.asyncio.Redis = default.sample_log.client
        self.embedded: EmbeddedRedis | None = default.embedded_redis
        self.registry = ModelRegistry(self.client)
        self.budget = model_budget(settings, default.memory)
        self.running: dict[str, RunningModel] = {}
        self._lock = asyncio.Lock()
        self._sync_task: asyncio.Task[None] | None = None
        self._failed: dict[str, str] = {}  # model -> why it could not start (logged)

    @property
    def with_redis(self) -> bool:
        """True when the samples' Redis runs on this machine (the embedded one)."""
        return self.embedded is not None

    # -- start and stop -----------------------------------------------------------------------
    async def start_all(self, sync_seconds: float | None = SYNC_SECONDS) -> None:
        """Start every registered model, then (``sync_seconds`` not None) keep in step with
        the registry every ``sync_seconds`` (:meth:`sync`)."""
        await self.sync()
        if sync_seconds is not None:
            self._sync_task = asyncio.create_task(self._sync_loop(sync_seconds))

    async def sync(self) -> None:
        """Start the registered models not running here; stop (and purge, if still
        unregistered) those running here that another process deleted. A model that
        cannot start is logged and skipped (retried at the next sync)."""
        registered = await self.registry.all()
        for name, spec in registered.items():
            if name == self.settings.model or name in self.running:
                continue
            try:
                async with self._lock:
                    if await self.registry.get(name) == spec:  # not deleted in between
                        await self._start(name, spec)
            except (StartupError, ProblemError) as exc:
                if self._failed.get(name) != str(exc):  # logged once, retried each sync
                    log.error("model '%s' not started: %s", name, exc)
                self._failed[name] = str(exc)
            else:
                self._failed.pop(name, None)
        for name in [n for n in self.running if n not in registered]:
            async with self._lock:
                running = self.running.pop(name, None)
                if running is None:
                    continue
                await running.stack.aclose()
                self.default.redis_needs.pop(name, None)
                # Its last snapshot may have landed after the deleting process's purge.
                if await self.registry.get(name) is None:
                    await purge_model(self.client, name)
            log.info("model '%s' deleted by another process: stopped here", name)

    async def _sync_loop(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.sync()
            except redis.RedisError as exc:  # Redis away: the next round tries again
                log.warning("could not read the model registry: %s", exc)
            except Exception:  # a bug: logged, and the next round tries again
                log.exception("the sync of the named models failed")

    async def aclose(self) -> None:
        """Stop the sync and every named model (final snapshots, leases released)."""
        task, self._sync_task = self._sync_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self._lock:
            running, self.running = self.running, {}
        for model in running.values():
            await model.stack.aclose()

    async def _start(self, name: str, spec: ModelSpec) -> RunningModel:
        """Start model ``name`` (call with the lock held); returns it."""
        current = self.running.get(name)
        if current is not None:
            return current
        settings = settings_for(self.settings, name, spec, self._capacity(name, spec))
        stack = AsyncExitStack()
        try:
            context = await start_model(
                settings,
                ServiceMetrics(),  # a registry of its own: /metrics shows the default model
                stack,
                url=self.url,
                async_client=self.client,
                embedded=self.embedded,
                memory=self.budget,
                warm_up=False,  # the default model's start loaded the kernels
                redis_needs=self.default.redis_needs,
            )
        except BaseException:
            await stack.aclose()
            raise
        context.capacity_setting = f"max_samples of model '{name}'"
        model = self.running[name] = RunningModel(spec, context, stack)
        log.info("model '%s' started (k = %d, dim = %d, max_samples = %d)",
                 name, spec.k, spec.dim, settings.max_samples)  # fmt: skip
        return model

    def _capacity(self, name: str, spec: ModelSpec) -> int:
        """The ``max_samples`` model ``name`` runs with, checked against its memory budget.

        The spec's, if its samples and centroids fit :attr:`budget`; unset, as many as
        fit. Raises the ``422`` ``model-too-large`` problem otherwise.
        """
        budget, origin = self.budget
        fits = fitting_samples(spec, budget, with_redis=self.with_redis)
        wanted = spec.max_samples if spec.max_samples is not None else max(fits, spec.k)
        need = required_bytes(spec, wanted, with_redis=self.with_redis)
        if need <= budget and wanted >= spec.k:
            return wanted
        asked = (
            f"max_samples = {wanted:,}" if spec.max_samples is not None
            else f"k = {spec.k} samples"
        )  # fmt: skip
        raise ProblemError(
            422,
            "model-too-large",
            f"model '{name}' does not fit its memory: {asked} of dimension {spec.dim} "
            f"(k = {spec.k}) need {need:,} bytes, the limit is {budget:,} ({origin}), "
            f"which holds {fits:,} samples; lower max_samples, k or dim, or raise "
            "NMBATCH_MODEL_MAX_BYTES",
            title="Model too large",
            setting="max_samples" if spec.max_samples is not None else "k",
            limit_setting="NMBATCH_MODEL_MAX_BYTES",
            required_bytes=need,
            limit_bytes=budget,
            max_samples_fitting=fits,
        )

    # -- lookups -------------------------------------------------------------------------------
    async def context(self, name: str) -> ServiceContext:
        """The context of model ``name``: the default one, a running one, or one registered
        by another process (started here now). Raises the ``404`` problem if unknown."""
        if name == self.settings.model:
            return self.default
        model = self.running.get(name)
        if model is not None:
            return model.context
        spec = await self.registry.get(name)
        if spec is None:
            raise unknown_model(name)
        async with self._lock:
            try:
                return (await self._start(name, spec)).context
            except StartupError as exc:
                raise ProblemError(
                    409, "model-conflict", str(exc), title="Model conflict", model=name
                ) from None

    async def describe(self, name: str) -> dict[str, Any]:
        """The ``GET /models/{name}`` document of model ``name`` (``404`` if unknown)."""
        context = await self.context(name)
        if name == self.settings.model:
            return self._document(name, spec_of(self.settings), context, default=True)
        return self._document(name, self.running[name].spec.model_dump(), context)

    async def list_models(self) -> list[dict[str, Any]]:
        """Every model: the default one first, then the registered ones by name."""
        out = [self._document(self.settings.model, spec_of(self.settings), self.default,
                              default=True)]  # fmt: skip
        for name, spec in (await self.registry.all()).items():
            if name == self.settings.model:
                continue
            try:
                out.append(await self.describe(name))
            except ProblemError as exc:
                if exc.status == 404:  # deleted in between
                    continue
                # Registered but refused here (Redis holds other k/dim, memory): say why.
                status = {"role": "none", "phase": f"not started: {exc.detail}"[:300],
                          "version": None, "n_samples": 0, "converged": False}  # fmt: skip
                out.append({"name": name, "default": False, "settings": spec.model_dump(),
                            "max_samples": None, "status": status})  # fmt: skip
        return out

    def _document(
        self, name: str, spec: dict[str, Any], context: ServiceContext, *, default: bool = False
    ) -> dict[str, Any]:
        stats = context.board.stats
        model = context.board.model
        worker = context.worker
        return {
            "name": name,
            "default": default,
            "settings": spec,
            "max_samples": context.settings.max_samples
            if not default
            else (context.capacity.max_samples if context.capacity else None),
            "status": {
                "role": str(worker.role),
                "phase": str(worker.phase) if worker.error is None else "failed",
                "version": model.version if model is not None else None,
                "n_samples": stats.n_samples,
                "converged": stats.converged,
            },
        }

    # -- create and delete ----------------------------------------------------------------------
    async def put(self, name: str, spec: ModelSpec) -> tuple[bool, dict[str, Any]]:
        """Create model ``name`` with ``spec``, or find it with the same spec.

        Returns ``(created, document)``. Problems: ``409`` ``model-conflict`` (another
        spec, or Redis holds the name's data with another ``k``/``dim``), ``409``
        ``too-many-models``, ``422`` ``model-too-large``, ``422`` ``dimension-too-large``.
        """
        if name == self.settings.model:
            current = spec_of(self.settings)
            if current != spec.model_dump():
                raise self._conflict(name, current)
            return False, await self.describe(name)
        if spec.dim > self.settings.max_dim:
            raise ProblemError(
                422, "dimension-too-large",
                f"dim = {spec.dim} is above NMBATCH_MAX_DIM = {self.settings.max_dim}",
                title="Dimension too large", setting="NMBATCH_MAX_DIM",
                max_dim=self.settings.max_dim,
            )  # fmt: skip
        self._capacity(name, spec)  # 507 before anything is written
        async with self._lock:
            status, value = await self.registry.create(name, spec, self.settings.max_models)
            if status == -1:
                raise ProblemError(
                    409, "too-many-models",
                    f"{value} named models exist, NMBATCH_MAX_MODELS = "
                    f"{self.settings.max_models}; delete one or raise the setting",
                    title="Too many models", setting="NMBATCH_MAX_MODELS",
                    max_models=self.settings.max_models,
                )  # fmt: skip
            if status == 0 and value != spec:
                raise self._conflict(name, value.model_dump() if value is not None else None)
            try:
                await self._start(name, spec)
            except StartupError as exc:
                if status == 1:  # registered just now: leave no entry behind
                    await self.registry.remove(name)
                raise ProblemError(
                    409, "model-conflict", str(exc), title="Model conflict", model=name
                ) from None
        return status == 1, await self.describe(name)

    @staticmethod
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

    async def delete(self, name: str) -> int:
        """Remove model ``name``: unregistered, its worker stopped, its keys deleted.

        Returns the number of Redis keys deleted. The default model cannot be deleted
        (``409`` ``default-model``); an unknown one is a ``404``.
        """
        if name == self.settings.model:
            raise ProblemError(
                409, "default-model",
                f"'{name}' is the service's default model (NMBATCH_MODEL); it cannot be "
                "deleted through the API", title="Default model", model=name,
            )  # fmt: skip
        async with self._lock:
            registered = await self.registry.remove(name)
            running = self.running.pop(name, None)
            if not registered and running is None:
                raise unknown_model(name)
            if running is not None:
                await running.stack.aclose()  # last snapshot, lease released, engine ended
            self.default.redis_needs.pop(name, None)
            removed = await purge_model(self.client, name)
        log.info("model '%s' deleted (%d Redis keys)", name, removed)
        return removed
