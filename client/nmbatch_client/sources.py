"""What :meth:`Client.push <nmbatch_client.Client.push>` reads: arrays, files, iterators.

:func:`open_source` turns a source into :class:`Batches`, an iterator of 2-D arrays
(rows are vectors) and their total number of rows when known (for a progress bar):

- a file path (``str`` or ``os.PathLike``), by its suffix:

  - ``.npy``: memory-mapped; only the chunk being sent is read;
  - ``.csv``, ``.tsv``, ``.txt``: numbers, ``batch_rows`` lines parsed at a time (the
    lines are counted first, for the total); a first line that is not numbers is a
    header, whose names ``columns`` may select;
  - ``.parquet``: ``batch_rows`` rows at a time (``pyarrow.parquet.ParquetFile``);
  - ``.arrow``, ``.feather``, ``.ipc``: Arrow IPC, file or stream format, a record batch
    at a time (memory-mapped);

  Parquet and Arrow need pyarrow (``pip install 'nmbatch-client[arrow]'``). Their
  vectors are either one column of lists of numbers of the same length (an embedding
  column: ``columns="embedding"``), or numeric columns, one per dimension
  (``columns=["x", "y"]``; default: every column of the file);
- any other iterable that is not array-like (a generator, ``iter(list_of_arrays)``, a
  reader): each item is a batch of rows ``(m, d)``;
- anything else is array-like ``(n, d)`` and is pushed as before.

Errors: :class:`SourceError` (a ``ValueError``) for a file or a column that cannot be
read, before anything of it is sent, or when the batch that holds the problem comes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ARROW_SUFFIXES",
    "BATCH_ROWS",
    "TEXT_SUFFIXES",
    "Batches",
    "SourceError",
    "is_source",
    "open_source",
]

BATCH_ROWS = 65_536
"""Rows read from a text or Parquet file at a time (an Arrow file's batches are its own)."""
TEXT_SUFFIXES = (".csv", ".tsv", ".txt")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
Columns = str | Sequence[str] | None


class SourceError(ValueError):
    """A file, a column or a batch that cannot be pushed."""


@dataclass
class Batches:
    """Batches of rows ``(m, d)`` of one source, and how many rows in all (None: unknown)."""

    arrays: Iterator[Any]
    total: int | None


def is_source(X: Any) -> bool:
    """True if ``X`` is a file path or an iterable of batches rather than an array."""
    if isinstance(X, (str, os.PathLike)):
        return True
    array_like = isinstance(X, (np.ndarray, list, tuple)) or hasattr(X, "__array__")
    return isinstance(X, Iterable) and not array_like


def open_source(source: Any, columns: Columns = None, batch_rows: int = BATCH_ROWS) -> Batches:
    """The :class:`Batches` of a file path or an iterable of arrays (see the module)."""
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    if isinstance(source, (str, os.PathLike)):
        return _open_file(Path(source), _column_list(columns), batch_rows)
    if columns is not None:
        raise ValueError("columns selects columns of a Parquet, Arrow or CSV file only")
    return Batches(iter(source), None)


def _column_list(columns: Columns) -> list[str] | None:
    if columns is None:
        return None
    names = [columns] if isinstance(columns, str) else list(columns)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"columns must be a column name or a list of them, got {columns!r}")
    return names


def _open_file(path: Path, columns: list[str] | None, batch_rows: int) -> Batches:
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        if columns is not None:
            raise SourceError(f"{path}: a .npy file has no columns")
        return _npy(path)
    if suffix in TEXT_SUFFIXES:
        return _text(path, columns, batch_rows)
    if suffix == ".parquet":
        return _parquet(path, columns, batch_rows)
    if suffix in ARROW_SUFFIXES:
        return _arrow(path, columns)
    known = ", ".join((".npy", *TEXT_SUFFIXES, ".parquet", *ARROW_SUFFIXES))
    raise SourceError(f"{path}: unknown file type {suffix!r} (known: {known})")


def _npy(path: Path) -> Batches:
    try:
        A = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot read: {exc}") from None
    if A.ndim < 2:
        raise SourceError(f"{path}: expected a 2-D array (n_samples, n_features), got {A.shape}")
    A = A.reshape(A.shape[0], -1) if A.ndim > 2 else A
    return Batches(iter([A]), A.shape[0])


# -- text ------------------------------------------------------------------------------------
def _text(path: Path, columns: list[str] | None, batch_rows: int) -> Batches:
    delimiter = {".csv": ",", ".tsv": "\t"}.get(path.suffix.lower())
    try:
        with path.open() as handle:
            first = handle.readline().strip()
        lines = _count_lines(path)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc}") from None
    fields = [f.strip() for f in first.split(delimiter)] if first else []
    header = not _numbers(fields)
    if columns is None:
        usecols = None
    elif not header:
        raise SourceError(f"{path}: columns {columns} given, but the file has no header line")
    else:
        missing = [c for c in columns if c not in fields]
        if missing:
            raise SourceError(f"{path}: no column {missing[0]!r} (columns: {', '.join(fields)})")
        usecols = [fields.index(c) for c in columns]
    total = max(0, lines - header)  # blank lines, which are skipped, count here

    def batches() -> Iterator[np.ndarray]:
        with path.open() as handle:
            if header:
                handle.readline()
            done = 0
            while True:
                block = list(itertools.islice(handle, batch_rows))
                if not block:
                    return
                try:
                    A = np.loadtxt(block, delimiter=delimiter, usecols=usecols, ndmin=2,
                                   dtype=np.float64)  # fmt: skip
                except ValueError as exc:
                    where = f"lines {done + header + 1}-{done + header + len(block)}"
                    raise SourceError(f"{path}: {where}: {exc}") from None
                done += len(block)
                if A.size:
                    yield A

    return Batches(batches(), total)


def _count_lines(path: Path) -> int:
    """Lines of a text file (a last line without its newline counts)."""
    lines, last = 0, b"\n"
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def _numbers(fields: list[str]) -> bool:
    try:
        for field in fields:
            float(field)
    except ValueError:
        return False
    return True


# -- Parquet and Arrow -------------------------------------------------------------------------
def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow
    except ImportError:
        raise SourceError(
            f"{path}: reading Parquet and Arrow files needs pyarrow: "
            "pip install 'nmbatch-client[arrow]'"
        ) from None
    return pyarrow


def _parquet(path: Path, columns: list[str] | None, batch_rows: int) -> Batches:
    _pyarrow(path)
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise SourceError(f"{path}: cannot read: {exc}") from None
    names = parquet.schema_arrow.names
    _check_columns(path, columns, names)

    def batches() -> Iterator[np.ndarray]:
        for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
            yield record_rows(batch, columns or names, path)

    return Batches(batches(), parquet.metadata.num_rows)


def _arrow(path: Path, columns: list[str] | None) -> Batches:
    pa = _pyarrow(path)
    try:
        source = pa.memory_map(str(path))
        try:
            reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid:  # the stream format (no footer)
            source.seek(0)
            reader = pa.ipc.open_stream(source)
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot read: {exc}") from None
    names = reader.schema.names
    _check_columns(path, columns, names)
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        parts = [reader.get_batch(i) for i in range(reader.num_record_batches)]  # mapped
        return Batches((record_rows(b, columns or names, path) for b in parts),
                       sum(b.num_rows for b in parts))  # fmt: skip
    return Batches((record_rows(b, columns or names, path) for b in reader), None)


def _check_columns(path: Path, columns: list[str] | None, names: list[str]) -> None:
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise SourceError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)})")


def record_rows(batch: Any, names: Sequence[str], path: Path | str = "") -> np.ndarray:
    """The vectors of a pyarrow ``RecordBatch``: ``(m, d)``.

    One column of lists (fixed-size or not, all of one length ``d``) gives its lists as
    rows; numeric columns give one dimension each, in the order of ``names``. Nulls,
    lists of different lengths and columns that are not numbers raise
    :class:`SourceError`.
    """
    import pyarrow as pa

    columns = [batch.column(name) for name in names]
    for name, column in zip(names, columns, strict=True):
        if column.null_count:
            raise SourceError(f"{path}: column {name!r} has {column.null_count} nulls")
    kinds = [column.type for column in columns]
    lists = [pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
             for t in kinds]  # fmt: skip
    if any(lists):
        if len(columns) != 1:
            raise SourceError(
                f"{path}: a column of lists ({names[lists.index(True)]!r}) must be the only "
                f"column pushed; select it with columns"
            )
        return _list_rows(columns[0], names[0], path)
    for name, kind in zip(names, kinds, strict=True):
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise SourceError(f"{path}: column {name!r} holds {kind}, not numbers")
    if not columns:
        raise SourceError(f"{path}: no columns")
    return np.column_stack([c.to_numpy(zero_copy_only=False) for c in columns])


def _list_rows(column: Any, name: str, path: Path | str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    m = len(column)
    kind = column.type
    if not (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)):
        raise SourceError(f"{path}: column {name!r} holds {kind}, not lists of numbers")
    if pa.types.is_fixed_size_list(kind):
        d = kind.list_size
    else:
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if m and not (lengths == lengths[0]).all():
            raise SourceError(f"{path}: column {name!r} has lists of different lengths "
                              f"({lengths.min()} to {lengths.max()})")  # fmt: skip
        d = int(lengths[0]) if m else 0
    values = column.flatten()  # the values of the lists, without their offset's slack
    if values.null_count:
        raise SourceError(f"{path}: column {name!r} has null numbers in its lists")
    return values.to_numpy(zero_copy_only=False).reshape(m, d)
