"""One sample by its id: where it stands (:func:`describe_sample`), and its exact
deletion (:func:`delete_samples`).

An id is resolved in Redis (:func:`~nmbatch.service.storage.deletions.resolve`: the id
map for the ids clients sent, the id itself for the ones the log assigned) to its log
entry and row; the rest is the model's worker's (:class:`~nmbatch.service.usecases.
serving.WorkerPort` ``lookup`` and ``forget``), which holds the engine. Only the process
that is the model's worker answers: another process (a standby replica, or any process
while the worker is elsewhere) answers :class:`SamplesUnavailableError` (503), as does a
worker that does not answer within :data:`WORKER_SECONDS` (starting, replaying).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from nmbatch.engine.metric import similarity
from nmbatch.service.storage.deletions import SampleRef, resolve
from nmbatch.service.usecases.errors import SamplesUnavailableError, UnknownSampleError
from nmbatch.service.usecases.serving import WORKER_ROLE, ModelHandle, require_model

__all__ = ["MAX_DELETE_IDS", "WORKER_SECONDS", "delete_samples", "describe_sample"]

WORKER_SECONDS = 10.0
"""Longest wait for the worker's answer (it answers between iterations)."""

MAX_DELETE_IDS = 10_000
"""Most ids one ``POST /samples/delete`` names."""


async def _ask(handle: ModelHandle, ask: str, refs: list[SampleRef]) -> Any:
    """The worker's answer to ``ask`` (``lookup`` or ``forget``) of ``refs``."""
    worker = handle.worker
    if worker.role != WORKER_ROLE or not worker.alive():
        raise SamplesUnavailableError(
            handle.name, "this process is not the model's worker (another process is, or "
            "it is starting); ask the process that trains the model",
        )  # fmt: skip
    future = getattr(worker, ask)(refs)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), WORKER_SECONDS)
    except TimeoutError:
        future.cancel()  # not yet taken: never carried out
        raise SamplesUnavailableError(
            handle.name, f"the worker did not answer within {WORKER_SECONDS:.0f} s (it "
            "may be replaying the log)",
        ) from None  # fmt: skip
    except Exception as exc:  # Redis away, the worker stopped: the client retries
        raise SamplesUnavailableError(handle.name, f"the worker could not: {exc}") from None


async def describe_sample(handle: ModelHandle, sample_id: str) -> dict[str, Any]:
    """The document of sample ``sample_id`` (checked by the route): its ``id``, the
    ``cluster`` its row is nearest to now and the ``distance`` to it (and, under cosine,
    the ``similarity``), ``retained`` (True: it is among the model's samples), the
    ``version`` served. :class:`UnknownSampleError` if the model holds no such sample
    (never stored, deleted, retired by the retention)."""
    model = await require_model(handle)
    (ref,) = await resolve(handle.sample_log.client, handle.sample_log.keys, [sample_id])
    if ref is None:
        raise UnknownSampleError(handle.name, sample_id)
    known, found = await _ask(handle, "lookup", [ref])
    if not (known[0] and found.present[0]):
        raise UnknownSampleError(handle.name, sample_id)
    sqdist = float(found.sqdist[0])
    document: dict[str, Any] = {
        "id": sample_id,
        "cluster": int(found.labels[0]),
        "distance": math.sqrt(max(sqdist, 0.0)),
        "retained": True,
        "version": model.version,
    }
    if handle.settings.metric == "cosine":
        document["similarity"] = float(similarity(sqdist))
    return document


async def delete_samples(handle: ModelHandle, sample_ids: list[str]) -> tuple[list[str], list[str]]:
    """Delete the samples ``sample_ids`` (checked by the route, distinct) from the model
    exactly: tombstoned in Redis first, then out of the engine, whose model without them
    is published at once. Returns ``(deleted, not_found)``, the ids in the order given;
    an id is not found if the model has no such sample (or it was deleted before)."""
    refs = await resolve(handle.sample_log.client, handle.sample_log.keys, sample_ids)
    named = [i for i, ref in enumerate(refs) if ref is not None]
    done = await _ask(handle, "forget", [refs[i] for i in named]) if named else []
    deleted_at = {named[n] for n, hit in enumerate(done) if hit}
    deleted = [sample_ids[i] for i in sorted(deleted_at)]
    not_found = [i for n, i in enumerate(sample_ids) if n not in deleted_at]
    return deleted, not_found
