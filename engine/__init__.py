"""nmbatch engine: Nested Mini-Batch K-Means (Newling & Fleuret, NIPS 2016) and baselines.

The engine knows nothing of HTTP or Redis: a growing shuffled store, one-iteration
algorithms on it, an exact nearest-centroid lookup, and a scikit-learn style estimator.
"""

from nmbatch.engine.algorithms import (
    ALGORITHMS,
    IterationStats,
    KMeansAlgorithm,
    NestedMiniBatch,
    make_algorithm,
)
from nmbatch.engine.assign import energy, nearest
from nmbatch.engine.backend import RayBackend
from nmbatch.engine.metric import METRICS
from nmbatch.engine.state import ModelState
from nmbatch.engine.store import NestedBatchStore

__all__ = [
    "ALGORITHMS",
    "METRICS",
    "IterationStats",
    "KMeansAlgorithm",
    "ModelState",
    "NestedBatchStore",
    "NestedMiniBatch",
    "NestedMiniBatchKMeans",
    "RayBackend",
    "energy",
    "make_algorithm",
    "nearest",
]


def __getattr__(name: str):
    # The estimator module is imported on first use, so the service does not pay for it.
    if name == "NestedMiniBatchKMeans":
        from nmbatch.engine.estimator import NestedMiniBatchKMeans

        return NestedMiniBatchKMeans
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
