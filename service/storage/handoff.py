"""In-process hand-off of appended log entries from the request path to the worker.

Entries appended by this process are also handed to its worker in memory: reading every
sample back from Redis costs Redis more than storing it (it sends a reply of many MiB in
64 KiB pieces per event-loop turn, between the writes it serves), so a worker reading the
log back falls behind a fast stream. The log stays the one source of truth:
:meth:`service.storage.repository.ModelRepository.read_log` serves a held entry only
after Redis confirms (an exclusive ``XRANGE`` of the gap, empty) that no other entry lies
between the last one consumed and it; otherwise it reads Redis. Entries written by other
processes, or not handed over, are read from Redis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from nmbatch.service.storage.codec import id_key

__all__ = ["MAX_HANDOFF_BYTES", "MIN_HANDOFF_BYTES", "LocalEntries", "handoff_bytes"]

Weights = np.ndarray | None
"""An entry's sample weights, ``(n,)`` float64, or None (its rows weigh 1)."""

MAX_HANDOFF_BYTES = 256 << 20
"""Most bytes of rows held for the worker: more than a few seconds of a fast stream."""
MIN_HANDOFF_BYTES = 64 << 20
"""Fewest bytes held, however small the retained set: a largest body
(``NMBATCH_MAX_BODY_BYTES``' default), a second or so of a fast stream. At 8 MiB a
window of 500,000 x 128 held less than two 10,000-row requests: with two writers most
entries were read back from Redis, decoded holding the GIL the event loop needs."""
HANDOFF_SHARE = 64
"""A bounded retention holds at most ``1 / HANDOFF_SHARE`` of its rows' bytes here."""


def handoff_bytes(retained_rows: int | None, dim: int) -> int:
    """The hand-off's size for a model that keeps at most ``retained_rows`` rows of ``dim``
    ``float32``: ``1 / 64`` of their bytes, within ``[64 MiB, 256 MiB]``; 256 MiB when the
    retention is unbounded (``all``: its capacity leaves room for this).

    The held rows are copies of rows Redis holds too, so they are memory beyond the
    retained set; while the engine falls behind (a forked Redis rewriting its
    append-only file takes a core for seconds) a stream of 100,000 vectors/s at
    ``d = 128`` would fill 50 MB a second. Bounded by the retention, a window's memory
    stays within a fixed share of its own size; what does not fit is read back from
    Redis.
    """
    if retained_rows is None:
        return MAX_HANDOFF_BYTES
    share = int(retained_rows) * 4 * int(dim) // HANDOFF_SHARE
    return max(MIN_HANDOFF_BYTES, min(MAX_HANDOFF_BYTES, share))


class LocalEntries:
    """Log entries this process appended, kept for its worker so it need not read them back.

    Request handlers :meth:`put` the rows of each entry they appended (with the id Redis
    gave it); the worker's :meth:`ModelRepository.read_log` takes them in id order once
    Redis confirmed there is no other entry in between. Entries the worker has passed
    are dropped at each read; so are entries older than ``max_age`` seconds (a worker
    that is away or standing by) and entries beyond ``max_bytes`` (never put): the
    worker then reads them from Redis, as any entry of another process. Thread-safe.

    Parameters
    ----------
    max_bytes : int
        Most bytes of rows held (the worker sets it for its model: :func:`handoff_bytes`).
    max_age : float
        Seconds after which an entry is dropped.
    """

    def __init__(self, max_bytes: int = MAX_HANDOFF_BYTES, max_age: float = 30.0) -> None:
        self.max_bytes = int(max_bytes)
        self.max_age = float(max_age)
        self._lock = threading.Lock()
        # id key -> (entry id, rows, weights or None, bytes held, time put)
        self._entries: dict[tuple[int, int], tuple[str, np.ndarray, Weights, int, float]] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of rows (and weights) held."""
        return self._bytes

    def put(
        self,
        entry_ids: Sequence[str],
        arrays: Sequence[np.ndarray],
        weights: Sequence[Weights] | None = None,
    ) -> None:
        """Hold ``arrays[i]`` (``(n_i, d)`` float32, never modified) as entry
        ``entry_ids[i]``, with its rows' sample weights ``weights[i]`` (``(n_i,)``
        float64, or None: 1; ``weights`` None: all None)."""
        now = time.monotonic()
        weighed = list(weights) if weights is not None else [None] * len(arrays)
        sizes = [X.nbytes + (0 if w is None else w.nbytes)
                 for X, w in zip(arrays, weighed, strict=True)]  # fmt: skip
        with self._lock:
            self._drop_old(now)
            if self._bytes + sum(sizes) > self.max_bytes:
                return
            for entry_id, X, w, size in zip(entry_ids, arrays, weighed, sizes, strict=True):
                self._entries[id_key(entry_id)] = (entry_id, X, w, size, now)
            self._bytes += sum(sizes)

    def after(self, after_id: str, limit: int) -> list[tuple[str, np.ndarray, Weights]]:
        """Up to ``limit`` held entries ``(entry id, rows, weights or None)`` with ids
        above ``after_id``, in id order.

        Entries at or below ``after_id`` (consumed) are dropped.
        """
        floor = id_key(after_id)
        with self._lock:
            self._drop_old(time.monotonic())
            passed = [key for key in self._entries if key <= floor]
            for key in passed:
                self._bytes -= self._entries.pop(key)[3]
            keys = sorted(self._entries)[:limit]
            return [self._entries[key][:3] for key in keys]

    def _drop_old(self, now: float) -> None:
        if not self._entries:
            return
        limit = now - self.max_age
        old = [key for key, entry in self._entries.items() if entry[4] < limit]
        for key in old:
            self._bytes -= self._entries.pop(key)[3]
