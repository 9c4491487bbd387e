"""Initial centroids a user gives (``init=`` an array): checked, and as a model keeps them.

One check for every door a user's centroids come through (the estimator's ``init=``
array takes :func:`~nmbatch.engine._estimator_checks.check_init`; the service's
``PUT /models/{name}`` with ``init``, ``NMBATCH_INIT_FILE`` and ``nmbatch fit --init
FILE`` take :func:`given_centroids`): a real, finite ``(k, d)`` matrix, as ``float32``,
and under ``metric="cosine"`` each row as a unit vector (a zero row has no direction:
:class:`~nmbatch.engine.metric.ZeroRowError` naming it). The result is what the model
starts from: a model seeded with it publishes these very centroids first.
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.metric import metric_rows

__all__ = ["GivenCentroidsError", "given_centroids"]


class GivenCentroidsError(ValueError):
    """Given centroids that cannot seed the model: ``what`` names the fault
    (``shape``, ``values``); the message says it in words."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


def given_centroids(init: object, k: int, dim: int | None, metric: str) -> np.ndarray:
    """``init`` as the ``(k, d)`` float32 centroids a model of ``k`` clusters, dimension
    ``dim`` (None: any) and ``metric`` starts from: a new C-contiguous array, its rows
    unit vectors under ``metric="cosine"``.

    Raises :class:`GivenCentroidsError` (``what="shape"``: not ``(k, dim)``;
    ``"values"``: not numeric, not real, not finite or beyond ``float32``) or
    :class:`~nmbatch.engine.metric.ZeroRowError` (a zero row under cosine, by index).
    """
    try:
        A = np.asarray(init)
    except (TypeError, ValueError) as exc:  # ragged lists: no (k, dim) shape
        raise GivenCentroidsError("shape", f"init is not a (k, dim) matrix: {exc}") from None
    d = dim if dim is not None else (A.shape[1] if A.ndim == 2 else None)
    if A.shape != (int(k), d):
        wanted = f"({int(k)}, {d if d is not None else 'd'})"
        raise GivenCentroidsError(
            "shape", f"init has shape {A.shape}, but the model needs (k, dim) = {wanted}"
        )
    try:
        C = as_float32_matrix(A, name="init")
    except ValueError as exc:  # not numbers, not real, not finite, beyond float32
        raise GivenCentroidsError("values", str(exc)) from None
    return np.array(metric_rows(C, metric, name="init"), dtype=np.float32, order="C")
