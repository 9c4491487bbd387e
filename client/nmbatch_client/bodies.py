"""Request bodies of vectors: ``.npy``, raw ``float32``, and ``.npz`` with each row's
sample weight and id.

Pure functions (no I/O), shared by every operation that sends rows
(:mod:`nmbatch_client.operations`) and so by the synchronous and the asynchronous
client alike. A body of rows with weights or ids is an ``application/x-npz`` archive,
``np.savez(f, X=..., weights=..., ids=...)`` with stored (uncompressed) members, which
the service reads as it reads a JSON body's members (docs/api.md, "Sample weights",
"Sample ids").
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

__all__ = [
    "NPY",
    "NPY_RESERVE",
    "NPZ",
    "NPZ_RESERVE",
    "OCTET",
    "Encoding",
    "as_ids",
    "as_matrix",
    "as_weights",
    "encode",
    "encode_npz",
    "row_bytes",
]

Encoding = Literal["npy", "raw"]
NPY = "application/x-npy"
NPZ = "application/x-npz"
OCTET = "application/octet-stream"
NPY_RESERVE = 256
"""Bytes kept free in each body for the ``.npy`` preamble and header (128 for 2-D arrays)."""
NPZ_RESERVE = 1024
"""Bytes kept free in each ``.npz`` body: a ``.npy`` header per member (128) and the
archive's headers and directory (about 100 a member)."""
_ID_MAX = 128
"""Longest sample id the service takes (characters)."""


def as_matrix(X: Any) -> np.ndarray:
    """``X`` as a 2-D array without copying (a memory map stays one).

    Raises ValueError for another number of dimensions and TypeError for values that are
    not numbers (strings, objects). Booleans and complex numbers pass: the service refuses
    them with its own ``422`` problem.
    """
    A = np.asarray(X)
    if A.ndim != 2:
        hint = "; wrap one vector as [[...]]" if A.ndim == 1 else ""
        raise ValueError(f"vectors must be a 2-D array (n, d), got shape {A.shape}{hint}")
    if A.dtype.kind not in "iufbc":
        raise TypeError(f"vectors must be numbers, got dtype {A.dtype}")
    return A


def as_weights(weights: Any, n: int) -> np.ndarray:
    """``weights`` as ``(n,)`` float64, one per row (the service checks the values:
    finite, ``>= 0``); ValueError for another shape."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"weights must be {n} numbers (one per row), got shape {w.shape}")
    return w


def as_ids(ids: Sequence[str | int] | np.ndarray, n: int) -> np.ndarray:
    """``ids`` as an ``(n,)`` array, one id per row: ``int64`` when every id is an
    integer, else unicode strings (an integer id is the same id as its decimal string).

    ValueError for another count, for ids that are neither strings nor integers, or for
    a string longer than the service takes; the service checks the rest (characters,
    distinct, unique in the model: ``422`` ``invalid-ids``, ``409``
    ``duplicate-sample-id``)."""
    values = list(np.asarray(ids, dtype=object).reshape(-1)) if isinstance(ids, np.ndarray) \
        else list(ids)  # fmt: skip
    if len(values) != n:
        raise ValueError(f"ids must be {n} ids (one per row), got {len(values)}")
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.int64).reshape(n)
    out: list[str] = []
    for row, value in enumerate(values):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = str(int(value))
        if not isinstance(value, str):
            raise ValueError(f"the id of row {row} is {type(value).__name__}, not a string "
                             "or an integer")  # fmt: skip
        if len(value) > _ID_MAX:
            raise ValueError(f"the id of row {row} is longer than {_ID_MAX} characters")
        out.append(value)
    return np.asarray(out, dtype=str).reshape(n)


def row_bytes(
    A: np.ndarray, weights: np.ndarray | None = None, ids: np.ndarray | None = None
) -> int:
    """Bytes one row of ``A`` ``(n, d)`` takes in a body (``float32`` when real), with its
    ``weights`` (8) and its id (``ids``' item size: 8, or 4 a character) if sent."""
    itemsize = 4 if A.dtype.kind in "iuf" else A.dtype.itemsize
    extra = (8 if weights is not None else 0) + (ids.dtype.itemsize if ids is not None else 0)
    return max(1, A.shape[1] * itemsize + extra)


def encode_npz(
    chunk: np.ndarray, weights: np.ndarray | None, ids: np.ndarray | None
) -> tuple[bytes, str]:
    """An ``application/x-npz`` body of ``chunk`` ``(m, d)`` (as float32 when real) with
    its ``weights`` ``(m,)`` float64 and its ``ids`` ``(m,)`` (``int64`` or unicode),
    each if given: ``np.savez(f, X=..., weights=..., ids=...)``, members stored (the
    service refuses compressed ones)."""
    if chunk.dtype.kind in "iuf":
        with np.errstate(over="ignore"):
            chunk = np.ascontiguousarray(chunk, dtype="<f4")
    members: dict[str, np.ndarray] = {"X": chunk}
    if weights is not None:
        members["weights"] = np.ascontiguousarray(weights, dtype="<f8")
    if ids is not None:
        members["ids"] = np.ascontiguousarray(ids)
    out = io.BytesIO()
    np.savez(out, **members)  # type: ignore[arg-type]
    return out.getvalue(), NPZ


def encode(chunk: np.ndarray, encoding: Encoding) -> tuple[bytes, str]:
    """A body and its content type for ``chunk`` ``(m, d)``: real numbers as float32.

    ``raw`` is little-endian float32, row-major (the service must know ``d`` already);
    ``npy`` is NumPy's format (any model). Other dtypes go as ``.npy`` unchanged.
    """
    if chunk.dtype.kind in "iuf":
        with np.errstate(over="ignore"):  # beyond float32: inf, which the service refuses
            chunk = np.ascontiguousarray(chunk, dtype="<f4")
        if encoding == "raw":
            return chunk.tobytes(), OCTET
    out = io.BytesIO()
    np.save(out, chunk, allow_pickle=False)
    return out.getvalue(), NPY
