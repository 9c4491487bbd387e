"""Exact deletion and lookup by sample id for a ``NestedMiniBatchKMeans``.

A sample's *id* is its arrival index: the position of the sample among all the samples
given to ``fit`` and ``partial_fit`` since the model was started (``fit`` starts a model:
row ``i`` of its ``X`` has id ``i``; the first row of the next ``partial_fit`` chunk has
id ``n``, and so on; a model started by ``partial_fit`` counts from its first chunk). Rows
the retention policy never admitted still count. ``n_samples_seen_`` is the next id.

``ModelForgetMixin`` needs from its class ``_store``, ``_algorithm`` and ``_retention``
once the model is started, ``_resume_after_unpickling`` and ``_count_samples``.
"""

from __future__ import annotations

import numpy as np
from sklearn.exceptions import NotFittedError

from nmbatch.engine.hosting import LocalEngine
from nmbatch.engine.state import SampleLookup

__all__ = ["ModelForgetMixin"]


class ModelForgetMixin:
    """``forget(ids)`` and ``lookup(ids)``."""

    def _sample_ids(self, ids: object) -> np.ndarray:
        """``ids`` (an int or a 1-d array of ints) as ``(m,)`` int64, each an id the model
        gave out (``0 <= id < n_samples_seen_``), else ``ValueError``; the model started
        (else ``NotFittedError``) and rebuilt if it was unpickled."""
        if "_store" not in self.__dict__ and "_pickled_samples" not in self.__dict__:
            raise NotFittedError(
                f"This {type(self).__name__} instance holds no samples yet. Call 'fit' or "
                "'partial_fit' before 'forget' or 'lookup'."
            )
        query = np.asarray(ids)
        if query.ndim > 1 or (query.size and not np.issubdtype(query.dtype, np.integer)):
            raise ValueError(f"ids must be an int or a 1-d array of ints, got {query.dtype} "
                             f"of shape {query.shape}")  # fmt: skip
        query = query.astype(np.int64).ravel()
        seen = int(self._retention.n_offered)
        bad = (query < 0) | (query >= seen)
        if bad.any():
            raise ValueError(
                f"id {int(query[bad][0])} was never given to this model: ids are the arrival "
                f"indices 0 .. {seen - 1} of the samples given to fit and partial_fit"
            )
        if "_pickled_samples" in self.__dict__:
            self._resume_after_unpickling()
        return query

    def forget(self, ids: object) -> int:
        """Delete the samples with these ids from the model, exactly; returns how many
        were deleted.

        ``ids``: an int or a 1-d array of ints, each an arrival index the model gave out
        (module docstring; else ``ValueError`` and nothing changes). An id whose sample
        is no longer stored (deleted before, or retired by the retention policy) is
        skipped: the count says how many were deleted, and ``forget`` of the same ids
        twice deletes nothing the second time.

        Exact: a deleted sample's (weighted) vote leaves its cluster's sums ``S(j)``,
        ``v(j)`` at once, the sample leaves the store, and ``cluster_centers_`` of the
        clusters it left are recomputed from their sums (the mean of the remaining
        members; under ``metric="cosine"`` the direction of their sum); a cluster left
        without members keeps its centroid until the next iteration relocates it. The
        model is then the one of the remaining samples: further ``partial_fit`` calls
        (or iterations) continue from it, and its next fixed point is the k-means fixed
        point of the samples that remain (docs/design.md, "Exact deletion").
        ``labels_`` and ``inertia_`` still describe the last chunk fitted. The retention
        policy counts the deleted samples out (a ``window`` or ``age`` keeps the rest of
        its range; a reservoir's slot is filled by a later sample; ``all`` frees the
        capacity). ``algorithm="mbatch"`` cannot forget (``NotImplementedError``).
        """
        query = self._sample_ids(ids)
        host = LocalEngine.around(self._store, self._algorithm)
        found = host.forget(query)
        deleted = np.unique(query[found])
        if deleted.shape[0]:
            self._retention.forget(deleted)
            if "cluster_centers_" in self.__dict__:
                self.cluster_centers_ = np.array(host.state.centroids, dtype=np.float32)
        self._count_samples(self._store)
        return int(deleted.shape[0])

    def lookup(self, ids: object) -> SampleLookup:
        """Where the samples with these ids stand: a
        :class:`~nmbatch.engine.state.SampleLookup` of ``present`` ``(m,)`` bool (the
        sample is stored: retained and not deleted), ``labels`` ``(m,)`` int64 (its
        nearest centroid in ``cluster_centers_`` now, exactly: ``predict`` of its stored
        row; -1 where not present or before the first iteration) and ``sqdist`` ``(m,)``
        float64 (its squared distance to that centroid; under ``metric="cosine"``, of
        the unit row: ``1 - sqdist / 2`` is the cosine similarity; NaN where -1).
        ``ids`` as in :meth:`forget`."""
        query = self._sample_ids(ids)
        return self._algorithm.lookup(query)
