"""A model's base in Redis: its record, its entries' format, and reading it back.

A reservoir's retained rows are written anew into a *base* (``nmbatch:{model}:base:{g}``)
by a compaction (:meth:`~nmbatch.service.storage.retained.RetainedLog.compact`); the meta
hash names the committed one (:class:`Base`). Each base entry holds ``n`` rows of ``d``
columns (``x``, as in the log), their stream ids (``ids``, little-endian ``int64``) and,
for a weighted model, their weights (``w``, as in the log). :class:`BaseReader` reads the
committed base back (the worker's replay): its rows, or for a Ray engine the heads of its
entries, and raises :class:`BaseChangedError` when a newer compaction replaced it
meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from nmbatch.engine.rows import SourceRows
from nmbatch.service.storage.codec import as_str, decode_chunk, decode_weights
from nmbatch.service.storage.entries import EntryHead, read_heads
from nmbatch.service.storage.keys import ModelKeys

__all__ = [
    "Base",
    "BaseChangedError",
    "BaseReader",
    "decode_base_entry",
    "encode_base_entries",
]


class BaseChangedError(RuntimeError):
    """The base changed under a compaction or a reader: another compaction committed
    first, or another writer touched the base being written. Nothing was committed."""


@dataclass(frozen=True)
class Base:
    """The committed base of a model, as the meta hash names it.

    Attributes
    ----------
    generation : int
        ``g`` >= 1: the base's rows are in ``nmbatch:{model}:base:{g}``.
    last_id : str
        The base holds the retained samples of the log up to and including this entry
        id; the retained samples after it are the log's entries after it.
    n_rows : int
        Rows in the base.
    policy : dict
        JSON-able state of the retention policy as of ``last_id`` (opaque here).
    entries : tuple of str
        The ids of its entries, in order, when this process wrote it (:meth:`RetainedLog.
        compact`; ``()`` when read from the meta hash).
    rows_per_entry : int
        Rows of each of those entries but the last (0 when read).
    """

    generation: int
    last_id: str
    n_rows: int
    policy: dict[str, Any]
    entries: tuple[str, ...] = field(default=(), compare=False)
    rows_per_entry: int = field(default=0, compare=False)


def encode_base_entries(
    ids: np.ndarray,
    X: np.ndarray,
    start: int,
    stop: int,
    rows_per_entry: int,
    weights: np.ndarray | None = None,
) -> list[dict[str, bytes | int]]:
    """Base entry field maps of rows ``start:stop`` of ``X`` (``(n, d)`` float32) and
    ``ids`` (``(n,)`` int64), ``rows_per_entry`` rows each (the last may hold fewer):
    ``n``, ``d``, ``x`` as in the log, ``ids`` as little-endian ``int64`` bytes and, with
    ``weights`` (``(n,)`` float64), ``w`` as in the log."""
    d = int(X.shape[1])
    entries: list[dict[str, bytes | int]] = []
    for i in range(start, stop, rows_per_entry):
        end = min(i + rows_per_entry, stop)
        fields: dict[str, bytes | int] = {"n": int(end - i), "d": d, "x": X[i:end].tobytes(),
                                          "ids": ids[i:end].tobytes()}  # fmt: skip
        if weights is not None:
            fields["w"] = np.ascontiguousarray(weights[i:end], dtype="<f8").tobytes()
        entries.append(fields)
    return entries


def decode_base_entry(fields: dict[bytes, bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, X)`` of one base entry: ``(n,)`` int64 and ``(n, d)`` float32 (read-only)."""
    X = decode_chunk(fields)
    ids = np.frombuffer(fields[b"ids"], dtype="<i8")
    if ids.size != X.shape[0]:
        raise ValueError(f"corrupt base entry: {ids.size} ids for {X.shape[0]} rows")
    return ids, X


class BaseReader:
    """The committed base of one model read back (a part of
    :class:`~nmbatch.service.storage.retained.RetainedLog`, which sets these attributes;
    ``client`` returns bytes)."""

    client: redis.Redis
    keys: ModelKeys

    def read_base(self) -> Base | None:
        """The committed base named by the meta hash, or None before the first compaction."""
        fields = ("base_generation", "base_last_id", "base_rows", "base_policy")
        generation, last_id, n_rows, policy = self.client.hmget(self.keys.meta, fields)
        if generation is None:
            return None
        return Base(int(generation), as_str(last_id), int(n_rows), json.loads(policy))

    def base_rows(
        self, base: Base, page: int = 32
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """The rows of ``base`` in the stored order, ``page`` entries per round trip.

        Yields ``(ids, X, weights)`` per round trip: ``(n,)`` int64, ``(n, d)`` float32
        and ``(n,)`` float64 (None when no entry of the page has weights). Raises
        :class:`BaseChangedError` at the end if fewer or more than ``base.n_rows`` rows
        came (a newer compaction replaced the base while it was read).
        """
        key = self.keys.base(base.generation)
        start, seen = "-", 0
        while True:
            entries = self.client.xrange(key, start, "+", count=page)
            if not entries:
                break
            parts = [decode_base_entry(fields) for _, fields in entries]
            weights = [decode_weights(fields) for _, fields in entries]
            seen += sum(ids.size for ids, _ in parts)
            w = None
            if any(part is not None for part in weights):
                pairs = zip(parts, weights, strict=True)
                w = np.concatenate([np.ones(i.size) if p is None else p for (i, _), p in pairs])
            yield (
                np.concatenate([ids for ids, _ in parts]).astype(np.int64, copy=False),
                np.concatenate([X for _, X in parts]).astype(np.float32, copy=False),
                w,
            )
            if len(entries) < page:
                break
            start = "(" + as_str(entries[-1][0])
        _check_rows(base, seen)

    def base_heads(self, base: Base, page: int = 256) -> Iterator[EntryHead]:
        """The heads of the entries of ``base`` in the stored order, with their stream ids
        (:func:`~nmbatch.service.storage.entries.read_heads`; the rows stay in Redis).
        Raises :class:`BaseChangedError` as :meth:`base_rows`."""
        key = self.keys.base(base.generation)
        after, seen = None, 0
        while True:
            heads = read_heads(self.client, key, after, page, with_ids=True)
            yield from heads
            seen += sum(len(head.rows) for head in heads)
            if len(heads) < page:
                break
            after = heads[-1].entry_id
        _check_rows(base, seen)

    def base_layout(
        self, base: Base, ids: np.ndarray, dim: int
    ) -> tuple[list[SourceRows], list[np.ndarray]]:
        """Where the rows of ``base``, just written by :meth:`compact` from stream ids
        ``ids`` ``(n,)`` int64 in that order (``dim`` columns), are: the
        :class:`SourceRows` naming each entry and the ids of its rows."""
        key, step = self.keys.base(base.generation), max(1, base.rows_per_entry)
        if -(-int(ids.shape[0]) // step) != len(base.entries):
            raise ValueError(f"{ids.shape[0]} rows for {len(base.entries)} entries of {step}")
        parts = [np.asarray(ids[e * step : (e + 1) * step], np.int64)
                 for e in range(len(base.entries))]  # fmt: skip
        return [SourceRows.whole((key, entry), part.shape[0], dim)
                for entry, part in zip(base.entries, parts, strict=True)], parts  # fmt: skip


def _check_rows(base: Base, seen: int) -> None:
    """Raise :class:`BaseChangedError` unless ``seen`` rows are the base's."""
    if seen != base.n_rows:
        raise BaseChangedError(
            f"base generation {base.generation} gave {seen} rows, not {base.n_rows}: "
            "a newer compaction replaced it while it was read"
        )
