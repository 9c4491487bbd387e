"""Request bodies and query strings to ``(n, d)`` ``float32`` matrices, or a problem.

Accepted bodies:

- ``application/json``: ``{"vectors": [[x11, x12, ...], ...]}`` (parsed with orjson);
- ``application/x-npy``: one 2-D real numeric array in NumPy's ``.npy`` format (its
  header is read and checked, dtype, shape and length against the body, before any
  memory is allocated; object dtypes and pickles are refused, nothing is ever unpickled);
- ``application/octet-stream``: raw little-endian ``float32``, row-major, ``n * d``
  values (only when the dimension ``d`` is known);
- ``POST /samples`` only (:func:`parse_samples`): the vectors' sample weights, the JSON
  member ``"weights"`` beside ``"vectors"``, or an ``application/x-npz`` body (what
  ``np.savez(f, X=X, weights=w)`` writes; :mod:`nmbatch.service.npy`), checked by
  :mod:`nmbatch.service.weights`; and their ids, the JSON member ``"ids"`` or the
  ``.npz`` member ``ids`` (:mod:`nmbatch.service.sampleids`).

Rejected, with a problem naming the fault: malformed bodies (400), other content types
(415), too many vectors (413), and with 422 booleans, strings, nulls, object or complex
arrays, ragged or non-2-D arrays, empty arrays, a wrong dimension, a dimension above
``max_dim`` (when the model has none yet), NaN or infinity. The final conversion is the
engine's own check (:func:`engine._validation.as_float32_matrix`), so the service never
logs a sample the store would refuse.

Resources: :func:`read_body` refuses a body above ``max_bytes`` from its
``Content-Length`` before reading anything, and again while it streams in (chunked
bodies, lying lengths), and gives up on a body that takes longer than its timeout (408).

Memory: a parse takes at most **40 bytes per body byte, plus about 1 MiB**, on every
path (docs/operations/limits.md). ``.npy`` and raw bodies are used in place (at most 5
bytes per byte: ``int8`` data converted to ``float32``), ``.npz`` bodies after a copy
of the archive and one of each member (at most 10 bytes per byte: ``int8`` weights
become ``float64``; 5.4 measured for ``int8`` vectors of 16 coordinates); the JSON kernel
(:mod:`nmbatch.service.jsonfast`) writes ``float64`` (at most 4 bytes per byte). Other
JSON goes through orjson (about 8 bytes per byte reserved by its parser, then a Python
object per value; measured at most 21 bytes per byte for numbers, 34 for a body of
empty vectors). Before it is decoded, a JSON body is refused when it holds more ``[``
than ``max_vectors + 1`` (every vector needs one; one more for a list of weights; 413),
or more than
:data:`MAX_JSON_STRINGS` objects or strings (422): counts of bytes, no Python object
built. Decoding is bounded by orjson's nesting limit (1024). After it, the element types
and row lengths are checked before any array is built (a string among numbers would
make numpy build a string array of ``4 * longest * count`` bytes).

:func:`parse_vectors` and :func:`parse_query_vector` are synchronous and may take long
on big bodies: call them through ``run_in_threadpool`` from async code.
"""

from __future__ import annotations

import itertools

import anyio
import numpy as np
import orjson
from starlette.requests import ClientDisconnect, Request

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.service.jsonfast import parse_json_matrix
from nmbatch.service.npy import (
    NPY_HEADER_MAX,
    check_dtype,
    check_max_dim,
    npy_matrix,
    npz_members,
    too_many,
    wrong_dim,
)
from nmbatch.service.problems import ProblemError
from nmbatch.service.sampleids import IDS, json_ids, npy_ids
from nmbatch.service.weights import WEIGHTS, json_weights, npy_weights

__all__ = [
    "JSON",
    "MAX_JSON_STRINGS",
    "NPY",
    "NPY_HEADER_MAX",
    "NPZ",
    "OCTET",
    "SAMPLE_BODY_TYPES",
    "SUPPORTED_BODY_TYPES",
    "media_type",
    "parse_query_vector",
    "parse_samples",
    "parse_vectors",
    "read_body",
]

JSON = "application/json"
NPY = "application/x-npy"
OCTET = "application/octet-stream"
NPZ = "application/x-npz"
SUPPORTED_BODY_TYPES = (JSON, NPY, OCTET)
SAMPLE_BODY_TYPES = (JSON, NPY, NPZ, OCTET)
"""What ``POST /samples`` takes: the vectors' types, and ``.npz`` (vectors and weights)."""

MAX_JSON_STRINGS = 32
"""Most strings (``"`` pairs), and most objects (``{``), a JSON body may hold to be
decoded (a vectors body has one of each; a few more let the problem name the unknown
member or the element at fault). Beyond, 422 from a count of the bytes."""

Body = bytes | bytearray


def media_type(content_type: str | None) -> str:
    """The bare, lower-case media type of a ``Content-Type`` header (no parameters)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


async def read_body(request: Request, max_bytes: int, timeout: float | None = None) -> bytearray:
    """The request body, or a problem as soon as it is known to be unacceptable.

    - 413 ``body-too-large``: a ``Content-Length`` above ``max_bytes`` is refused before
      anything is read; without one (chunked) or if it lies, the bytes are counted as they
      arrive and the body is refused at the first chunk past the limit (never buffered).
    - 408 ``body-timeout``: the whole body has not arrived ``timeout`` seconds after the
      handler started reading it (a total deadline, not an idle one, so a client that
      trickles a byte now and then is cut off too). None: no deadline.
    - 400 ``malformed-body``: the client went away before the end of the body.

    Both 413 and 408 carry ``Connection: close``: the rest of the body is never read.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise ProblemError(400, "malformed-body", "Content-Length is not an integer") from None
        if length > max_bytes:
            raise _too_large(length, max_bytes)
    body = bytearray()
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                if len(body) + len(chunk) > max_bytes:
                    raise _too_large(len(body) + len(chunk), max_bytes, received=True)
                body += chunk
    except TimeoutError:
        raise ProblemError(
            408,
            "body-timeout",
            f"the request body did not arrive within {timeout:g} s "
            f"(NMBATCH_BODY_TIMEOUT_SECONDS); {len(body)} bytes were received",
            title="Request Timeout",
            headers={"Connection": "close"},
            limit_seconds=timeout,
        ) from None
    except ClientDisconnect:
        raise ProblemError(400, "malformed-body", "the client closed the connection") from None
    return body


def _too_large(size: int, limit: int, *, received: bool = False) -> ProblemError:
    """413: ``size`` is the declared length, or (``received``) the bytes read so far."""
    more = "at least " if received else ""
    return ProblemError(
        413,
        "body-too-large",
        f"the body has {more}{size} bytes; the limit is {limit} bytes (NMBATCH_MAX_BODY_BYTES): "
        "send the vectors in several requests",
        headers={"Connection": "close"},
        limit=limit,
        received_bytes=size if received else 0,
    )


def parse_vectors(
    body: Body,
    content_type: str,
    *,
    dim: int | None,
    max_vectors: int,
    max_dim: int | None = None,
) -> np.ndarray:
    """Parse a body of one of :data:`SUPPORTED_BODY_TYPES` into vectors.

    Parameters
    ----------
    body : bytes-like
        The raw request body (not modified; the result may share its memory).
    content_type : str
        Its ``Content-Type`` header (parameters are ignored).
    dim : int or None
        Required number of coordinates; None accepts any (but octet-stream needs it).
    max_vectors : int
        Most vectors accepted (413 above).
    max_dim : int or None
        With ``dim`` None, most coordinates per vector (422 ``dimension-too-large``
        above); checked before the values are decoded.

    Returns
    -------
    ndarray of shape (n, d), float32, C-contiguous, finite, with ``n >= 1``.
    """
    return _parse(body, content_type, dim, max_vectors, max_dim, weighted=False)[0]


def parse_samples(
    body: Body,
    content_type: str,
    *,
    dim: int | None,
    max_vectors: int,
    max_dim: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None, list[str] | None]:
    """:func:`parse_vectors` of a ``POST /samples`` body (one of
    :data:`SAMPLE_BODY_TYPES`), with the vectors' sample weights and ids:
    ``(X, weights, ids)``, ``X`` as :func:`parse_vectors` returns it, ``weights`` ``(n,)``
    float64, finite, ``>= 0``, or None when the body has none (or all are 1), ``ids``
    ``n`` distinct strings (:func:`~nmbatch.service.sampleids.json_ids`; JSON bodies
    only) or None."""
    return _parse(body, content_type, dim, max_vectors, max_dim, weighted=True)


def _parse(
    body: Body,
    content_type: str,
    dim: int | None,
    max_vectors: int,
    max_dim: int | None,
    *,
    weighted: bool,
) -> tuple[np.ndarray, np.ndarray | None, list[str] | None]:
    """The vectors of a body, and (``weighted``: a samples body) its weights and ids."""
    kind = media_type(content_type)
    limit_dim = max_dim if dim is None else None
    members: dict[str, object] = {}
    npz: dict[str, bytes] = {}
    if kind == JSON:
        raw, members = _json_vectors(body, max_vectors, limit_dim, weighted)
    elif kind == NPY:
        raw = npy_matrix(body, max_vectors, dim, limit_dim)
    elif kind == OCTET:
        raw = _octet_matrix(body, dim)
    elif kind == NPZ and weighted:
        npz = npz_members(body)
        raw = npy_matrix(npz["X"], max_vectors, dim, limit_dim)
    else:
        accepted = SAMPLE_BODY_TYPES if weighted else SUPPORTED_BODY_TYPES
        shown = kind or "no Content-Type"
        raise ProblemError(
            415,
            "unsupported-media-type",
            f"{shown} is not accepted; send {', '.join(accepted)}",
            accepted=list(accepted),
        )
    X = _checked_matrix(raw, dim=dim, max_vectors=max_vectors, max_dim=limit_dim)
    n = X.shape[0]
    ids = json_ids(members[IDS], n) if IDS in members else None
    if IDS in npz:
        ids = npy_ids(npz[IDS], n)
    if WEIGHTS in npz:
        return X, npy_weights(npz[WEIGHTS], n), ids
    if WEIGHTS in members:
        return X, json_weights(members[WEIGHTS], n), ids
    return X, None, ids


def parse_query_vector(text: str, *, dim: int | None) -> np.ndarray:
    """``"v1,v2,..."`` (decimal numbers, commas) to a ``(1, d)`` ``float32`` matrix."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(p == "" for p in parts):
        raise ProblemError(
            422, "not-a-matrix", "vector must be comma-separated numbers, e.g. vector=0.5,1,2"
        )
    values = []
    for part in parts:
        try:
            value = float(part)
        except ValueError:
            raise ProblemError(
                422, "non-numeric", f"vector contains {part[:40]!r}, which is not a number"
            ) from None
        values.append(value)
    return _checked_matrix(np.asarray([values], dtype=np.float64), dim=dim, max_vectors=1)


# -- decoders: body -> array of any dtype/shape ------------------------------------------
def _json_vectors(
    body: Body, max_vectors: int, max_dim: int | None, weighted: bool = False
) -> tuple[np.ndarray, dict[str, object]]:
    """The vectors of a JSON body, and (``weighted``) its ``weights`` and ``ids`` members
    as sent, by name (absent ones left out)."""
    # The common form, read without Python floats and without holding the GIL; any
    # other body (or a number not converted exactly there) takes the orjson path. That
    # form has one object, one string and a "[" per vector (its row count is checked
    # here), so the byte counts below, which hold the GIL (about 1 ms per MB each),
    # are needed only on the other path.
    fast = parse_json_matrix(body)
    if (
        fast is not None
        and fast.shape[0] <= max_vectors
        and (max_dim is None or fast.shape[1] <= max_dim)
    ):
        return fast, {}
    # The orjson path. Each vector needs its own "[": far more of them means too many
    # vectors (or nesting no matrix has), found without building one Python object.
    brackets = body.count(b"[")
    if brackets > max_vectors + 1 + 2 * weighted:
        raise ProblemError(
            413,
            "too-many-vectors",
            f"the JSON body opens {brackets} lists; at most {max_vectors} vectors are accepted "
            "in one request (NMBATCH_MAX_VECTORS)",
            limit=max_vectors,
        )
    # A vectors body holds one object and one string (its key): bodies of many objects
    # or strings are refused before orjson builds a Python object for each (a few are
    # decoded, so that the problem can name the member or element at fault).
    objects = body.count(b"{")
    if objects > MAX_JSON_STRINGS:
        raise ProblemError(
            422,
            "not-a-matrix",
            f"the JSON body opens {objects} objects; it must be one object "
            '{"vectors": [[...], ...]} of numbers',
        )
    quotes = body.count(b'"')  # a samples body may also name each vector (ids)
    if quotes > 2 * MAX_JSON_STRINGS + 2 * max_vectors * weighted:
        raise ProblemError(
            422,
            "non-numeric",
            f"the JSON body holds {quotes} quotes (strings); only numbers are coordinates, "
            'and a vectors body has one string, its key "vectors"',
        )
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "infinity" in str(exc):  # a number such as 1e999: valid JSON, not finite
            raise ProblemError(
                422, "non-finite", f"the body holds a number too large for a double (vectors "
                f"and weights must be finite): {exc}"
            ) from None
        raise ProblemError(400, "malformed-body", f"the body is not valid JSON: {exc}") from None
    if not isinstance(document, dict) or "vectors" not in document:
        raise ProblemError(
            422, "not-a-matrix", 'the JSON body must be an object {"vectors": [[...], ...]}'
        )
    unknown = sorted(set(document) - ({"vectors", WEIGHTS, IDS} if weighted else {"vectors"}))
    if unknown:
        raise ProblemError(422, "unknown-member", f"unknown member(s) {unknown} in the JSON body")
    vectors = document["vectors"]
    if not isinstance(vectors, list):
        raise ProblemError(
            422, "not-a-matrix", f"vectors must be a list of lists, got {type(vectors).__name__}"
        )
    if len(vectors) > max_vectors:
        raise too_many(len(vectors), max_vectors)
    if max_dim is not None and vectors and isinstance(vectors[0], list):
        check_max_dim(len(vectors[0]), max_dim)
    # Types and shape before any array: np.array of a list holding strings would build
    # a fixed-width string array of 4 * longest * count bytes.
    _check_rows(vectors)
    # Now only equal-length lists of int and float: 8 bytes per number.
    # The members as sent: a "weights": null is a member too (refused).
    return np.array(vectors), {name: document[name] for name in (WEIGHTS, IDS) if name in document}


_NUMBERS = frozenset((int, float))
_ELEMENT_FAULTS = (  # (Python type, slug, what it is in the body), first match named
    (bool, "non-numeric", "true/false"),
    (str, "non-numeric", "strings"),
    (type(None), "non-numeric", "nulls"),
    (dict, "non-numeric", "objects"),
    (list, "not-a-matrix", "lists nested in a vector (more than 2 dimensions)"),
)


def _check_rows(vectors: list[object]) -> None:
    """422 unless ``vectors`` is a list of lists of the same length holding only JSON
    numbers (``int``, ``float``; never ``bool``). A few C-level passes, no copies."""
    row_types = set(map(type, vectors))
    if row_types - {list}:
        found = ", ".join(sorted(t.__name__ for t in row_types - {list}))
        hint = "; wrap one vector as [[...]]" if row_types <= _NUMBERS else ""
        raise ProblemError(
            422,
            "not-a-matrix",
            f"vectors must be a list of lists of numbers; it holds {found}{hint}",
        )
    if len(set(map(len, vectors))) > 1:  # type: ignore[arg-type]
        raise ProblemError(
            422,
            "not-a-matrix",
            "vectors is ragged: every vector must be a flat list with the same number of numbers",
        )
    kinds = set(map(type, itertools.chain.from_iterable(vectors)))  # type: ignore[arg-type]
    if kinds <= _NUMBERS:
        return
    slug, what = next(
        ((slug, what) for kind, slug, what in _ELEMENT_FAULTS if kind in kinds),
        ("non-numeric", ", ".join(sorted(t.__name__ for t in kinds - _NUMBERS))),
    )
    raise ProblemError(422, slug, f"vectors contain {what}; only numbers are coordinates")


def _octet_matrix(body: Body, dim: int | None) -> np.ndarray:
    if dim is None:
        raise ProblemError(
            409,
            "dimension-unknown",
            "raw float32 bodies need a known dimension: set NMBATCH_DIM or send a first batch "
            "as JSON or .npy",
        )
    row_bytes = 4 * dim
    if len(body) % row_bytes:
        raise ProblemError(
            422,
            "not-a-matrix",
            f"{len(body)} bytes is not a whole number of float32 vectors of dimension {dim} "
            f"({row_bytes} bytes each)",
        )
    return np.frombuffer(body, dtype="<f4").reshape(-1, dim)


# -- the checks every decoded array goes through -----------------------------------------
def _checked_matrix(
    array: np.ndarray, *, dim: int | None, max_vectors: int, max_dim: int | None = None
) -> np.ndarray:
    check_dtype(array.dtype)
    if array.size == 0:
        raise ProblemError(
            422, "empty", f"no values: the array has shape {array.shape}; send at least one vector"
        )
    if array.ndim != 2:
        hint = "; wrap one vector as [[...]]" if array.ndim == 1 else ""
        raise ProblemError(
            422,
            "not-a-matrix",
            f"vectors must form a 2-D array (n_vectors, dim), got shape {array.shape}{hint}",
        )
    if array.shape[0] > max_vectors:
        raise too_many(array.shape[0], max_vectors)
    if max_dim is not None:
        check_max_dim(array.shape[1], max_dim)
    if dim is not None and array.shape[1] != dim:
        raise wrong_dim(array.shape[1], dim)
    with np.errstate(over="ignore", invalid="ignore"):
        finite = bool(np.isfinite(array).all()) if array.dtype.kind == "f" else True
    if not finite:
        raise ProblemError(422, "non-finite", "vectors contain NaN or infinity")
    try:
        return as_float32_matrix(array, dim=dim, name="vectors")
    except ValueError as exc:  # e.g. finite float64 values beyond the float32 range
        raise ProblemError(422, "non-finite", str(exc)) from None
