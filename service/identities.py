"""How a version's clusters relate to those of the version before it (stable identities).

An index names "the same cluster" from one iteration to the next except where the engine
changed its meaning, and the engine says where (:class:`~nmbatch.engine.state.
IterationStats`): a **relocated** cluster (empty, it took a sample far from every
centroid: a new cluster under an old index) and a **swap** ``(merged, into, split)``
(cluster ``merged`` joined ``into`` with all its samples, then took the second part of
``split``: ``merged`` is a new cluster under an old index, ``into`` and ``split`` keep
their meaning). A :class:`Lineage` composes these facts over the iterations since a
base version (the previous snapshot, which is the previous kept version unless the
bound left it out):

- ``matching`` ``(k,)`` int32: for each cluster ``i`` of the base version, the index
  that holds its samples now (``i`` where nothing happened, ``into`` after a swap that
  merged it, and so on through every step), ``-1`` when the cluster ended (it lost every
  sample and its index was relocated);
- ``origin`` ``(k,)`` uint8: for each index of this version, :data:`KEPT` (it descends
  from the same index of the base), :data:`RELOCATED` or :data:`SWAPPED` (a new meaning
  since the base; the later fact wins).

Both are kept with the version (:meth:`Lineage.to_fields`: ``5 k`` bytes, counted in
:func:`~nmbatch.service.storage.capacity.version_bytes`). Bookkeeping on indices only:
the math (which clusters moved) is the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nmbatch.engine.state import IterationStats

__all__ = ["KEPT", "RELOCATED", "SWAPPED", "Lineage"]

KEPT, RELOCATED, SWAPPED = 0, 1, 2


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, slots=True)
class Lineage:
    """The clusters of a version against those of version ``since`` (module docstring).

    ``since`` None: no earlier version (the first model); ``matching`` ``(k,)`` int32 and
    ``origin`` ``(k,)`` uint8, read-only.
    """

    since: int | None
    matching: np.ndarray
    origin: np.ndarray

    @classmethod
    def start(cls, since: int | None, k: int) -> Lineage:
        """Nothing changed since ``since``: every cluster is itself."""
        return cls(
            since,
            _frozen(np.arange(k, dtype=np.int32)),
            _frozen(np.zeros(k, dtype=np.uint8)),
        )

    @property
    def k(self) -> int:
        """Clusters of the version."""
        return int(self.origin.shape[0])

    def after(self, stats: IterationStats | None) -> Lineage:
        """This lineage with one more step's facts (``stats`` None: a restore, no change).

        Within a step the relocations come first, then the swaps, in order."""
        if stats is None or (not stats.relocated and not stats.swaps):
            return self
        step = np.arange(self.k, dtype=np.int32)  # where the step takes each index
        origin = self.origin.copy()
        for j in stats.relocated:
            step[j] = -1
            origin[j] = RELOCATED
        for merged, into, _split in stats.swaps:
            step[merged] = step[into]  # a step's swaps touch distinct clusters
            origin[merged] = SWAPPED
        old = self.matching
        matching = np.where(old >= 0, step[np.maximum(old, 0)], -1).astype(np.int32)
        return Lineage(self.since, _frozen(matching), _frozen(origin))

    # -- in a kept version's hash ---------------------------------------------------------
    def to_fields(self) -> dict[str, bytes | str]:
        """``lineage_since`` (decimal text, empty for None), ``matching`` (``<i4``
        bytes) and ``origin`` (``u1`` bytes)."""
        return {
            "lineage_since": "" if self.since is None else str(self.since),
            "matching": np.ascontiguousarray(self.matching, dtype="<i4").tobytes(),
            "origin": np.ascontiguousarray(self.origin, dtype="u1").tobytes(),
        }

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Lineage | None:
        """The lineage :meth:`to_fields` wrote, or None if the hash has none (a version
        written before identities were kept)."""
        if b"matching" not in fields:
            return None
        since = fields.get(b"lineage_since", b"")
        return cls(
            int(since) if since else None,
            _frozen(np.frombuffer(fields[b"matching"], dtype="<i4").astype(np.int32)),
            _frozen(np.frombuffer(fields[b"origin"], dtype="u1").copy()),
        )

    def document(self) -> dict[str, Any]:
        """The ``identities`` member of a version in ``GET /versions``: ``since``,
        ``relocated`` and ``swapped`` (indices of this version with a new meaning),
        ``ended`` (clusters of ``since`` that ended), and ``matching``: ``[old, new]``
        for each cluster of ``since`` not at its own index now (``new`` null for an
        ended one); every other cluster ``i`` of ``since`` is ``i`` here."""
        moved = np.flatnonzero(self.matching != np.arange(self.matching.shape[0]))
        return {
            "since": self.since,
            "relocated": np.flatnonzero(self.origin == RELOCATED).tolist(),
            "swapped": np.flatnonzero(self.origin == SWAPPED).tolist(),
            "ended": np.flatnonzero(self.matching < 0).tolist(),
            "matching": [
                [int(i), None if self.matching[i] < 0 else int(self.matching[i])] for i in moved
            ],
        }
