"""``POST /models/{name}/sweep``: choosing k on a model's retained samples.

The answer is synchronous, its cost bounded by settings: at most
``NMBATCH_SWEEP_MAX_KS`` values of k, none above ``NMBATCH_SWEEP_MAX_K``, fitted on a
uniform sample of at most ``NMBATCH_SWEEP_MAX_ROWS`` retained samples (20% of them held
out to score each k; :func:`nmbatch.engine.sweep.sweep` does the math). The retained
samples are read from Redis a page at a time
(:func:`~nmbatch.service.storage.sample.retained_chunks`) into the engine's
:class:`~nmbatch.engine.sweep.UniformSample` (memory: the sample and one page); the
model's worker is not involved, so its training goes on, and any process serving the
model can answer. The fits run in a thread of their own at the engine's niceness
(``NMBATCH_ENGINE_NICE``) on one core, so requests keep the event loop; one sweep at a
time per process (:class:`SweepBusyError` otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from nmbatch.engine.sweep import HOLDOUT, UniformSample, sweep
from nmbatch.service.storage.retained_base import BaseChangedError
from nmbatch.service.storage.sample import retained_chunks
from nmbatch.service.usecases.errors import SweepBusyError, SweepRefusedError
from nmbatch.service.usecases.serving import ModelHandle, off_loop

__all__ = ["sweep_model"]

log = logging.getLogger("service")

T = TypeVar("T")

_RUNNING = threading.Lock()  # one sweep at a time in this process


def _check(handle: ModelHandle, ks: list[int]) -> None:
    """:class:`SweepRefusedError` for ``ks`` beyond the settings' bounds."""
    s, name = handle.settings, handle.name
    if len(ks) > s.sweep_max_ks:
        raise SweepRefusedError(name, "NMBATCH_SWEEP_MAX_KS", f"{len(ks)} values of k, at most "
                                f"{s.sweep_max_ks} (NMBATCH_SWEEP_MAX_KS)")  # fmt: skip
    if ks[0] < 1:
        raise SweepRefusedError(name, "ks", f"k = {ks[0]}: every k is at least 1")
    if ks[-1] > s.sweep_max_k:
        raise SweepRefusedError(name, "NMBATCH_SWEEP_MAX_K", f"k = {ks[-1]} is above "
                                f"NMBATCH_SWEEP_MAX_K = {s.sweep_max_k}")  # fmt: skip


async def _sample(handle: ModelHandle, size: int, seed: int) -> tuple[np.ndarray, int]:
    """A uniform sample of at most ``size`` retained samples, and how many were read."""
    client, keys = handle.sample_log.client, handle.sample_log.keys
    for attempt in (1, 2):
        sample = UniformSample(size, rng=seed)
        try:
            async for X in retained_chunks(client, keys):
                await off_loop(X.size, sample.offer, X)
        except BaseChangedError:
            if attempt == 2:
                raise
            continue  # a compaction replaced the base meanwhile: read again
        return sample.rows(), sample.seen
    raise AssertionError("unreachable")  # pragma: no cover


async def _low_priority(fn: Callable[[], T], nice: int) -> T:
    """``fn()`` in a thread of its own at niceness ``nice`` (Linux; elsewhere as is)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.done():  # the request went away
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)  # type: ignore[arg-type]

    def run() -> None:
        if nice > 0 and hasattr(os, "setpriority"):
            with contextlib.suppress(OSError):  # refused: at the process's priority
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        try:
            value, error = fn(), None
        except BaseException as exc:  # handed to the request
            value, error = None, exc
        loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="nmbatch-sweep", daemon=True).start()
    return await done


async def sweep_model(handle: ModelHandle, ks: list[int]) -> dict[str, Any]:
    """Sweep ``ks`` on model ``handle``'s retained samples; the ``Sweep`` document.

    Raises :class:`SweepRefusedError` (bounds, or a k above the training rows: too few
    samples retained), :class:`SweepBusyError`.
    """
    ks = sorted(set(ks))
    _check(handle, ks)
    s = handle.settings
    if not _RUNNING.acquire(blocking=False):
        raise SweepBusyError()
    try:
        seed = s.seed if s.seed is not None else int(np.random.default_rng().integers(2**31))
        rows, retained = await _sample(handle, s.sweep_max_rows, seed)
        n_held = round(HOLDOUT * rows.shape[0])
        n_train = rows.shape[0] - n_held
        if ks[-1] > n_train or n_held == 0:
            raise SweepRefusedError(
                handle.name, "ks", f"k = {ks[-1]} needs more samples than the {n_train} a fit "
                f"gets ({rows.shape[0]} retained, {HOLDOUT:.0%} held out, at least one); add "
                "samples or lower k"
            )  # fmt: skip
        fit = functools.partial(sweep, rows, ks, random_state=seed, metric=s.metric,
                                n_threads=1, batch_size=s.batch_size)  # fmt: skip
        result = await _low_priority(fit, s.engine_nice)
    finally:
        _RUNNING.release()
    log.info("model '%s': swept k = %s on %d samples in %.2f s (recommended %s)", handle.name,
             ks, rows.shape[0], result.seconds, result.recommended_k)  # fmt: skip
    doc = {"model": handle.name, "n_retained": retained, **result.to_dict()}
    handle.last_sweep = doc  # the dashboard draws its curve
    return doc
