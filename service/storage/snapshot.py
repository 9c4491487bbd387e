"""The persisted state of the model (hash ``nmbatch:{model}:snapshot``) and its fields.

A snapshot is the published model (:class:`PublishedModel`: version, the engine's
:class:`ModelState`, time of the update) plus the log position it was taken at. Fields:
``centroids`` as little-endian ``float32`` bytes, ``counts`` as ``int64`` bytes (for a
weighted model ``float64`` bytes, and ``counts_dtype`` ``<f8``: its sums of weights), ``k``
and ``dim`` (their shape), ``version``, ``batch_size``, ``iteration``, ``last_id``,
``n_samples``, ``converged`` (0 or 1) as decimal text, ``updated_at`` as ``repr`` of a
float, and ``energy`` (``repr`` of a float; absent before the first iteration). A kept
version (:mod:`service.storage.versions`) is these same fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nmbatch.engine.state import ModelState
from nmbatch.service.identities import Lineage
from nmbatch.service.state import PublishedModel

__all__ = ["Snapshot"]


def _counts_dtype(state: ModelState) -> str:
    """``<i8`` for counts of samples, ``<f8`` for sums of weights (a weighted model)."""
    return "<f8" if state.counts.dtype.kind == "f" else "<i8"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A persisted state of the model.

    Attributes
    ----------
    model : PublishedModel
        The model as it was served: ``version`` (increases with every published centroid
        update, never decreases), ``state`` (centroids ``(k, d)`` float32, counts
        ``(k,)`` int64, ``batch_size``, ``n_samples``: samples in the worker's store,
        ``iteration``, ``converged``) and ``updated_at``.
    last_id : str
        Id of the last log entry read into the store when the snapshot was taken.
    """

    model: PublishedModel
    last_id: str

    def to_fields(self) -> dict[str, bytes | int | float | str]:
        """The hash fields of the snapshot."""
        model, state = self.model, self.model.state
        fields: dict[str, bytes | int | float | str] = {
            "version": model.version,
            "k": state.k,
            "dim": state.dim,
            "centroids": np.ascontiguousarray(state.centroids, dtype="<f4").tobytes(),
            "counts": np.ascontiguousarray(state.counts, dtype=_counts_dtype(state)).tobytes(),
            "batch_size": state.batch_size,
            "iteration": state.iteration,
            "last_id": self.last_id,
            "n_samples": state.n_samples,
            "n_ingested": state.n_ingested,
            "converged": int(state.converged),
            "updated_at": repr(float(model.updated_at)),
        }
        if state.energy is not None:
            fields["energy"] = repr(float(state.energy))
        if _counts_dtype(state) != "<i8":
            fields["counts_dtype"] = _counts_dtype(state)
        if model.lineage is not None and model.lineage.k == state.k:
            fields.update(model.lineage.to_fields())
        return fields

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Snapshot:
        """The snapshot stored in ``fields`` (as :meth:`to_fields` wrote them)."""
        k, dim = int(fields[b"k"]), int(fields[b"dim"])
        state = ModelState(
            centroids=np.frombuffer(fields[b"centroids"], dtype="<f4").reshape(k, dim),
            counts=np.frombuffer(
                fields[b"counts"], dtype="<f8" if fields.get(b"counts_dtype") == b"<f8" else "<i8"
            ).reshape(k),
            batch_size=int(fields[b"batch_size"]),
            n_samples=int(fields[b"n_samples"]),
            n_ingested=int(fields.get(b"n_ingested", fields[b"n_samples"])),
            iteration=int(fields[b"iteration"]),
            converged=bool(int(fields[b"converged"])),
            energy=float(fields[b"energy"]) if b"energy" in fields else None,
            initialized=True,  # a snapshot holds centroids that were served
        )
        model = PublishedModel.build(
            version=int(fields[b"version"]),
            state=state,
            updated_at=float(fields[b"updated_at"]),
            lineage=Lineage.from_fields(fields),
        )
        return cls(model, fields[b"last_id"].decode())
