"""``NestedMiniBatchKMeans.fit`` on a Ray cluster (``backend=RayBackend(...)`` or ``"ray"``).

The driver (the process calling ``fit``) holds ``X``. It gives sample ``i`` the
priority ``pi(i)``: its row in the single-machine store shuffled with the same seed
(:func:`priorities`), so the nested prefix ``{pi(i) < tau}`` of every round is the
prefix the local backend would use with the same ``random_state``. Rows reach the
``P`` shards round robin (sample ``i`` to shard ``i mod P``: independent of the
values), each partition goes to the object store once (``ray.put``; the copy a
replacement shard is built from after a fault), and a :class:`~.coordinator.Coordinator`
runs the rounds until convergence, ``max_iter`` or the callback's ``True``. Under
``metric="cosine"`` the rows are normalised before they are partitioned (the
estimator's are unit rows already: kept bit for bit), so the shards hold unit rows.

With no address and no Ray running, a local Ray is started for the fit and stopped
after; with Ray already initialised in the process, that cluster is used and left
running; with an address, the fit connects to it and disconnects after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nmbatch.engine.backend import RayBackend
from nmbatch.engine.metric import check_metric, metric_rows
from nmbatch.engine.projection import Subspace
from nmbatch.engine.state import IterationStats, ModelState
from nmbatch.engine.store import NestedBatchStore

__all__ = [
    "DistributedFit",
    "fit_distributed",
    "fit_estimator",
    "partition",
    "priorities",
    "ray_session",
]


@dataclass
class DistributedFit:
    """What a distributed fit leaves: ``centroids`` ``(k, d)`` float32, ``iteration``,
    ``n_samples`` (``N``), the last round's ``stats``, ``round_bytes`` ``[(sent,
    received)]`` per round and ``n_lost`` (shards replaced after a fault); ``subspace``:
    no projection (the estimator's ``labels_`` take the full product, as a local run's
    that chose none)."""

    centroids: np.ndarray
    iteration: int
    n_samples: int
    stats: IterationStats
    round_bytes: list[tuple[int, int]]
    n_lost: int
    subspace: Subspace = field(default_factory=Subspace)


def priorities(n: int, seed: int) -> np.ndarray:
    """``pi (n,) int64``: sample ``i``'s row in a ``NestedBatchStore(seed=seed)`` given
    ``n`` samples in one ``load`` (as the local ``fit``; the same draws: the order does
    not depend on ``d``), a permutation of ``0 .. n-1``."""
    order = NestedBatchStore(1, seed=seed, capacity=max(n, 1))
    order.load(np.zeros((n, 1), dtype=np.float32), checked=True)
    pi = np.empty(n, dtype=np.int64)
    pi[order.ids()] = np.arange(n, dtype=np.int64)
    return pi


def partition(n: int, n_shards: int) -> list[np.ndarray]:
    """Sample ids of each shard, round robin: ``[arange(s, n, P) for s in range(P)]``."""
    return [np.arange(s, n, n_shards, dtype=np.int64) for s in range(n_shards)]


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Ray for one fit: the running one if any, else ``address``'s cluster, else a new
    local one (no dashboard); what this call started or joined is shut down after."""
    import ray

    if ray.is_initialized():
        yield
        return
    ray.init(
        address=address if address is not None else "local",
        include_dashboard=False if address is None else None,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


def fit_distributed(
    X: np.ndarray,
    *,
    n_clusters: int,
    init: str | np.ndarray,
    rho: float,
    batch_size: int,
    bounds: str,
    relocate_empty: bool,
    max_iter: int,
    n_shards: int,
    ray_address: str | None,
    store_seed: int,
    algo_seed: int,
    callback: Callable[[IterationStats, ModelState], bool | None] | None = None,
    n_threads: int | None = None,
    weights: np.ndarray | None = None,
    metric: str = "euclidean",
) -> DistributedFit:
    """Cluster ``X`` (``(n, d)`` float32, C-contiguous) on ``n_shards`` shard actors.

    The parameters are the estimator's (checked by it); ``store_seed`` fixes the
    priorities (the local backend's shuffle), ``algo_seed`` k-means++; ``n_threads``:
    threads of each shard's kernels (None: all of its node's cores); ``weights``:
    ``(n,)`` float64 sample weights (None: 1), a row's vote on its shard; ``metric``:
    ``"euclidean"`` or ``"cosine"`` (the rows normalised first; a zero row:
    ``ValueError`` naming it, before Ray is joined).
    """
    import ray

    from nmbatch.engine.distributed.coordinator import Coordinator

    X = metric_rows(X, check_metric(metric))
    n = X.shape[0]
    pi = priorities(n, store_seed)
    with ray_session(ray_address):
        parts = [(ray.put(X[ids]), ids, pi[ids], None if weights is None else weights[ids])
                 for ids in partition(n, n_shards)]  # fmt: skip
        coord = Coordinator(
            parts, n_clusters, X.shape[1], init=init, rho=rho, batch_size=batch_size,
            relocate_empty=relocate_empty, bound_mode=bounds, random_state=algo_seed,
            n_threads=n_threads, metric=metric,
        )  # fmt: skip
        try:
            for _ in range(int(max_iter)):
                stats = coord.step()
                stop = callback is not None and callback(stats, coord.state(stats)) is True
                if stats.converged or stop:
                    break
        finally:
            coord.close()
    return DistributedFit(
        centroids=coord.centroids.copy(), iteration=coord.iteration, n_samples=n,
        stats=stats, round_bytes=coord.round_bytes, n_lost=coord.n_lost,
    )  # fmt: skip


def fit_estimator(
    est: Any,
    X: np.ndarray,
    init: str | np.ndarray,
    store_seed: int,
    algo_seed: int,
    policy: Any,
    backend: RayBackend,
    weights: np.ndarray | None = None,
) -> Any:
    """``NestedMiniBatchKMeans.fit`` on the Ray ``backend`` (its address and shards;
    parameters checked, ``X`` ``(n, d)`` float32): run :func:`fit_distributed` and set
    the fitted attributes; ``weights`` ``(n,)`` float64 or None: the sample weights
    (the shards' votes, the inertia's weights, kept with the samples).
    ``partial_fit`` then goes on locally from the fitted centroids (the path of an
    unpickled model: the samples kept in insertion order). Returns ``est``."""
    run = fit_distributed(
        X, n_clusters=int(est.n_clusters), init=init, rho=float(est.rho),
        batch_size=int(est.batch_size), bounds=est.bounds,
        relocate_empty=bool(est.relocate_empty), max_iter=int(est.max_iter),
        n_shards=int(backend.n_shards), ray_address=backend.address,
        store_seed=store_seed, algo_seed=algo_seed, callback=est.callback,
        n_threads=est.n_threads, weights=weights, metric=est.metric,
    )  # fmt: skip
    est.__dict__.pop("_store", None)
    est.__dict__.pop("_algorithm", None)
    est._pickled_samples, est._pickled_ids = X.copy(), np.arange(X.shape[0])
    if weights is not None:
        est._pickled_weights = np.asarray(weights, dtype=np.float64).copy()
    est._algo_seed, est._retention = algo_seed, policy
    est._partial_fit_key = est._fit_key()
    est.n_features_in_ = X.shape[1]
    est._publish(run, run.stats, run, X, weights)
    return est
