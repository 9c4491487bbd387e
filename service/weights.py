"""Sample weights of a ``POST /samples`` body, checked, or a ``422`` problem naming the
fault and the row.

A body may carry one weight per vector (docs/api.md, "Sample weights"): the JSON member
``weights`` (a list of numbers), or the ``weights`` member of an ``.npz`` body (a 1-D
array of real numbers, :mod:`nmbatch.service.npy`). Each weight is finite and ``>= 0``
(a weight of 0 stores the vector, which then counts nowhere); a weight of ``w`` is the
model of ``w`` copies of its vector. The problem is ``invalid-weights`` (member ``row``:
the first vector whose weight is at fault, when one is) or, for weights that are not
numbers, ``non-numeric``. The final conversion is the engine's own check
(:func:`~nmbatch.engine._validation.as_sample_weight`), so the service never logs a weight
the store would refuse; weights that are all 1 are no weights (the log entries are those
of an unweighted request).

Memory: the JSON list is checked by type with a few C-level passes before an array is
built (8 bytes a weight); an ``.npz`` member is read in place.
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine._validation import as_sample_weight
from nmbatch.service.npy import npy_array
from nmbatch.service.problems import ProblemError

__all__ = ["WEIGHTS", "json_weights", "npy_weights"]

WEIGHTS = "weights"
"""The name of the weights, a JSON member and an ``.npz`` member."""

_NUMBERS = frozenset((int, float))


def json_weights(raw: object, n: int) -> np.ndarray | None:
    """The JSON member ``weights`` of a body of ``n`` vectors: ``(n,)`` float64, or None
    when every weight is 1."""
    if not isinstance(raw, list):
        raise _invalid(f"weights must be a list of numbers, one per vector; got "
                       f"{type(raw).__name__}")  # fmt: skip
    _check_length(len(raw), n)
    kinds = set(map(type, raw))
    if not kinds <= _NUMBERS:
        row = next(i for i, value in enumerate(raw) if type(value) not in _NUMBERS)
        raise ProblemError(
            422, "non-numeric",
            f"the weight of vector {row} is {type(raw[row]).__name__}, not a number",
            row=row,
        )  # fmt: skip
    # orjson gives a float for an integer beyond 64 bits, and refuses one beyond a double
    # (422 non-finite): only ints and floats of a double's range are left.
    return _checked(np.array(raw, dtype=np.float64), n)


def npy_weights(member: bytes, n: int) -> np.ndarray | None:
    """The ``weights`` member of an ``.npz`` body of ``n`` vectors (``.npy`` bytes of a 1-D
    real array): ``(n,)`` float64, or None when every weight is 1."""

    def check(shape: tuple[int, ...]) -> None:
        if len(shape) != 1:
            raise _invalid(f"weights must be a 1-D array of {n} numbers, got shape {shape}")
        _check_length(shape[0], n)

    return _checked(np.asarray(npy_array(member, check, name=WEIGHTS), dtype=np.float64), n)


def _check_length(got: int, n: int) -> None:
    if got != n:
        raise ProblemError(
            422, "invalid-weights",
            f"{got} weights for {n} vectors: send one weight per vector",
            expected=n, got=int(got),
        )  # fmt: skip


def _checked(w: np.ndarray, n: int) -> np.ndarray | None:
    """``w`` ``(n,)`` float64 checked: a problem naming the first row whose weight is NaN,
    infinite or negative; None if all are 1."""
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.shape[0]:
        row = int(bad[0])
        raise _invalid(f"the weight of vector {row} is {w[row]}: weights must be finite", row)
    negative = np.flatnonzero(w < 0)
    if negative.shape[0]:
        row = int(negative[0])
        raise _invalid(f"the weight of vector {row} is {w[row]}: weights must be >= 0", row)
    try:
        return as_sample_weight(w, n, name=WEIGHTS)
    except ValueError as exc:  # the engine's check, the one the store makes
        raise _invalid(str(exc)) from None


def _invalid(detail: str, row: int | None = None) -> ProblemError:
    extra = {} if row is None else {"row": row}
    return ProblemError(422, "invalid-weights", detail, **extra)
