"""Binary array bodies: ``.npy`` read in place, ``.npz`` archives of them, and the
checks every decoded array of vectors goes through.

- ``application/x-npy``: one array in NumPy's ``.npy`` format. Its preamble and header
  are read and checked (dtype, shape, and length against the body) before any memory is
  allocated; object dtypes (pickles) are refused there: nothing is ever unpickled. The
  data is then used in place (:func:`npy_array`).
- ``application/x-npz``: what ``np.savez(f, X=X, weights=w)`` writes, a zip archive of
  ``.npy`` members (:func:`npz_members`). The archive's directory is counted from its
  last record before :mod:`zipfile` reads it (at most :data:`NPZ_MEMBERS` members), the
  members must be *stored* (``np.savez``, not ``np.savez_compressed``: a compressed
  member would decompress to more bytes than the body carries, and the memory a request
  may make the server spend is bounded by its size), and each member's ``.npy`` header
  is checked like a body's. At most one copy of each member is made (``zipfile.read``,
  CRC checked), so reading an archive takes at most about twice the body.

Problems: 400 ``malformed-body`` (not an archive, a bad header, a length that does not
match), 422 for what the arrays hold (``non-numeric``, ``not-a-matrix``,
``too-many-vectors`` is 413, ``wrong-dimension``, ``dimension-too-large``) and for an
archive's members (``unknown-member``, ``not-a-matrix`` without ``X``).
"""

from __future__ import annotations

import io
import math
import struct
import zipfile
from collections.abc import Callable

import numpy as np

from nmbatch.service.problems import ProblemError

__all__ = [
    "NPY_HEADER_MAX",
    "NPZ_MEMBERS",
    "check_dtype",
    "check_max_dim",
    "npy_array",
    "npy_matrix",
    "npz_members",
    "too_many",
    "wrong_dim",
]

Body = bytes | bytearray | memoryview

NPY_HEADER_MAX = 16 * 1024
"""Most bytes read for a ``.npy`` preamble and header (numpy refuses headers over 10,000)."""
NPZ_MEMBERS = ("X", "weights", "ids")
"""The members an ``.npz`` body of samples may hold (``X.npy`` required; ``weights`` and
``ids`` optional)."""

_EOCD = b"PK\x05\x06"  # a zip archive's end-of-central-directory record
_EOCD_SIZE = 22  # its size without the archive's comment (at most 65,535 bytes)
_DIRECTORY_MAX = 1536  # bytes of directory: three members' entries, with zip64 fields, fit


def npy_array(
    body: Body,
    check_shape: Callable[[tuple[int, ...]], None] | None = None,
    name: str = "vectors",
    *,
    text: bool = False,
) -> np.ndarray:
    """The array of a ``.npy`` body, of any shape, used in place (read-only when ``body``
    is ``bytes``); its header checked before the data is touched: a real numeric dtype
    (:func:`check_dtype`; ``name`` says what the array is), ``check_shape(shape)``
    (raises a problem), a shape whose bytes are exactly the body's data."""
    stream = io.BytesIO(bytes(body[:NPY_HEADER_MAX]))  # the header only is copied
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"npy format version {version} is not supported (1.0 and 2.0 are)")
    except Exception as exc:  # numpy's header parser raises ValueError, TokenError, ...
        raise ProblemError(
            400, "malformed-body", f"the body is not a valid .npy array: {exc}"[:500]
        ) from None
    if not (text and dtype.kind == "U"):  # text: unicode strings allowed too (sample ids)
        check_dtype(dtype, name)  # object dtypes (pickles) stop here, before any data is touched
    if check_shape is not None:
        check_shape(shape)
    if min(shape, default=0) < 0:
        raise ProblemError(400, "malformed-body", f"the .npy header declares shape {shape}")
    # The header promises shape * itemsize bytes; check before anything is allocated.
    offset = stream.tell()
    expected = math.prod(shape) * dtype.itemsize
    available = len(body) - offset
    if expected != available:
        raise ProblemError(
            400,
            "malformed-body",
            f"the .npy header declares shape {shape} of {dtype} ({expected} bytes of data) "
            f"but the body carries {available} bytes of data",
        )
    data = np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=offset)
    if fortran_order:
        return data.reshape(shape[::-1]).transpose()
    return data.reshape(shape)


def npy_matrix(body: Body, max_vectors: int, dim: int | None, max_dim: int | None) -> np.ndarray:
    """The 2-D array of vectors of a ``.npy`` body (:func:`npy_array`), its shape checked
    against ``max_vectors`` (413), ``max_dim`` and ``dim`` (422)."""

    def check(shape: tuple[int, ...]) -> None:
        if len(shape) != 2:
            raise ProblemError(
                422, "not-a-matrix", f"the array must be 2-D (n_vectors, dim), got shape {shape}"
            )
        if min(shape) < 0:
            return  # a malformed header: npy_array says so
        if shape[0] > max_vectors:
            raise too_many(shape[0], max_vectors)
        if max_dim is not None:
            check_max_dim(shape[1], max_dim)
        if dim is not None and shape[1] != dim:
            raise wrong_dim(shape[1], dim)

    return npy_array(body, check)


def npz_members(body: Body) -> dict[str, bytes]:
    """The ``.npy`` bytes of each member of an ``.npz`` body, by name without ``.npy``
    (see the module): ``X`` and, if sent, ``weights``."""
    count, directory = _directory(body)
    if count > len(NPZ_MEMBERS) or directory > _DIRECTORY_MAX:
        raise ProblemError(
            422,
            "unknown-member",
            f"the .npz archive holds {count} members ({directory} bytes of directory); it "
            f"may hold {' and '.join(NPZ_MEMBERS)} only",
        )
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            infos = archive.infolist()
            names = [info.filename.removesuffix(".npy") for info in infos]
            unknown = sorted(set(names) - set(NPZ_MEMBERS))
            if unknown or len(set(names)) != len(names):
                raise ProblemError(
                    422, "unknown-member",
                    f"the .npz archive holds {sorted(names)}; it may hold X, weights and ids, "
                    "once each (np.savez(f, X=X, weights=w, ids=ids))",
                )  # fmt: skip
            if "X" not in names:
                raise ProblemError(
                    422, "not-a-matrix", "the .npz archive has no X: np.savez(f, X=X, weights=w)"
                )
            packed = [info.filename for info in infos if info.compress_type != zipfile.ZIP_STORED]
            if packed or sum(info.file_size for info in infos) > len(body):
                raise ProblemError(
                    422, "compressed-member",
                    f"the .npz members {packed} are compressed; send them stored, as np.savez "
                    "writes them (not np.savez_compressed)",
                )  # fmt: skip
            return {name: archive.read(info) for name, info in zip(names, infos, strict=True)}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError) as exc:
        raise ProblemError(
            400, "malformed-body", f"the body is not a valid .npz archive: {exc}"[:500]
        ) from None


def _directory(body: Body) -> tuple[int, int]:
    """Entries and bytes of the central directory of a zip archive, from its last record,
    found where :mod:`zipfile` looks for it (the last 22 bytes, else the last such
    signature within a comment's reach). :mod:`zipfile` builds an object per entry of the
    directory's bytes: those are bounded before it reads them."""
    size = len(body)
    start = max(0, size - _EOCD_SIZE - 0xFFFF)
    end = bytes(body[start:])
    at = size - _EOCD_SIZE - start
    if at < 0 or end[at : at + 4] != _EOCD:
        at = end.rfind(_EOCD)
    if at < 0 or at + _EOCD_SIZE > len(end):
        raise ProblemError(
            400, "malformed-body", "the body is not an .npz archive (no zip directory found)"
        )
    count, directory = struct.unpack_from("<HI", end, at + 10)
    return int(count), int(directory)


# -- the checks every decoded array of vectors goes through ------------------------------
def check_dtype(dtype: np.dtype, name: str = "vectors") -> None:
    """422 ``non-numeric`` unless ``dtype`` is real numbers (no booleans, complex, objects,
    strings); ``name`` says what the array is."""
    if dtype.kind == "b":
        what = "coordinates" if name == "vectors" else name
        raise ProblemError(422, "non-numeric", f"booleans are not {what}; send numbers")
    if dtype.kind == "c":
        raise ProblemError(422, "non-numeric", f"complex values ({dtype}) are not accepted")
    if dtype.kind not in "iuf" or dtype.fields is not None:
        raise ProblemError(
            422,
            "non-numeric",
            f"{name} must be real numbers, got dtype {dtype} "
            "(strings, nulls, objects or integers beyond 64 bits are not numbers here)",
        )


def check_max_dim(d: int, limit: int) -> None:
    """422 ``dimension-too-large`` if ``d`` is above ``limit``."""
    if d > limit:
        raise ProblemError(
            422,
            "dimension-too-large",
            f"vectors have {d} coordinates; a model's dimension may be at most {limit} "
            "(NMBATCH_MAX_DIM, or set NMBATCH_DIM)",
            max_dim=limit,
            got_dim=int(d),
        )


def wrong_dim(d: int, dim: int) -> ProblemError:
    """422 ``wrong-dimension``: vectors of ``d`` coordinates for a model of ``dim``."""
    return ProblemError(
        422,
        "wrong-dimension",
        f"vectors have {d} coordinates, but this model's dimension is {dim}",
        expected_dim=dim,
        got_dim=int(d),
    )


def too_many(n: int, limit: int) -> ProblemError:
    """413 ``too-many-vectors``: ``n`` vectors, above ``limit``."""
    return ProblemError(
        413,
        "too-many-vectors",
        f"{n} vectors in one request; the limit is {limit} (NMBATCH_MAX_VECTORS)",
        limit=limit,
    )
