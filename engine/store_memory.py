"""The memory of a :class:`~nmbatch.engine.store.NestedBatchStore`: its rows, their ids
and their weights, and how they grow.

The rows live in one reserved range of address space (``RESERVE_BYTES``, an anonymous
``MAP_NORESERVE`` mapping: no memory is committed until a row is written), so the store
grows in place: no copy of the rows, no old buffer to free, each page touched once. Where
such a mapping is refused (strict overcommit, 32-bit), or when the range is full, it falls
back to doubling: a new buffer and one copy.

Sample weights: a weight per row, in one ``float64`` array beside the ids, placed and
moved as the rows are. ``float64`` because the votes it scales are summed in ``float64``
(``S``, ``v``, ``Q``): a ``float32`` copy would round a weight such as 0.1, and the model
would no longer be the one of the weights given. Until a weight other than 1 is stored
there is no array at all (``w`` is None): an unweighted store costs nothing more.

A reader holding an old ``data`` array still sees a valid, unchanged copy of the rows it
had: growth either extends the view over the same memory or copies into a new buffer,
published only once complete. Every method is called under the store's lock.
"""

from __future__ import annotations

import mmap
import platform
import sys

import numpy as np

from nmbatch.engine.kernels.shuffle import shuffle_insert

__all__ = ["RESERVE_BYTES", "RowMemory"]

RESERVE_BYTES = 64 << 30
"""Address space reserved per store for in-place growth (64 GiB, of the 128 TiB a 64-bit
process has; memory is committed only as rows are written)."""

_NORESERVE_4000 = ("x86_64", "AMD64", "i686", "aarch64", "arm64", "armv7l")


def _reserve(nbytes: int) -> mmap.mmap | None:
    """An anonymous private mapping of ``nbytes`` that commits memory only when written."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    # Python < 3.13 lacks the name; 0x4000 is its value on Linux for x86 and ARM.
    linux = sys.platform.startswith("linux") and platform.machine() in _NORESERVE_4000
    noreserve = getattr(mmap, "MAP_NORESERVE", 0x4000 if linux else None)
    if noreserve is None or not flags:
        return None
    try:
        return mmap.mmap(-1, nbytes, flags=flags | noreserve)
    except (OSError, OverflowError, ValueError):
        return None


class RowMemory:
    """The store's buffers: ``data`` ``(capacity, d)`` float32 (the rows), ``ids``
    ``(capacity,)`` int64 (each row's stream id) and ``w`` ``(capacity,)`` float64 (each
    row's weight; None while every weight is 1). Rows ``[0, N)`` are valid; ``N`` is the
    store's, passed to :meth:`grow`."""

    def __init__(self, dim: int, capacity: int) -> None:
        capacity = max(int(capacity), 1)
        row_bytes = 4 * dim
        self.dim = dim
        self._region = _reserve(max(RESERVE_BYTES // row_bytes, capacity) * row_bytes)
        if self._region is not None:
            rows = len(self._region) // row_bytes
            self._rows = np.frombuffer(self._region, dtype=np.float32).reshape(rows, dim)
            self.data = self._rows[:capacity]
        else:
            self.data = np.empty((capacity, dim), dtype=np.float32)
        self.ids = np.empty(self.data.shape[0], dtype=np.int64)
        self.w: np.ndarray | None = None

    @property
    def capacity(self) -> int:
        """Rows the buffers hold now."""
        return int(self.data.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers at their capacity (``(d + 2) * 4`` per row, 8 more once
        weighted): an upper bound on the memory committed."""
        w = 0 if self.w is None else self.w.nbytes
        return int(self.data.nbytes + self.ids.nbytes + w)

    @property
    def grows_in_place(self) -> bool:
        """True while the rows live in the reserved range (growth copies nothing)."""
        return self._region is not None

    def weigh(self) -> np.ndarray:
        """The weight array, made (every weight 1) if there was none: ``(capacity,)``."""
        if self.w is None:
            self.w = np.ones(self.capacity, dtype=np.float64)
        return self.w

    def place_weights(self, w: np.ndarray | None, n: int, m: int, swap: np.ndarray) -> None:
        """Place the weights ``w`` (``(m,)`` float64; None: ones) of ``m`` rows appended
        after ``n`` as :func:`shuffle_insert` places the rows (the same ``swap``). The
        first weight other than 1 makes the array, with weight 1 for the rows before."""
        w_all = self.weigh()
        new = np.ones(m, dtype=np.float64) if w is None else w
        scratch = np.empty(n + m, dtype=np.int64)  # the ids move in the rows' own call
        shuffle_insert(new.reshape(m, 1), swap, n, w_all.reshape(-1, 1), scratch,
                       np.zeros(m, dtype=np.int64))  # fmt: skip

    def grow(self, needed: int, n: int) -> None:
        """Room for ``needed`` rows at least (doubling the capacity), rows ``[0, n)`` kept."""
        capacity = max(needed, 2 * self.data.shape[0])
        if self._region is not None:
            if needed <= self._rows.shape[0]:
                # The same memory, a longer view: rows [0, N) stay where they are.
                self.data = self._rows[: min(capacity, self._rows.shape[0])]
                ids = np.empty(capacity, dtype=np.int64)
                ids[:n] = self.ids[:n]
                self.ids = ids
                self._grow_weights(capacity, n)
                return
            self._region = None  # the range is full: from now on, double and copy
        data = np.empty((capacity, self.dim), dtype=np.float32)
        data[:n] = self.data[:n]
        ids = np.empty(capacity, dtype=np.int64)
        ids[:n] = self.ids[:n]
        # Publish the new buffers only once they are complete.
        self.data, self.ids = data, ids
        self._grow_weights(capacity, n)

    def _grow_weights(self, capacity: int, n: int) -> None:
        """A new weight array of ``capacity`` rows (if any), rows ``[0, n)`` copied."""
        if self.w is None:
            return
        w = np.ones(capacity, dtype=np.float64)
        w[:n] = self.w[:n]
        self.w = w
