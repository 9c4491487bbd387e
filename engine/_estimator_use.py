"""What a fitted ``NestedMiniBatchKMeans`` answers: ``predict``, ``transform``, ``score``.

``ModelUseMixin`` needs from its class ``cluster_centers_`` (``(k, d)`` float32),
``_check_fitted()`` and ``_check_X(X, reset=False)`` (``(n, d)`` float32), and ``fit``.
The output names (``get_feature_names_out``) are scikit-learn's
``ClassNamePrefixFeaturesOutMixin``'s: ``nestedminibatchkmeans0`` ... ``{k-1}``.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin

from nmbatch.engine.assign import nearest
from nmbatch.engine.threads import with_threads

__all__ = ["ModelUseMixin"]

# Elements (rows x k x d) of one float64 block of ``transform``.
_TRANSFORM_BLOCK = 1 << 20


class ModelUseMixin(ClassNamePrefixFeaturesOutMixin):
    """``predict``, ``fit_predict``, ``transform``, ``fit_transform``, ``score`` and
    ``get_feature_names_out`` of a fitted k-means model."""

    cluster_centers_: np.ndarray
    labels_: np.ndarray

    @with_threads
    def predict(self, X: object) -> np.ndarray:
        """Index of the nearest centroid of each row of ``X``: ``(n,)`` int64 (ties: lowest)."""
        self._check_fitted()
        labels, _ = nearest(self._check_X(X, reset=False), self.cluster_centers_)
        return labels

    def fit_predict(self, X: object, y: object = None) -> np.ndarray:
        """``fit(X)`` then return ``labels_`` (``(n,)`` int64)."""
        return self.fit(X).labels_

    @with_threads
    def transform(self, X: object) -> np.ndarray:
        """Euclidean distance of each row of ``X`` to each centroid: ``(n, k)`` float64.

        Computed as ``sqrt(sum((x - c)**2))`` in float64 on the float32 samples, so the
        result for a row does not depend on the other rows.
        """
        self._check_fitted()
        X64 = self._check_X(X, reset=False).astype(np.float64)
        C64 = self.cluster_centers_.astype(np.float64)
        k, d = C64.shape
        out = np.empty((X64.shape[0], k), dtype=np.float64)
        rows = max(1, _TRANSFORM_BLOCK // (k * d))
        for start in range(0, X64.shape[0], rows):
            diff = X64[start : start + rows, None, :] - C64[None, :, :]
            np.sqrt(np.einsum("ikd,ikd->ik", diff, diff), out=out[start : start + rows])
        return out

    def fit_transform(self, X: object, y: object = None) -> np.ndarray:
        """``fit(X)`` then return ``transform(X)``: ``(n, k)`` float64."""
        return self.fit(X).transform(X)

    @with_threads
    def score(self, X: object, y: object = None) -> float:
        """Minus the inertia of ``X``: ``-sum(min_j ||x - c_j||^2)`` (higher is better)."""
        self._check_fitted()
        _, sqdist = nearest(self._check_X(X, reset=False), self.cluster_centers_)
        return -float(np.sum(sqdist))

    @property
    def _n_features_out(self) -> int:
        """Number of ``transform`` outputs, ``k`` (an ``AttributeError`` before the fit)."""
        return int(self.cluster_centers_.shape[0])
