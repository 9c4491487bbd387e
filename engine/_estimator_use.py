"""What a fitted ``NestedMiniBatchKMeans`` answers: ``predict``, ``transform``, ``score``.

``ModelUseMixin`` needs from its class ``metric``, ``cluster_centers_`` (``(k, d)``
float32) and ``n_features_in_`` once fitted, and ``fit``; it checks inputs (``_check_X``;
``_rows``: as the model compares them, unit rows under cosine) and the fit
(``_check_fitted``, scikit-learn's ``NotFittedError``). Under ``metric="cosine"`` the
answers are of the unit rows, and ``transform`` and ``score`` measure the cosine
dissimilarity ``1 - cos``, as ``||x - c||^2 / 2`` of the unit vectors (equal for exact
unit vectors; never negative; :func:`~nmbatch.engine.metric.dissimilarity`).
The output names (``get_feature_names_out``) are scikit-learn's
``ClassNamePrefixFeaturesOutMixin``'s: ``nestedminibatchkmeans0`` ... ``{k-1}``.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin
from sklearn.utils.validation import check_is_fitted

from nmbatch.engine._estimator_build import weighted_sum
from nmbatch.engine._estimator_checks import check_X
from nmbatch.engine._validation import as_sample_weight
from nmbatch.engine.assign import nearest
from nmbatch.engine.metric import dissimilarity, metric_rows
from nmbatch.engine.threads import with_threads

__all__ = ["ModelUseMixin"]

# Elements (rows x k x d) of one float64 block of ``transform``.
_TRANSFORM_BLOCK = 1 << 20


class ModelUseMixin(ClassNamePrefixFeaturesOutMixin):
    """``predict``, ``fit_predict``, ``transform``, ``fit_transform``, ``score`` and
    ``get_feature_names_out`` of a fitted k-means model."""

    cluster_centers_: np.ndarray
    labels_: np.ndarray
    n_features_in_: int
    metric: str

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "cluster_centers_")

    # -- validation -------------------------------------------------------------------
    def _check_X(self, X: object, *, reset: bool) -> np.ndarray:
        """``X`` as a C-contiguous ``(n, d)`` float32 array; ``reset=False`` also checks ``d``."""
        n_features = None if reset else self.n_features_in_
        return check_X(X, n_features=n_features, estimator=type(self).__name__)

    def _rows(self, X: object) -> np.ndarray:
        """``X`` of a fitted model as it compares rows: ``(n, d)`` float32, unit rows under
        ``metric="cosine"`` (a zero row: ``ValueError``)."""
        return metric_rows(self._check_X(X, reset=False), self.metric)

    def _check_fitted(self) -> None:
        """scikit-learn's ``NotFittedError`` (a ``ValueError``) before the first fit."""
        check_is_fitted(
            self,
            msg="This %(name)s instance is not fitted yet. Call 'fit' or 'partial_fit' "
            "with enough samples before using this estimator.",
        )

    @with_threads
    def predict(self, X: object) -> np.ndarray:
        """Index of the nearest centroid of each row of ``X``: ``(n,)`` int64 (ties: lowest)."""
        self._check_fitted()
        labels, _ = nearest(self._rows(X), self.cluster_centers_)
        return labels

    def fit_predict(self, X: object, y: object = None, sample_weight: object = None) -> np.ndarray:
        """``fit(X, sample_weight=sample_weight)`` then return ``labels_`` (``(n,)`` int64)."""
        return self.fit(X, sample_weight=sample_weight).labels_

    @with_threads
    def transform(self, X: object) -> np.ndarray:
        """Euclidean distance of each row of ``X`` to each centroid: ``(n, k)`` float64;
        under ``metric="cosine"`` the cosine dissimilarity ``1 - cos(x, c)`` instead.

        Computed as ``sqrt(sum((x - c)**2))`` (cosine: ``sum((x - c)**2) / 2`` of the unit
        row) in float64 on the float32 samples, so the result for a row does not depend on
        the other rows.
        """
        self._check_fitted()
        X64 = self._rows(X).astype(np.float64)
        C64 = self.cluster_centers_.astype(np.float64)
        k, d = C64.shape
        out = np.empty((X64.shape[0], k), dtype=np.float64)
        rows = max(1, _TRANSFORM_BLOCK // (k * d))
        for start in range(0, X64.shape[0], rows):
            diff = X64[start : start + rows, None, :] - C64[None, :, :]
            sq = np.einsum("ikd,ikd->ik", diff, diff)
            if self.metric == "cosine":
                np.multiply(sq, 0.5, out=out[start : start + rows])
            else:
                np.sqrt(sq, out=out[start : start + rows])
        return out

    def fit_transform(
        self, X: object, y: object = None, sample_weight: object = None
    ) -> np.ndarray:
        """``fit(X, sample_weight=sample_weight)`` then return ``transform(X)``: ``(n, k)``
        float64."""
        return self.fit(X, sample_weight=sample_weight).transform(X)

    @with_threads
    def score(self, X: object, y: object = None, sample_weight: object = None) -> float:
        """Minus the inertia of ``X``: ``-sum(min_j ||x - c_j||^2)`` (higher is better);
        under ``metric="cosine"`` minus the sum of cosine dissimilarities,
        ``-sum(min_j (1 - cos(x, c_j)))``; each term times its ``sample_weight`` if given
        (``(n,)``, each >= 0 and finite, as in ``fit``)."""
        self._check_fitted()
        rows = self._rows(X)
        w = as_sample_weight(sample_weight, rows.shape[0])
        _, sqdist = nearest(rows, self.cluster_centers_)
        return -weighted_sum(dissimilarity(sqdist, self.metric), w)

    @property
    def _n_features_out(self) -> int:
        """Number of ``transform`` outputs, ``k`` (an ``AttributeError`` before the fit)."""
        return int(self.cluster_centers_.shape[0])
