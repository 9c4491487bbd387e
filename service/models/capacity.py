"""A model's capacity: planned once its dimension is known, and the embedded Redis sized.

:class:`ModelCapacity` is the :class:`~nmbatch.service.usecases.serving.CapacityPlanner`
of one model. Planned at start-up when the dimension is known, else when the first
batch fixes it: logged, shown in ``nmbatch_max_samples``, and the embedded Redis's
``maxmemory`` set to cover every model of the app (:attr:`ModelCapacity.redis_needs`,
shared by them), its ``Idempotency-Key`` records included (at most
``NMBATCH_IDEMPOTENCY_MAX_KEYS`` of
:data:`~nmbatch.service.storage.capacity.IDEMPOTENCY_RECORD_BYTES` each), its kept
versions (at most :func:`~nmbatch.service.storage.capacity.versions_bound` of
:func:`~nmbatch.service.storage.capacity.version_bytes` each; the memory they take is
taken off the samples' share, :func:`~nmbatch.service.storage.capacity.plan_capacity`),
its events stream (:func:`~nmbatch.service.storage.capacity.events_bytes` of
``NMBATCH_EVENTS_KEEP``) and the centroids it was seeded with (``init="given"``).
"""

from __future__ import annotations

import logging

from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.metrics import ServiceMetrics
from nmbatch.service.storage import AsyncSampleLog
from nmbatch.service.storage.capacity import (
    IDEMPOTENCY_RECORD_BYTES,
    MIN_COMPACTION,
    REDIS_FIXED_BYTES,
    REDIS_SAMPLES,
    Capacity,
    events_bytes,
    plan_capacity,
    redis_maxmemory,
    version_bytes,
    versions_bound,
)
from nmbatch.service.storage.seed import seed_bytes

__all__ = ["ModelCapacity"]

log = logging.getLogger("service")


class ModelCapacity:
    """The capacity of one model, and its share of the embedded Redis's ``maxmemory``.

    Parameters
    ----------
    settings : Settings
        The model's settings (``max_samples``, ``k``, ``retention``).
    sample_log : AsyncSampleLog
        Its log (its client sets the embedded Redis's ``maxmemory``).
    metrics : ServiceMetrics
        Its metrics (``nmbatch_max_samples``).
    memory : (int, str)
        Bytes (and their origin) the capacity is derived from when ``max_samples`` is unset.
    embedded : EmbeddedRedis or None
        The embedded Redis, None with an external one (whose ``maxmemory`` is the operator's).
    redis_needs : dict
        Bytes of ``maxmemory`` each model of the app needs, shared by the app's models.
    """

    def __init__(
        self,
        settings: Settings,
        sample_log: AsyncSampleLog,
        metrics: ServiceMetrics,
        *,
        memory: tuple[int, str],
        embedded: EmbeddedRedis | None,
        redis_needs: dict[str, int],
    ) -> None:
        self.settings = settings
        self.sample_log = sample_log
        self.metrics = metrics
        self.memory = memory
        self.embedded = embedded
        self.redis_needs = redis_needs
        self.capacity: Capacity | None = None
        self.setting = "NMBATCH_MAX_SAMPLES"

    @property
    def with_redis(self) -> bool:
        """True with the embedded Redis, whose ``maxmemory`` :meth:`plan` sets."""
        return self.embedded is not None

    async def plan(self, dim: int) -> Capacity:
        """The model's :class:`Capacity` for its dimension ``dim``, set up on first use.

        The embedded Redis's ``maxmemory`` is set to the sum of the models' needs (never
        below what it already uses plus its fixed overhead, so a log above a lowered
        capacity does not block the worker's writes).
        """
        capacity = self.capacity
        if capacity is not None and capacity.dim == dim:
            return capacity
        s = self.settings
        keep = (s.keep_versions, s.keep_versions_bytes)
        capacity = plan_capacity(
            s.max_samples, dim, s.k, memory=self.memory, with_redis=self.embedded is not None,
            keep=keep,
        )  # fmt: skip
        log.info("capacity of model '%s' (retention %s): %s", s.model, s.retention,
                 capacity.detail)  # fmt: skip
        if self.embedded is not None:
            # The log of a window, an age or a reservoir holds more than its size for a
            # while (until the next trim or compaction).
            in_redis = capacity.max_samples * REDIS_SAMPLES[s.retention]
            if s.retention == "reservoir":
                in_redis += MIN_COMPACTION
            needs = self.redis_needs
            # Its samples, its Idempotency-Key records (at most idempotency_max_keys), its
            # kept versions (at most their bound), its events and its seed.
            needs[s.model] = (
                redis_maxmemory(in_redis, dim) - REDIS_FIXED_BYTES
                + s.idempotency_max_keys * IDEMPOTENCY_RECORD_BYTES
                + versions_bound(*keep, s.k, dim) * version_bytes(s.k, dim)
                + events_bytes(s.events_keep)
                + (seed_bytes(s.k, dim) if s.init == "given" else 0)
            )
            maxmemory = await self.embedded.limit_memory(
                self.sample_log.client, sum(needs.values()) + REDIS_FIXED_BYTES, REDIS_FIXED_BYTES
            )
            log.info("embedded Redis maxmemory %d bytes (noeviction)", maxmemory)
        self.metrics.max_samples.set(capacity.max_samples)
        self.capacity = capacity
        return capacity
