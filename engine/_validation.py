"""Input checks shared by the store, the algorithms and the estimator."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["all_finite", "as_float32_matrix", "as_sample_weight"]


@numba.njit(cache=True, nogil=True)
def all_finite(A):
    """True when every element of ``A`` is finite (no NaN, no infinity).

    A    : (n, d) float32, C-contiguous   IN

    One pass, no temporary: ``np.isfinite(A).all()`` writes an ``(n, d)`` bool array
    first, which costs as much again on a large ``fit`` input.
    """
    flat = A.ravel()
    ok = True
    for i in range(flat.shape[0]):
        v = flat[i]
        ok &= (v - v) == 0.0  # inf - inf and nan - nan are nan
    return ok


def as_float32_matrix(
    X: object, *, dim: int | None = None, allow_empty: bool = False, name: str = "X"
) -> np.ndarray:
    """Return ``X`` as a C-contiguous ``(n, d)`` ``float32`` array, or raise ``ValueError``.

    Accepts any real numeric dtype and C or Fortran order. Rejects non-numeric,
    complex, non-2-D, empty (unless ``allow_empty``), non-finite input (also values
    finite in their own dtype that overflow ``float32``), and a wrong number of
    features when ``dim`` is given.
    """
    try:
        A = np.asarray(X)
    except Exception as exc:  # ragged nested lists and the like
        raise ValueError(f"{name} is not a numeric array: {exc}") from None
    if A.dtype == object or not (
        np.issubdtype(A.dtype, np.number) or np.issubdtype(A.dtype, np.bool_)
    ):
        raise ValueError(f"{name} must be numeric, got dtype {A.dtype}")
    if np.issubdtype(A.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real, got complex dtype {A.dtype}")
    if A.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {A.shape}")
    if A.shape[1] == 0:
        raise ValueError(f"{name} has 0 features; at least 1 is required")
    if dim is not None and A.shape[1] != dim:
        raise ValueError(f"{name} has {A.shape[1]} features, but {dim} are expected")
    if A.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} is empty: 0 samples; at least 1 is required")
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(A, dtype=np.float32)
    if not all_finite(out):
        raise ValueError(f"{name} contains NaN or infinity (or values too large for float32)")
    return out


def as_sample_weight(weight: object, n: int, *, name: str = "sample_weight") -> np.ndarray | None:
    """Return the weights of ``n`` samples as a ``(n,)`` ``float64`` array, or None when
    every weight is 1 (``weight`` None, or all ones): unweighted, which costs nothing.

    A scalar gives every sample that weight. Raises ``ValueError`` for a wrong shape,
    a non-numeric dtype, or a negative, NaN or infinite weight. A weight of 0 is
    accepted: the sample is stored but counts nowhere (docs/design.md, "Sample weights").
    """
    if weight is None:
        return None
    try:
        w = np.asarray(weight)
    except Exception as exc:
        raise ValueError(f"{name} is not a numeric array: {exc}") from None
    if w.dtype == object or not (
        np.issubdtype(w.dtype, np.number) or np.issubdtype(w.dtype, np.bool_)
    ) or np.issubdtype(w.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real numbers, got dtype {w.dtype}")
    if w.ndim == 0:
        w = np.full(n, w, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) (one weight per sample), got {w.shape}")
    w = np.ascontiguousarray(w, dtype=np.float64)
    if not np.isfinite(w).all():
        raise ValueError(f"{name} contains NaN or infinity")
    if n and w.min() < 0:
        raise ValueError(f"{name} must be >= 0, got {w.min()} (sample {int(w.argmin())})")
    if (w == 1.0).all():
        return None
    return w
