"""Rows named, not held: a reference to rows kept elsewhere, and where to read them.

A streaming store's rows come from somewhere that keeps them (the service's Redis log).
Instead of passing every row through a driver, the driver can hand the model
*references*: :class:`SourceRows` names rows ``offsets`` of the array a
:class:`RowSource` returns for ``ref``. The Ray backend's shards read them themselves,
from their own nodes (:meth:`~nmbatch.engine.distributed.shard.ShardState.append_ref`);
its coordinator keeps only the references, the stream ids and the priorities (17 bytes
a row with a retired flag), so a lost shard is rebuilt by a new actor reading the same
references again.

This module knows nothing of where the rows are, and imports neither Ray nor the
service: the service's storage makes the references (log entry ids) and provides the
source (its log reader); the Ray backend reads through them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["RowSource", "SourceRows"]


class RowSource(Protocol):
    """Reads the arrays named by references; picklable (sent to every shard actor)."""

    def read(self, refs: Sequence[Any]) -> list[np.ndarray]:
        """The array of each reference, in order: ``(n_r, d)`` float32 each. Raises
        (``KeyError`` for a reference that names nothing, the source's own errors while
        it is unreachable) rather than return fewer rows."""
        ...


@dataclass(frozen=True)
class SourceRows:
    """Rows ``offsets`` ``(m,)`` int64 of the array named by ``ref`` (``dim`` columns).

    Looks like the rows it names where only their number matters: ``shape``, ``len``
    and a subset by index or mask (``rows[keep]``), which names the subset.
    """

    ref: Any
    offsets: np.ndarray
    dim: int

    @classmethod
    def whole(cls, ref: Any, n: int, dim: int) -> SourceRows:
        """All ``n`` rows of ``ref``."""
        return cls(ref, np.arange(int(n), dtype=np.int64), int(dim))

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.offsets.shape[0]), self.dim

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def __getitem__(self, keep: Any) -> SourceRows:
        return SourceRows(self.ref, np.asarray(self.offsets[keep], dtype=np.int64), self.dim)
