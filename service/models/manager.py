"""The one registry of the models an app serves: started, looked up and stopped.

One :class:`ModelManager` lives in ``app.state.models``. The default model
(``NMBATCH_MODEL``) is an entry like every named one: started by the same
:meth:`ModelManager._launch` (through the ``start`` callable the app passes in,
:func:`nmbatch.service.bootstrap.start_model`), looked up by the same
:meth:`ModelManager.handle`, stopped by the same :meth:`ModelManager.aclose`. Each model
has an exit stack of its own: its own Redis clients, lease, worker thread and engine
process, and its series of the app's metrics (label ``model``; removed when it stops
here, :meth:`ServiceMetrics.remove_model`). They share the request handlers' async
Redis client and, with the embedded Redis, its ``maxmemory`` (the sum of the models'
needs, :attr:`ModelManager.redis_needs`).
The default model differs only in where its settings come from (the ``NMBATCH_*``
environment rather than the registry hash) and in that it cannot be deleted.

Named models come from the registry in Redis (:mod:`nmbatch.service.models.registry`):
all of them at start-up, a new one on ``PUT``; and every :data:`SYNC_SECONDS` the
registry is read again (:meth:`ModelManager.sync`): a model another process registered
starts here too (as a standby of its worker, ready to take over), one another process
deleted is stopped here, and a pin another process set or lifted is served here
(:func:`nmbatch.service.usecases.versions.refresh_pin`; also when a model starts). A
request naming a model registered since the last sync starts it at once. The ``/models``
use cases are :mod:`nmbatch.service.usecases.catalog`.
Lookups and starts refuse with the domain errors of :mod:`nmbatch.service.usecases.errors`
(:class:`UnknownModelError`, :class:`ModelCannotStartError`, :class:`ModelTooLargeError`),
never with an HTTP answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.asyncio

from nmbatch.service.config import Settings
from nmbatch.service.logs import about_model
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
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.usecases import versions
from nmbatch.service.usecases.errors import (
    DomainError,
    InvalidModelEntryError,
    ModelCannotStartError,
    ModelTooLargeError,
    UnknownModelError,
)
from nmbatch.service.usecases.serving import ModelHandle

__all__ = ["SYNC_SECONDS", "ModelManager", "RunningModel", "StartModel", "StartupError"]

log = logging.getLogger("service")

SYNC_SECONDS = 2.0
"""Seconds between two reads of the registry by :meth:`ModelManager.sync`."""


class StartupError(RuntimeError):
    """A model cannot start (Redis unreachable, settings contradicting Redis ...).

    ``str(exc)`` is for the operator (start-up output; credentials masked); ``public``,
    what an HTTP client may be told (no host, port, URL or Redis message), defaults to it.
    """

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = public if public is not None else message


class StartModel(Protocol):
    """Starts one model on the app's Redis, its resources on ``stack``; returns its handle
    (:func:`nmbatch.service.bootstrap.start_model` with the Redis bound)."""

    def __call__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        stack: AsyncExitStack,
        *,
        memory: tuple[int, str],
        redis_needs: dict[str, int],
        warm_up: bool,
        capacity_setting: str,
    ) -> Awaitable[ModelHandle]: ...


@dataclass
class RunningModel:
    """A model started in this process: its settings as ``GET /models`` shows them, its
    handle, the exit stack that stops it, and whether it is the default model."""

    spec: dict[str, Any]
    handle: ModelHandle
    stack: AsyncExitStack
    default: bool = False
    generation: str | None = None


class ModelManager:
    """The models of one app: the default one and the named ones.

    Parameters
    ----------
    settings : Settings
        The service's settings (the default model's, the limits).
    metrics : ServiceMetrics
        The app's metrics (each model gets its series: :meth:`ServiceMetrics.for_model`).
    start : StartModel
        Starts one model.
    client : redis.asyncio.Redis
        The request handlers' async client (the registry hash, purges).
    memory : (int, str)
        The process's memory limit and its origin (the default model's capacity, the
        named models' budget).
    with_redis : bool
        True when the samples' Redis is the embedded one (on this machine).
    """

    def __init__(
        self,
        settings: Settings,
        metrics: ServiceMetrics,
        start: StartModel,
        client: redis.asyncio.Redis,
        memory: tuple[int, str],
        *,
        with_redis: bool,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.start = start
        self.client = client
        self.memory = memory
        self.with_redis = with_redis
        self.registry = ModelRegistry(client, owner=settings.model)
        self.budget = model_budget(settings, memory)
        self.running: dict[str, RunningModel] = {}
        # Bytes of the embedded Redis's maxmemory each running model needs.
        self.redis_needs: dict[str, int] = {}
        self.lock = asyncio.Lock()
        self._sync_task: asyncio.Task[None] | None = None
        self._failed: dict[str, str] = {}  # model -> why it could not start (logged)
        # Registry entries that do not validate (model -> why): never started nor purged,
        # shown in /stats and GET /models.
        self.invalid: dict[str, str] = {}

    @property
    def default_name(self) -> str:
        """The default model's name (``NMBATCH_MODEL``)."""
        return self.settings.model

    @property
    def default(self) -> ModelHandle:
        """The default model's handle (once :meth:`start_all` has started it)."""
        return self.running[self.default_name].handle

    # -- start and stop -----------------------------------------------------------------------
    async def start_all(self, sync_seconds: float | None = SYNC_SECONDS) -> None:
        """Start the default model (a :class:`StartupError` stops the app), then every
        registered one; then (``sync_seconds`` not None) keep in step with the registry
        every ``sync_seconds`` (:meth:`sync`)."""
        async with self.lock:
            try:
                await self.registry.mark_default(self.default_name)
            except redis.RedisError as exc:
                raise StartupError(f"Redis is unusable: {exc}") from None
            await self._launch(
                self.settings, spec_of(self.settings),
                self.metrics.for_model(self.default_name), self.memory, default=True,
            )  # fmt: skip
        await self.sync()
        if sync_seconds is not None:
            self._sync_task = asyncio.create_task(self._sync_loop(sync_seconds))

    async def _launch(
        self,
        settings: Settings,
        spec: dict[str, Any],
        metrics: ServiceMetrics,
        memory: tuple[int, str],
        *,
        default: bool = False,
    ) -> RunningModel:
        """Start the model of ``settings`` (call with the lock held) and register it."""
        name = settings.model
        stack = AsyncExitStack()
        try:
            with about_model(name):  # its start-up's log lines
                handle = await self.start(
                    settings,
                    metrics,
                    stack,
                    memory=memory,
                    redis_needs=self.redis_needs,
                    warm_up=default,  # the default model starts first: it loads the kernels
                    capacity_setting="NMBATCH_MAX_SAMPLES" if default
                    else f"max_samples of model '{name}'",
                )  # fmt: skip
            # The incarnation its appends are checked against (storage.keys: generation).
            generation = await self.registry.claim_generation(name, named=not default)
            if generation is None:
                raise StartupError(f"model '{name}' is no longer registered")
            handle.sample_log.generation = generation
            await versions.refresh_pin(handle)  # a pinned version is served from the start
        except redis.RedisError as exc:
            await self._abandon(name, stack, default)
            raise StartupError(f"Redis is unusable: {exc}") from None
        except BaseException:
            await self._abandon(name, stack, default)
            raise
        if default:  # its k may be the one a re-clustering set (bootstrap)
            spec = spec_of(handle.settings)
        running = RunningModel(spec, handle, stack, default, generation)
        self.running[name] = running
        return running

    async def _abandon(self, name: str, stack: AsyncExitStack, default: bool) -> None:
        """Undo a start that failed: its resources, and a named model's series."""
        await stack.aclose()
        if not default:
            self.metrics.remove_model(name)

    async def start_named(self, name: str, spec: ModelSpec) -> RunningModel:
        """Start named model ``name`` (call with the lock held) unless it runs; returns it.

        Raises :class:`StartupError` or :class:`ModelTooLargeError` (:meth:`capacity`).
        """
        current = self.running.get(name)
        if current is not None:
            return current
        settings = settings_for(self.settings, name, spec, self.capacity(name, spec))
        running = await self._launch(
            settings, spec.model_dump(), self.metrics.for_model(name), self.budget
        )
        log.info("model '%s' started (k = %d, dim = %d, max_samples = %d)",
                 name, spec.k, spec.dim, settings.max_samples)  # fmt: skip
        return running

    async def stop(self, name: str) -> bool:
        """Stop named model ``name`` if it runs here (call with the lock held): last
        snapshot, lease released, engine ended. Returns True if it ran."""
        running = self.running.pop(name, None)
        if running is not None:
            await running.stack.aclose()
            self.metrics.remove_model(name)  # its series leave /metrics
        self.redis_needs.pop(name, None)
        return running is not None

    async def restart(self, name: str, spec: ModelSpec | None) -> RunningModel:
        """Stop model ``name`` and start it again (call with the lock held): a named one
        with ``spec``, the default one with the service's settings, its ``k`` the one a
        re-clustering set (:func:`~nmbatch.service.bootstrap.reclustered_settings`). The
        engine replays the retained log, as at a restart."""
        running = self.running.pop(name, None)
        if running is not None:
            await running.stack.aclose()  # last snapshot, lease released, engine ended
        if spec is not None:
            self.metrics.remove_model(name)
            self.redis_needs.pop(name, None)
            return await self.start_named(name, spec)
        return await self._launch(
            self.settings, spec_of(self.settings),
            self.metrics.for_model(name), self.memory, default=True,
        )  # fmt: skip

    async def sync(self) -> None:
        """Serve the pins Redis holds; start the registered models not running here; stop
        (and purge, if still unregistered) those running here that another process
        deleted; restart those deleted and created again (another generation). A model
        that cannot start is logged and skipped (retried at the next sync). An entry that
        does not validate is logged and kept in :attr:`invalid`: its model is neither
        started nor stopped nor purged (fail closed)."""
        registered, invalid = await self.registry.entries()
        for name, why in invalid.items():
            if self.invalid.get(name) != why:
                log.error("model '%s': its registry entry is not valid (%s); its data is "
                          "kept, the model is not started", name, why)  # fmt: skip
        self.invalid = invalid
        for running in list(self.running.values()):  # pins set or lifted by other processes
            await versions.refresh_pin(running.handle)
        await self._restart_replaced(registered)
        await self._follow_default_recluster()
        for name, spec in registered.items():
            if name == self.default_name or name in self.running:
                continue
            try:
                async with self.lock:
                    if await self._spec(name) == spec:  # not deleted in between
                        await self.start_named(name, spec)
            except (StartupError, DomainError) as exc:
                if self._failed.get(name) != str(exc):  # logged once, retried each sync
                    log.error("model '%s' not started: %s", name, exc)
                self._failed[name] = str(exc)
            else:
                self._failed.pop(name, None)
        gone = [
            n for n, m in self.running.items()
            if not m.default and n not in registered and n not in invalid
        ]  # fmt: skip
        for name in gone:
            async with self.lock:
                if not await self.stop(name):
                    continue
                # Its last snapshot may have landed after the deleting process's purge.
                if not await self.registry.registered(name):
                    await purge_model(self.client, name)
            log.info("model '%s' deleted by another process: stopped here", name)

    async def _spec(self, name: str) -> ModelSpec | None:
        """The registered spec of ``name`` (None: none, or an entry that is not valid)."""
        try:
            return await self.registry.get(name)
        except ValueError:
            return None

    async def _restart_replaced(self, registered: dict[str, ModelSpec]) -> None:
        """Stop (without purging) the named models running here whose generation or spec
        is no longer theirs: deleted and created again, or re-clustered, by another
        process; the loop in :meth:`sync` starts the new one."""
        names = [n for n, m in self.running.items() if not m.default and n in registered]
        for name, current in zip(names, await self.registry.generations(names), strict=True):
            running = self.running.get(name)
            if running is None or current is None:
                continue
            if current == running.generation and registered[name].model_dump() == running.spec:
                continue  # neither created again nor re-clustered (another k) elsewhere
            async with self.lock:
                if self.running.get(name) is running:
                    await self.stop(name)
            log.info("model '%s' was created again or re-clustered elsewhere: restarted", name)

    async def _follow_default_recluster(self) -> None:
        """Restart the default model here when another process re-clustered it: its meta's
        ``k``, set with ``reclustered_at`` by the re-clustering's script, is not the ``k``
        it runs with here (the restart takes the meta's, as a start does)."""
        running = self.running.get(self.default_name)
        if running is None:
            return
        k, reclustered = await self.client.hmget(
            ModelKeys(self.default_name).meta, ["k", "reclustered_at"]
        )
        if reclustered is None or k is None or int(k) == running.handle.settings.k:
            return
        async with self.lock:
            if self.running.get(self.default_name) is running:
                await self.restart(self.default_name, None)
        log.info("model '%s' was re-clustered elsewhere (k = %d): restarted", self.default_name,
                 int(k))  # fmt: skip

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
        """Stop the sync and every model, the default one last (final snapshots, leases
        released)."""
        task, self._sync_task = self._sync_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self.lock:
            running, self.running = self.running, {}
        for model in reversed(running.values()):
            await model.stack.aclose()

    def capacity(self, name: str, spec: ModelSpec) -> int:
        """The ``max_samples`` named model ``name`` runs with, checked against its budget.

        The spec's, if its samples, centroids and kept versions fit :attr:`budget`; unset,
        as many as fit. Raises :class:`ModelTooLargeError` otherwise.
        """
        budget, origin = self.budget
        keep = (self.settings.keep_versions, self.settings.keep_versions_bytes)
        fits = fitting_samples(spec, budget, with_redis=self.with_redis, keep=keep)
        wanted = spec.max_samples if spec.max_samples is not None else max(fits, spec.k)
        need = required_bytes(spec, wanted, with_redis=self.with_redis, keep=keep)
        if need <= budget and wanted >= spec.k:
            return wanted
        asked = (
            f"max_samples = {wanted:,}" if spec.max_samples is not None
            else f"k = {spec.k} samples"
        )  # fmt: skip
        raise ModelTooLargeError(
            f"model '{name}' does not fit its memory: {asked} of dimension {spec.dim} "
            f"(k = {spec.k}) need {need:,} bytes, the limit is {budget:,} ({origin}), "
            f"which holds {fits:,} samples; lower max_samples, k or dim, or raise "
            f"{ModelTooLargeError.limit_setting}",
            model=name,
            setting="max_samples" if spec.max_samples is not None else "k",
            # The member is a JSON integer: past 64 bits (a max_samples near 2^62 times a
            # large k d), it is that bound; the detail has the exact figure.
            required_bytes=min(need, (1 << 63) - 1),
            limit_bytes=budget,
            max_samples_fitting=fits,
        )

    # -- lookups -------------------------------------------------------------------------------
    async def running_model(self, name: str) -> RunningModel:
        """Model ``name``: a running one, or one registered by another process (started
        here now). Raises :class:`UnknownModelError`, or :class:`ModelCannotStartError`
        (:class:`ModelTooLargeError`) if it cannot start here."""
        model = self.running.get(name)
        if model is not None:
            return model
        if name == self.default_name:  # restarting (a re-clustering): wait for it
            async with self.lock:
                model = self.running.get(name)
            if model is not None:
                return model
        try:
            spec = await self.registry.get(name)
        except ValueError as exc:
            raise InvalidModelEntryError(name, str(exc)) from None
        if spec is None:
            raise UnknownModelError(name)
        async with self.lock:
            try:
                return await self.start_named(name, spec)
            except StartupError as exc:
                raise ModelCannotStartError(name, exc.public) from None

    async def handle(self, name: str) -> ModelHandle:
        """The handle of model ``name`` (:meth:`running_model`)."""
        model = self.running.get(name)  # the common case, without a coroutine frame
        if model is not None:
            return model.handle
        return (await self.running_model(name)).handle
