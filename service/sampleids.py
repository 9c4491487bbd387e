"""Sample ids of a ``POST /samples`` body, checked, or a ``422`` problem naming the fault
and the row.

A JSON body may name its samples (docs/api.md, "Sample ids"): the member ``ids``, one id
per vector, each a string of 1 to :data:`ID_MAX_BYTES` bytes (UTF-8) of the characters
of :data:`ID_PATTERN` (letters, digits and ``. _ : ~ @ + = -``: safe in a URL path as
they are), or a 64-bit signed integer, which is the same id as its decimal string (``5``
and ``"5"`` name one sample). The ids of one request are distinct; unique per model is
checked where they are stored, with the append (:mod:`nmbatch.service.storage.log`, a
409 problem). Without ``ids`` the service assigns each sample ``"<log entry id>-<row>"``
(:func:`~nmbatch.service.storage.log.assigned_ids`); a client id of that form
(:data:`ASSIGNED_FORM`) is refused, so an assigned id never names a client's sample.

An ``application/x-npz`` body carries them as its member ``ids`` (:func:`npy_ids`): a
1-D array of ``int64`` (or another integer type) or of unicode strings (``np.str_``, at
most 128 characters), what ``np.savez(f, X=X, ids=ids)`` writes; the same checks apply.
``.npy`` and raw bodies carry no ids (their samples get assigned ones).

Memory: the list is checked by type in one pass over the decoded members (each string at
most :data:`ID_MAX_BYTES` bytes: the body's size bounds them); the ids are kept as one
``list[str]``.
"""

from __future__ import annotations

import re

from nmbatch.service.npy import npy_array
from nmbatch.service.problems import ProblemError

__all__ = ["ASSIGNED_FORM", "IDS", "ID_MAX_BYTES", "ID_PATTERN", "any_id", "check_id", "json_ids",
           "npy_ids"]

IDS = "ids"
"""The name of the ids, a JSON member."""

ID_MAX_BYTES = 128
"""Longest string id, in bytes (the characters of :data:`ID_PATTERN` are one byte each)."""

ID_PATTERN = r"^[A-Za-z0-9._:~@+=-]{1,128}$"
"""The characters of a string id (and of the ``{id}`` of ``/samples/{id}``)."""

ASSIGNED_FORM = re.compile(r"^[0-9]+-[0-9]+-[0-9]+$")
"""The form of the ids the service assigns (``"<ms>-<seq>-<row>"``), refused from
clients."""

_ID = re.compile(ID_PATTERN)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def json_ids(raw: object, n: int) -> list[str]:
    """The JSON member ``ids`` of a body of ``n`` vectors, as ``n`` distinct strings
    (integers in decimal); a ``422`` problem (``invalid-ids``, member ``row`` when one id
    is at fault) otherwise."""
    if not isinstance(raw, list):
        raise _invalid(f"ids must be a list of strings or integers, one per vector; got "
                       f"{type(raw).__name__}")  # fmt: skip
    if len(raw) != n:
        raise _invalid(f"{len(raw)} ids for {n} vectors: send one id per vector",
                       expected=n, got=len(raw))  # fmt: skip
    ids: list[str] = []
    for row, value in enumerate(raw):
        ids.append(check_id(value, row))
    if len(set(ids)) != n:
        seen: dict[str, int] = {}
        for row, value in enumerate(ids):
            if value in seen:
                raise _invalid(f"id {value!r} of vector {row} is also the id of vector "
                               f"{seen[value]}: ids must be distinct", row=row)  # fmt: skip
            seen[value] = row
    return ids


def npy_ids(member: bytes, n: int) -> list[str]:
    """The ``ids`` member of an ``.npz`` body of ``n`` vectors (``.npy`` bytes of a 1-D
    integer or unicode array) as :func:`json_ids` returns them; its header is checked
    before the data is touched (strings of at most :data:`ID_MAX_BYTES` characters)."""

    def check(shape: tuple[int, ...]) -> None:
        if len(shape) != 1:
            raise _invalid(f"ids must be a 1-D array of {n} ids, got shape {shape}")
        if shape[0] != n:
            raise _invalid(f"{shape[0]} ids for {n} vectors: send one id per vector",
                           expected=n, got=int(shape[0]))  # fmt: skip

    ids = npy_array(member, check, name=IDS, text=True)
    if ids.dtype.kind == "U" and ids.dtype.itemsize > 4 * ID_MAX_BYTES:
        raise _invalid(f"ids of dtype {ids.dtype} may be longer than {ID_MAX_BYTES} characters")
    if ids.dtype.kind not in "Uiu":
        raise _invalid(f"ids must be integers or unicode strings, got dtype {ids.dtype}")
    return json_ids(ids.tolist(), n)


def check_id(value: object, row: int | None = None) -> str:
    """One sample id sent by a client (a string of :data:`ID_PATTERN` not of the
    :data:`ASSIGNED_FORM`, or a 64-bit integer) as its string; a ``422`` problem
    otherwise (``row``: the vector it names, if any)."""
    where = "" if row is None else f" of vector {row}"
    extra = {} if row is None else {"row": row}
    if type(value) is int:
        if not _INT64[0] <= value <= _INT64[1]:
            raise _invalid(f"the id{where} is an integer beyond 64 bits", **extra)
        return str(value)
    if not isinstance(value, str):
        raise _invalid(f"the id{where} is {type(value).__name__}, not a string or an integer",
                       **extra)  # fmt: skip
    if not _ID.match(value):
        shown = value[:40]
        raise _invalid(
            f"the id{where} ({shown!r}) must be 1 to {ID_MAX_BYTES} characters of letters, "
            "digits and . _ : ~ @ + = -", **extra,
        )  # fmt: skip
    if ASSIGNED_FORM.match(value):
        raise _invalid(f"the id{where} ({value!r}) has the form of the ids the service "
                       "assigns (<ms>-<seq>-<row>): choose another", **extra)  # fmt: skip
    return value


def any_id(value: object, row: int | None = None) -> str:
    """A sample id naming a stored sample (``GET``/``DELETE /samples/{id}``, ``POST
    /samples/delete``): an assigned one, or one a client may send (:func:`check_id`)."""
    if isinstance(value, str) and ASSIGNED_FORM.match(value):
        return value
    return check_id(value, row)


def _invalid(detail: str, **members: object) -> ProblemError:
    return ProblemError(422, "invalid-ids", detail, **members)
