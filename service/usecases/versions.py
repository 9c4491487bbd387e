"""A model's kept versions: listed, read, pinned.

The versions are those :mod:`nmbatch.service.storage.versions` keeps (each snapshot
written, within the model's bound); :attr:`ModelHandle.kept` reaches them. A read with
a version (:func:`read_model`) answers from the model served now if it is that version,
else from the kept one (decoded once, cached); the pin (:func:`pin`, :func:`unpin`) is
set in Redis, checked there against the kept set, and put on the model's board
(:attr:`~nmbatch.service.state.ModelBoard.served`), so every read (``/centroids``,
``/assign``, the dashboard) serves it while the worker goes on publishing the newest.
Other processes serving the model pick a pin up at their next registry sync
(:func:`refresh_pin`, every ``SYNC_SECONDS``) and at start-up.

Refusals: :class:`VersionNotKeptError` for a version not kept.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from nmbatch.service.identities import Lineage
from nmbatch.service.state import PublishedModel
from nmbatch.service.storage.capacity import versions_bound
from nmbatch.service.usecases import serving
from nmbatch.service.usecases.errors import VersionNotKeptError
from nmbatch.service.usecases.serving import ModelHandle, iso_time

__all__ = [
    "bound", "list_versions", "pin", "read_model", "refresh_pin", "unpin", "version_summary",
]  # fmt: skip

log = logging.getLogger("service")


def bound(handle: ModelHandle) -> int:
    """Most versions the model keeps (:func:`~nmbatch.service.storage.versions.versions_bound`
    of its settings; the count alone until its dimension is known)."""
    s = handle.settings
    return versions_bound(s.keep_versions, s.keep_versions_bytes, s.k, handle.dim)


async def _not_kept(handle: ModelHandle, version: int) -> VersionNotKeptError:
    return VersionNotKeptError(handle.name, version, await handle.kept.versions(), bound(handle))


async def read_model(handle: ModelHandle, version: int | None) -> PublishedModel:
    """The model a read serves: ``version`` if given (the served one if it is that version,
    else the kept one; :class:`VersionNotKeptError` if not kept), else
    :func:`~nmbatch.service.usecases.serving.require_model`."""
    if version is None:
        return await serving.require_model(handle)
    board = handle.board
    for model in (board.pinned, board.model):
        if model is not None and model.version == version:
            return model
    model = await handle.kept.model(version)
    if model is None:
        raise await _not_kept(handle, version)
    return model


def _number(raw: bytes | None) -> float | None:
    value = float(raw) if raw is not None else None
    return value if value is not None and math.isfinite(value) else None


def _changed(row: dict[str, Any], previous: dict[str, Any] | None) -> str:
    """What changed since the previous kept version, in words."""
    if previous is None:
        return "the oldest kept version"
    if (row["iteration"], row["n_samples"]) == (previous["iteration"], previous["n_samples"]):
        return f"the centroids of version {previous['version']}, published again (a restart)"
    parts = []
    if row["k"] != previous["k"]:
        parts.append(f"re-clustered: k {previous['k']} -> {row['k']}")
    ran = row["iteration"] - previous["iteration"]
    if ran != 0:
        parts.append(f"{ran:,} iterations" if ran > 0 else "a new engine (iterations restarted)")
    if row["batch_size"] != previous["batch_size"]:
        parts.append(f"b {previous['batch_size']:,} -> {row['batch_size']:,}")
    if row["n_samples"] != previous["n_samples"]:
        parts.append(f"N {previous['n_samples']:,} -> {row['n_samples']:,}")
    if row["converged"] != previous["converged"]:
        parts.append("converged" if row["converged"] else "no longer converged")
    if row["energy"] is not None and previous["energy"] is not None:
        parts.append(f"energy {previous['energy']:.6g} -> {row['energy']:.6g}")
    identities = row["identities"]
    if identities is not None and identities["since"] == previous["version"]:
        for name in ("relocated", "swapped"):
            if identities[name]:
                parts.append(f"{len(identities[name])} cluster(s) {name}")
    return "; ".join(parts) if parts else "nothing (the same counters)"


def _row(raw: dict[str, bytes | None]) -> dict[str, Any]:
    """A version of the ``Versions`` document from its summary fields (``changed`` and
    ``pinned`` left to the caller); ``identities``: :meth:`Lineage.document`, or None
    for a version written before identities were kept."""
    lineage = Lineage.from_fields({k.encode(): v for k, v in raw.items() if v is not None})
    return {
        "version": int(raw["version"] or 0),
        "updated_at": iso_time(float(raw["updated_at"] or 0)),
        "energy": _number(raw["energy"]),
        "n_samples": int(raw["n_samples"] or 0),
        "n_ingested": int(raw["n_ingested"] or raw["n_samples"] or 0),
        "k": int(raw["k"] or 0),
        "dim": int(raw["dim"] or 0),
        "batch_size": int(raw["batch_size"] or 0),
        "iteration": int(raw["iteration"] or 0),
        "converged": bool(int(raw["converged"] or 0)),
        "identities": lineage.document() if lineage is not None else None,
    }


async def list_versions(handle: ModelHandle) -> dict[str, Any]:
    """The ``Versions`` document: the kept versions (oldest first), the pin, the bound."""
    rows: list[dict[str, Any]] = []
    for raw in await handle.kept.summaries():
        row = _row(raw)
        row["changed"] = _changed(row, rows[-1] if rows else None)
        rows.append(row)
    pinned = await handle.kept.pinned()
    for row in rows:
        row["pinned"] = row["version"] == pinned
    newest = handle.board.model
    return {
        "model": handle.name,
        "versions": rows,
        "pinned": pinned,
        "newest": newest.version if newest is not None else None,
        "bound": bound(handle),
    }


async def version_summary(handle: ModelHandle, version: int) -> dict[str, Any]:
    """One kept version as ``GET /versions`` lists it (``changed`` against the kept
    version before it, if any); :class:`VersionNotKeptError` if it is not kept."""
    raw = await handle.kept.summary(version)
    if raw is None:
        raise await _not_kept(handle, version)
    row = _row(raw)
    kept = await handle.kept.versions()
    older = [v for v in kept if v < version]
    before = await handle.kept.summary(older[-1]) if older else None
    row["changed"] = _changed(row, _row(before) if before is not None else None)
    row["pinned"] = version == await handle.kept.pinned()
    return row


async def pin(handle: ModelHandle, version: int) -> dict[str, Any]:
    """Pin kept ``version``: reads serve it from now on (this process at once, the others
    at their next sync). :class:`VersionNotKeptError` if it is not kept (nothing changes)."""
    model = await handle.kept.model(version)
    if model is None or not await handle.kept.pin(version):
        raise await _not_kept(handle, version)
    handle.board.pin(model)
    log.info("model '%s': version %d pinned", handle.name, version)
    return _pin_document(handle)


async def unpin(handle: ModelHandle) -> dict[str, Any]:
    """Lift the pin (if any): reads follow the newest version again."""
    if await handle.kept.unpin():
        log.info("model '%s': pin lifted", handle.name)
    handle.board.pin(None)
    return _pin_document(handle)


def _pin_document(handle: ModelHandle) -> dict[str, Any]:
    """The ``Pin`` document: the pinned version, and the one reads serve."""
    board = handle.board
    pinned, served = board.pinned, board.served
    return {
        "model": handle.name,
        "pinned": pinned.version if pinned is not None else None,
        "served": served.version if served is not None else None,
    }


async def refresh_pin(handle: ModelHandle) -> None:
    """Put the pin Redis holds on the board (another process may have set or lifted it).

    A pinned version whose record is missing (never expected: a pinned version is not
    forgotten) is logged and not served: reads follow the newest.
    """
    version = await handle.kept.pinned()
    current = handle.board.pinned
    if version == (current.version if current is not None else None):
        return
    model = await handle.kept.model(version) if version is not None else None
    if version is not None and model is None and handle.kept.missing_pin != version:
        log.error("model '%s': pinned version %d has no kept record; serving the newest",
                  handle.name, version)  # fmt: skip (logged once, not at every sync)
    handle.kept.missing_pin = version if model is None else None
    handle.board.pin(model)
