"""The nested batch store: a growable ``float32`` array of samples, with exact forgetting.

Rows ``[0, b)`` are the *prefix* (the current nested batch ``M_t`` of the paper): appends
never move or rewrite them. Rows ``[b, N)`` are the *tail*, kept in uniformly random
order by inside-out Fisher-Yates on insertion: a new row is written at ``N`` and swapped
with a uniformly random position in ``[b, N]``. Growing the prefix therefore always takes
a uniformly random subset of what is waiting, whatever order the stream arrives in.

Under ``metric="cosine"`` the store keeps unit rows: ``append`` and ``load`` normalise
what they take in (:func:`~nmbatch.engine.metric.unit_rows`; a zero row is refused, naming
its index, and nothing is stored). This is the engine's one place of ingestion: every host
and the estimator append through it.

Each row carries its id, the sample's position in the stream. ``retire`` removes rows by
id in one vectorised call (the kernels ``locate_ids`` and ``compact_rows``): a retired
prefix row's slot is filled by one of the last prefix rows (``b`` shrinks by the number
of prefix rows retired), then the tail is compacted by moving its last rows into the
free slots. Rows move whole, and which rows leave depends only on their ids, so the
prefix stays a uniformly random subset and the tail a uniformly random order of what is
retained (``docs/internals/retention.md``). ``retire`` reports every move, so an
algorithm can move its per-row state the same way.

Memory: the rows, ids and weights live in a :class:`~nmbatch.engine.store_memory.RowMemory`
(a reserved mapping that grows in place, or doubling where none is given).

Loading (``load``, what ``fit`` does): an empty store takes a whole array at once in a
uniformly random order, the one appending it would give (the same draws), but
copies only the rows the prefix needs: row ``r`` of the store is ``X[order[r]]``, written
when the prefix first reaches ``r`` (``freeze``, ``grow_batch``) or when anything reads
or moves rows past it (``finish_loading``). ``N`` and every id are set at once, so the
first step runs after ``b_0`` rows are copied, not ``N``. The store reads ``X`` until it is
loaded: the caller does not modify ``X`` in between (``fit`` finishes before it returns).

Concurrency: ``b`` and ``N`` change under one lock; appends only ever write at positions
``>= b``; growing the capacity either extends the view over the same memory or copies
into a new buffer, so a reader holding the old array still sees a valid, unchanged prefix.
``retire`` (also under the lock) moves prefix rows: it runs between the algorithm's steps,
which read their frozen prefix without the lock.

Sample weights: each row may carry a weight ``w >= 0`` (``append``/``load`` with
``weights=``), moved with the rows (how it is kept: :mod:`~nmbatch.engine.store_memory`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from nmbatch.engine._validation import as_float32_matrix, as_sample_weight
from nmbatch.engine.kernels.retire import compact_rows, locate_ids
from nmbatch.engine.kernels.shuffle import shuffle_insert, shuffle_order
from nmbatch.engine.metric import check_metric, metric_rows
from nmbatch.engine.state import Retirement
from nmbatch.engine.store_memory import RESERVE_BYTES, RowMemory

__all__ = ["RESERVE_BYTES", "NestedBatchStore", "OnPrefix", "Retirement"]

#: ``on_prefix(data, rows)``: sees the retired prefix rows before they move.
OnPrefix = Callable[[np.ndarray, np.ndarray], None]

_NO_WEIGHTS = np.empty(0, dtype=np.float64)
_NO_WEIGHTS.flags.writeable = False
_NO_IDS = np.empty(0, dtype=np.int64)
_NO_IDS.flags.writeable = False



class NestedBatchStore:
    """Append-only ``float32`` sample store whose unconsumed tail is uniformly shuffled.

    Parameters
    ----------
    dim : int
        Number of features ``d`` of every sample.
    seed : int or None
        Seed of the generator that shuffles the tail.
    capacity : int
        Initial number of rows allocated; doubles as needed.
    metric : {"euclidean", "cosine"}
        ``"cosine"``: the rows are stored as unit vectors (module docstring).

    Attributes
    ----------
    lock : threading.Lock
        Guards ``b``, ``N`` and the buffers; held only for short bookkeeping.
    """

    def __init__(
        self,
        dim: int,
        *,
        seed: int | None = None,
        capacity: int = 4096,
        metric: str = "euclidean",
    ) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = int(dim)
        self.metric = check_metric(metric)
        self.lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._mem = RowMemory(self.dim, capacity)
        self._n = 0
        self._b = 0
        self._next_id = 0  # stream id of the next appended row (one more than the largest)
        self._n_retired = 0
        # A load under way (``load``): row r of the store is _source[_order[r]], copied
        # for r < _loaded; None once every row is copied.
        self._source: np.ndarray | None = None
        self._order = np.empty(0, dtype=np.int64)
        self._loaded = 0

    # -- sizes ------------------------------------------------------------------------
    @property
    def n_samples(self) -> int:
        """``N``: number of samples stored."""
        return self._n

    @property
    def batch_size(self) -> int:
        """``b``: size of the frozen prefix (the current nested batch)."""
        return self._b

    def __len__(self) -> int:
        return self._n

    @property
    def n_ingested(self) -> int:
        """Stream id the next appended row gets by default: one more than the largest id
        ever stored (``N + n_retired`` when every id was the default)."""
        return self._next_id

    @property
    def n_retired(self) -> int:
        """Rows removed by ``retire`` since the store was made."""
        return self._n_retired

    @property
    def nbytes(self) -> int:
        """Bytes the rows, their ids and weights may occupy: the current capacity,
        ``(d + 2) * 4`` per row, 8 more once weighted (an upper bound on the memory
        committed, which grows with ``N``)."""
        return self._mem.nbytes

    @property
    def weighted(self) -> bool:
        """True once a row with a weight other than 1 was stored."""
        return self._mem.w is not None

    @property
    def weights_buffer(self) -> np.ndarray:
        """The weight of each row by position, ``(capacity,)`` float64, rows ``[0, N)``
        valid; empty ``(0,)`` while unweighted (every weight 1), which is how the kernels
        take it. Read without the lock (for ``retire``'s ``on_prefix``): like the rows,
        a prefix weight never changes while the prefix holds it."""
        w = self._mem.w
        return _NO_WEIGHTS if w is None else w

    def weights(self) -> np.ndarray:
        """Copy of the weight of each stored row, ``(N,)`` float64 (ones if unweighted)."""
        with self.lock:
            if self._mem.w is None:
                return np.ones(self._n, dtype=np.float64)
            return self._mem.w[: self._n].copy()

    # -- reading ----------------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        """The current buffer, shape ``(capacity, d)``, ``float32``; rows ``[0, N)`` valid
        (a load under way is finished first)."""
        self.finish_loading()
        return self._mem.data

    def prefix(self, b: int | None = None) -> np.ndarray:
        """Read-only view of rows ``[0, b)`` (default: the current prefix), ``(b, d)`` float32."""
        with self.lock:
            b = self._b if b is None else int(b)
            if b > self._b:
                raise ValueError(f"rows [0, {b}) are not all in the prefix (b = {self._b})")
            view = self._mem.data[:b]
        view = view.view()
        view.flags.writeable = False
        return view

    def samples(self) -> np.ndarray:
        """Copy of all stored rows ``[0, N)``, shape ``(N, d)``, float32."""
        with self.lock:
            self._fill(self._n)
            return self._mem.data[: self._n].copy()

    def ids(self) -> np.ndarray:
        """Copy of the insertion index of each stored row, shape ``(N,)``, int64.

        ``ids()[r]`` is the position in the stream (0 for the first sample ever appended,
        unless ``append`` was given other ids) of the sample now stored at row ``r``.
        """
        with self.lock:
            return self._mem.ids[: self._n].copy()

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Copies of the stored rows with stream ids ``ids`` (``(m,)`` int), in that order:
        shape ``(m, d)``, float32. Raises ``ValueError`` if one is not stored."""
        found, rows = self.find(ids)
        if not found.all():
            raise ValueError("some of the ids are not stored")
        return rows

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of the stream ids ``ids`` (``(m,)`` int, any order, repeats allowed) are
        stored, and copies of their rows, read under one lock: ``(found (m,) bool,
        rows (found.sum(), d) float32)``, the rows in the order of the found ids."""
        with self.lock:
            self._fill(self._n)
            at = self._locate(ids)
            found = at >= 0
            return found, self._mem.data[at[found]]

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        """The weights of the stored rows with stream ids ``ids`` (``(m,)`` int), in that
        order: shape ``(m,)``, float64 (ones while unweighted). Raises ``ValueError`` if
        one is not stored."""
        with self.lock:  # ids and weights are placed whole by a load: no fill needed
            at = self._locate(ids)
            if (at < 0).any():
                raise ValueError("some of the ids are not stored")
            if self._mem.w is None:
                return np.ones(at.shape[0], dtype=np.float64)
            return self._mem.w[at].copy()

    def _locate(self, ids: np.ndarray) -> np.ndarray:
        """The row now holding each of the stream ids ``ids`` (``(m,)`` int, any order,
        repeats allowed): ``(m,)`` int64, -1 where not stored (under the lock; a row moves
        at the next ``append`` or ``retire``). One hashed pass over the stored ids
        (:func:`~nmbatch.engine.kernels.retire.locate_ids`), O(N + m)."""
        query = np.asarray(ids, dtype=np.int64).ravel()
        distinct, where = np.unique(query, return_inverse=True)
        rows = np.full(distinct.shape[0], -1, dtype=np.int64)
        first = int(np.searchsorted(distinct, 0))  # ids < 0 are never stored
        if self._n and first < distinct.shape[0]:
            locate_ids(self._mem.ids[: self._n], distinct[first:], rows[first:])
        return rows[where.ravel()]

    # -- writing ----------------------------------------------------------------------
    def append(
        self,
        X: np.ndarray,
        ids: np.ndarray | None = None,
        *,
        any_order: bool = False,
        weights: np.ndarray | None = None,
    ) -> int:
        """Append the rows of ``X`` (shape ``(m, d)``, any real dtype) to the shuffled tail.

        ``ids`` (``(m,)`` integers, increasing, each ``>= n_ingested``): the rows' stream
        ids, for a caller that skips samples of its stream (a reservoir); default: the
        next ``m`` ids. ``any_order``: ``ids`` are non-negative in any order and distinct
        from each other and from every stored id (the caller's guarantee: a retained set
        restored in its own order); ``n_ingested`` becomes at least ``max(ids) + 1``.
        ``weights``: ``(m,)`` (or a scalar), each ``>= 0`` and finite; default 1.
        Raises ``ValueError`` (and stores nothing) for a wrong shape, non-finite values,
        a zero row under ``metric="cosine"``, bad ids or bad weights. Returns the new ``N``.
        """
        X = metric_rows(as_float32_matrix(X, dim=self.dim, allow_empty=True), self.metric)
        m = X.shape[0]
        w = as_sample_weight(weights, m, name="weights")
        if ids is not None:
            ids = np.asarray(ids)
            if ids.shape != (m,) or (m and not np.issubdtype(ids.dtype, np.integer)):
                raise ValueError(f"ids must be {m} integers, got shape {ids.shape}")
            ids = ids.astype(np.int64)
            if any_order:
                if m and ids.min() < 0:
                    raise ValueError(f"ids must be >= 0, got {ids.min()}")
            elif m > 1 and not (np.diff(ids) > 0).all():
                raise ValueError("ids must be strictly increasing")
        if m == 0:
            return self._n
        with self.lock:
            self._fill(self._n)
            n, b = self._n, self._b
            if ids is None:
                ids = np.arange(self._next_id, self._next_id + m, dtype=np.int64)
            elif not any_order and ids[0] < self._next_id:
                raise ValueError(f"ids must be >= {self._next_id} (the next id), got {ids[0]}")
            if n + m > self._mem.data.shape[0]:
                self._mem.grow(n + m, n)
            # Swap partner of the t-th new row: uniform in [b, n + t].
            swap = self._rng.integers(b, n + np.arange(m, dtype=np.int64) + 1)
            if w is not None or self._mem.w is not None:
                self._mem.place_weights(w, n, m, swap)
            shuffle_insert(X, swap, n, self._mem.data, self._mem.ids, ids)
            self._n = n + m
            self._next_id = max(self._next_id, int(ids.max()) + 1)
            return self._n

    def retire(
        self,
        *,
        ids: np.ndarray | None = None,
        before: int | None = None,
        on_prefix: OnPrefix | None = None,
        skip_missing: bool = False,
    ) -> Retirement:
        """Remove the rows whose id is in ``ids`` or below ``before``, in one call.

        ``ids``: stream ids (any order, repeats allowed, each >= 0), each stored, else
        ``ValueError`` and nothing changes; with ``skip_missing`` the ids not stored are
        passed over (and reported: ``Retirement.missing``). ``before``: every row with
        ``id < before`` (none stored is fine). ``on_prefix(data, rows)`` is called under
        the lock with the buffer and the
        retired prefix rows (sorted ``int64``) before any row moves: an algorithm takes
        their votes back there. Retired prefix slots are filled by the last prefix rows
        (``b`` shrinks by their number), tail slots by the last tail rows
        (:func:`compact_rows`), and the ``m`` slots freed past the new ``N`` are zeroed:
        no retired row stays in the buffer. Returns the :class:`Retirement` (every move).
        """
        query = None
        if ids is not None:
            query = np.unique(np.asarray(ids, dtype=np.int64).ravel())
            if query.shape[0] and query[0] < 0:
                raise ValueError(f"ids are >= 0, got {query[0]}")
        with self.lock:
            self._fill(self._n)
            n, b = self._n, self._b
            stored = self._mem.ids[:n]
            rows, missing = np.empty(0, dtype=np.int64), _NO_IDS
            if query is not None and query.shape[0]:
                rows = np.empty(query.shape[0], dtype=np.int64)
                if locate_ids(stored, query, rows) < query.shape[0]:
                    lost = rows < 0
                    if not skip_missing:
                        raise ValueError(f"{int(lost.sum())} of the {query.shape[0]} ids "
                                         "are not stored")  # fmt: skip
                    missing, rows = query[lost], rows[~lost]
                rows.sort()
            if before is not None:
                gone = np.less(stored, int(before))
                gone[rows] = True
                rows = np.flatnonzero(gone).astype(np.int64)
            n_prefix = int(np.searchsorted(rows, b))
            prefix_rows = rows[:n_prefix]
            if on_prefix is not None and n_prefix:
                on_prefix(self._mem.data, prefix_rows)
            moves = compact_rows(self._mem.data, self._mem.ids, rows, b, n)
            if self._mem.w is not None:  # the weights move as the rows did
                prefix_from, prefix_to, tail_from, tail_to = moves
                self._mem.w[prefix_to] = self._mem.w[prefix_from]
                self._mem.w[tail_to] = self._mem.w[tail_from]
            # The slots past the new N held retired rows or rows moved down: zeroed, so
            # no retired sample stays in the buffer (O(m d)).
            self._mem.data[n - rows.shape[0] : n] = 0.0
            self._b = b - n_prefix
            self._n = n - rows.shape[0]
            self._n_retired += int(rows.shape[0])
            return Retirement(n_prefix, int(rows.shape[0]) - n_prefix, self._b, self._n,
                              prefix_rows, *moves, missing=missing)  # fmt: skip

    def retire_before(self, threshold: int, *, on_prefix: OnPrefix | None = None) -> Retirement:
        """Remove every row whose id is below ``threshold`` (a window or an age limit)."""
        return self.retire(before=threshold, on_prefix=on_prefix)

    def retire_ids(self, ids: np.ndarray, *, on_prefix: OnPrefix | None = None) -> Retirement:
        """Remove the rows with these stream ids (each must be stored): a reservoir."""
        return self.retire(ids=ids, on_prefix=on_prefix)

    def grow_batch(self, b: int) -> int:
        """Set the prefix size to ``min(b, N)`` (never shrinks it); returns the new ``b``."""
        with self.lock:
            self._b = max(self._b, min(int(b), self._n))
            self._fill(self._b)
            return self._b

    def freeze(self, b: int) -> tuple[np.ndarray, int]:
        """Grow the prefix to ``min(b, N)`` and return ``(buffer, b)`` read under the lock.

        The returned buffer stays valid for rows ``[0, b)`` whatever is appended later.
        """
        with self.lock:
            self._b = max(self._b, min(int(b), self._n))
            self._fill(self._b)
            return self._mem.data, self._b

    def load(
        self,
        X: np.ndarray,
        *,
        first: int = 0,
        checked: bool = False,
        weights: np.ndarray | None = None,
    ) -> int:
        """Fill the empty store with the rows of ``X`` (``(n, d)``) in a uniformly random
        order, copying only rows ``[0, first)`` now (the rest as the prefix reaches them).

        Row ``r`` becomes ``X[order[r]]`` with id ``n_ingested + order[r]``, ``order`` the
        uniformly random permutation of ``0 .. n-1`` that ``append(X)`` would make, from the
        same draws of the store's generator (:func:`shuffle_order`): the same rows in the
        same places, so any prefix is a uniformly random subset and the tail a uniformly
        random order. ``checked``: ``X`` is already a C-contiguous, finite
        ``float32`` array, of unit rows under ``metric="cosine"`` (``fit``'s validated
        input; not copied, read until the load is finished: do not modify it before
        :meth:`finish_loading`); otherwise it is validated and converted as by
        ``append``. ``weights`` as by ``append`` (row ``r`` gets ``weights[order[r]]``).
        Raises ``ValueError`` if the store is not empty (or, unchecked, for a
        bad ``X``). Returns the new ``N``.
        """
        if not checked:
            X = metric_rows(as_float32_matrix(X, dim=self.dim, allow_empty=True), self.metric)
        elif X.dtype != np.float32 or X.ndim != 2 or X.shape[1] != self.dim:
            raise ValueError(f"X must be (n, {self.dim}) float32, got {X.dtype} {X.shape}")
        n = X.shape[0]
        w = as_sample_weight(weights, n, name="weights")
        with self.lock:
            if self._n or self._source is not None:
                raise ValueError(f"load needs an empty store; it holds {self._n} rows")
            if n == 0:
                return 0
            if n > self._mem.data.shape[0]:
                self._mem.grow(n, self._n)
            # The draws and the order of append(X) on an empty store, without the rows.
            swap = self._rng.integers(0, np.arange(n, dtype=np.int64) + 1)
            order = np.empty(n, dtype=np.int64)
            shuffle_order(swap, order)
            np.add(order, self._next_id, out=self._mem.ids[:n])
            if w is not None:
                np.take(w, order, out=self._mem.weigh()[:n])
            self._source, self._order, self._loaded = np.ascontiguousarray(X), order, 0
            self._n = n
            self._next_id += n
            self._fill(min(max(int(first), 0), n))
            return n

    def finish_loading(self) -> None:
        """Copy every row a :meth:`load` has not copied yet (nothing if none)."""
        with self.lock:
            self._fill(self._n)

    @property
    def n_loaded(self) -> int:
        """Rows ``[0, n_loaded)`` are in the buffer (``N`` unless a load is under way)."""
        return self._n if self._source is None else self._loaded

    def _fill(self, stop: int) -> None:
        """Copy the loaded rows ``[_loaded, stop)`` from the source (under the lock)."""
        if self._source is None or stop <= self._loaded:
            return
        start = self._loaded
        np.take(self._source, self._order[start:stop], axis=0, out=self._mem.data[start:stop],
                mode="clip")  # the indices are valid; "raise" would buffer the copy
        self._loaded = stop
        if stop >= self._n:  # every row copied: let go of the caller's array
            self._source, self._order = None, np.empty(0, dtype=np.int64)

    @property
    def grows_in_place(self) -> bool:
        """True while the rows live in the reserved range (growth copies nothing)."""
        return self._mem.grows_in_place
