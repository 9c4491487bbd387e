"""Input checks shared by the store, the algorithms and the estimator."""

from __future__ import annotations

import numpy as np

__all__ = ["as_float32_matrix"]


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
    if not np.isfinite(out).all():
        raise ValueError(f"{name} contains NaN or infinity (or values too large for float32)")
    return out
