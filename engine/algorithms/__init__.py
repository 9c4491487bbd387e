"""nmbatch and its baselines, one iteration per ``step()``, on a ``NestedBatchStore``.

- ``base``: ``KMeansAlgorithm``, the state and passes every algorithm shares (the dense
  assignment pass in chunks, the centroid update, the doubling test);
- ``nested``: ``NestedMiniBatch``: ``nmbatch``, ``nmbatch.deact`` and ``elkan``;
- ``baselines``: ``Lloyd`` (``lloyd``) and ``MiniBatch`` (``mbatch``, ``mbatch.remove``).

``make_algorithm(name, store, k)`` builds any of ``ALGORITHMS`` by name.
"""

from __future__ import annotations

import numpy as np

from nmbatch.engine.algorithms.base import SPAN_PRODUCT_RATIO, KMeansAlgorithm
from nmbatch.engine.algorithms.baselines import Lloyd, MiniBatch
from nmbatch.engine.algorithms.bounds import BOUND_MODES, check_bound_mode
from nmbatch.engine.algorithms.nested import (
    DENSE_REVISIT_FRACTION,
    NestedMiniBatch,
)
from nmbatch.engine.algorithms.swap import swap_wanted
from nmbatch.engine.state import IterationStats, ModelState
from nmbatch.engine.store import NestedBatchStore

__all__ = [
    "ALGORITHMS",
    "BOUND_MODES",
    "DENSE_REVISIT_FRACTION",
    "SPAN_PRODUCT_RATIO",
    "IterationStats",
    "KMeansAlgorithm",
    "Lloyd",
    "MiniBatch",
    "ModelState",
    "NestedMiniBatch",
    "make_algorithm",
]

ALGORITHMS = ("nmbatch", "nmbatch.deact", "mbatch", "mbatch.remove", "lloyd", "elkan")


def make_algorithm(
    name: str,
    store: NestedBatchStore,
    n_clusters: int,
    *,
    init: str | np.ndarray = "first",
    rho: float = 100.0,
    batch_size: int = 5000,
    random_state: int | None = None,
    relocate_empty: bool = True,
    bounds: str = "auto",
    swap: bool | str = "auto",
    metric: str = "euclidean",
) -> KMeansAlgorithm:
    """Build the algorithm ``name`` (one of ``ALGORITHMS``) on ``store``.

    ``relocate_empty``: after each update, a cluster left without samples takes the
    farthest sample of the batch (:mod:`.relocation`; nmbatch, nmbatch.deact, elkan and
    lloyd); False keeps its centroid where it was (the paper's protocol). mbatch and
    mbatch.remove keep theirs (running averages of sampled assignments).

    ``swap`` (nmbatch, nmbatch.deact): after each update, a starving cluster leaves its
    place to split the cluster whose split gains most, when that lowers the batch's
    energy (:mod:`.swap`); ``"auto"``: on when the first batch is sized to ``k``
    (:func:`.swap.swap_wanted`, ``k > 250`` with the default ``batch_size``).

    ``bounds`` (nmbatch): the lower bounds each sample keeps, one of ``BOUND_MODES``:
    ``"full"`` (one per centroid, the paper's), ``"group"`` (one per group of about ten
    centroids), ``"hamerly"`` (one), ``"auto"`` (full while ``k <= max(d, 256)`` or the
    batch's bounds fit in 1 GiB, then group; :mod:`.bounds`). Every mode gives the same
    centroids; memory and speed differ.

    ``metric`` (every algorithm): ``"euclidean"``, or ``"cosine"`` (spherical k-means:
    the store's rows are unit vectors, every centroid is ``S(j)/||S(j)||``;
    :mod:`nmbatch.engine.metric`); it must be the store's.
    """
    check_bound_mode(bounds)
    common = {"init": init, "batch_size": batch_size, "random_state": random_state,
              "metric": metric}
    moving = {**common, "relocate_empty": relocate_empty}
    if name == "nmbatch":
        return NestedMiniBatch(
            store, n_clusters, rho=rho, bound_mode=bounds, **moving,
            swap=swap_wanted(swap, "all", n_clusters=n_clusters, batch_size=batch_size),
        )
    if name == "nmbatch.deact":
        return NestedMiniBatch(
            store, n_clusters, rho=rho, bounds=False, **moving,
            swap=swap_wanted(swap, "all", n_clusters=n_clusters, batch_size=batch_size),
        )
    if name == "elkan":
        return NestedMiniBatch(store, n_clusters, rho=rho, full=True, **moving)
    if name == "lloyd":
        return Lloyd(store, n_clusters, **moving)
    if name == "mbatch":
        return MiniBatch(store, n_clusters, **common)
    if name == "mbatch.remove":
        return MiniBatch(store, n_clusters, remove=True, **common)
    raise ValueError(f"unknown algorithm {name!r}; choose one of {ALGORITHMS}")
