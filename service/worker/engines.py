"""The engine a worker drives: in a child process, in its own thread, or on a Ray cluster.

:func:`build_engine` makes it from the settings; the worker drives each through the same
interface (:class:`~nmbatch.engine.hosting.EngineHost`); each runs every metric.
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine.algorithms.swap import swap_wanted
from nmbatch.engine.hosting import EngineConfig, EngineHost, EngineProcess, LocalEngine
from nmbatch.service.config import Settings
from nmbatch.service.storage.entries import RedisRows

__all__ = ["build_engine"]


def build_engine(
    settings: Settings,
    dim: int,
    *,
    nice: int,
    redis_url: str | None,
    seed: np.ndarray | None = None,
) -> tuple[EngineHost, bool]:
    """The engine of a model of dimension ``dim`` (``nice``: the child's priority), and
    whether it is fed log entries by reference. ``seed``: the ``(k, dim)`` float32
    centroids of a seeded model (``init="given"``), its ``init``.

    - ``NMBATCH_RAY_ADDRESS`` unset: the single-machine engine, in a child process
      (``worker_process``) or in the worker thread;
    - set: the Ray engine (``nmbatch[ray]``, imported only then), whose shards read the
      rows of the log from the Redis at ``redis_url`` themselves (by reference); with no
      ``redis_url``, the worker's rows go to them through Ray's object store.
    """
    s = settings
    if s.init == "given" and seed is None:
        raise ValueError(f"model '{s.model}' has init=given but no seed centroids")
    init = seed if s.init == "given" else s.init
    config = EngineConfig(dim, s.k, init, s.rho, s.batch_size, s.seed,
                          threads=s.worker_threads, nice=nice,
                          idle=s.engine_sched_idle and s.worker_process,
                          swap=swap_wanted("auto", s.retention, n_clusters=s.k,
                                           batch_size=s.batch_size),
                          metric=s.metric)  # fmt: skip
    if s.ray_address is None:
        return (EngineProcess(config) if s.worker_process else LocalEngine(config)), False
    from nmbatch.engine.hosting.ray import RayEngine

    source = RedisRows(redis_url) if redis_url is not None else None
    return RayEngine(config, s.ray_address, s.ray_shards, source), source is not None
