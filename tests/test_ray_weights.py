"""Sample weights on the Ray backend: a sample's vote is its weight on the shards and the
coordinator, as on one machine (``S += w x``, ``v += w``, ``Q += w ||x||^2``).

On a local Ray (one node, started once for the module), :class:`RayEngine` and
:class:`LocalEngine` fed the same weighted rows from the same starting centroids end at
the same fixed point: equal centroids (float tolerance) and equal ``v`` (the sums of
the weights); every centroid is the weighted mean of the rows nearest to it. Integer
weights ``w`` on the cluster give what ``w`` repeated rows give. ``weights_of`` answers
the weights fed. Deleting every member of a cluster of fractional weights leaves its
sums exactly zero on the coordinator and the shards, as on one machine (the residue of
``0.1 + 0.2 - 0.1 - 0.2`` cleared: ``KMeansAlgorithm._clear_emptied``).
"""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from nmbatch.engine.hosting import EngineConfig  # noqa: E402
from nmbatch.engine.hosting.local import LocalEngine  # noqa: E402
from nmbatch.engine.hosting.protocol import EngineHost  # noqa: E402
from nmbatch.engine.hosting.ray import RayEngine  # noqa: E402
from tests.test_ray_retention import blobs  # noqa: E402

K, D = 4, 5


def config(init: np.ndarray, batch_size: int = 40) -> EngineConfig:
    return EngineConfig(dim=D, k=K, init=init, rho=100.0, batch_size=batch_size, seed=3)


def start_centroids(X: np.ndarray) -> np.ndarray:
    """One row of each blob (the blobs are far apart): a start both engines share."""
    C = np.empty((K, D), dtype=np.float32)
    centres = np.random.default_rng(0).normal(0.0, 8.0, (K, D))  # blobs(seed=0)'s means
    for j in range(K):
        C[j] = X[np.argmin(((X - centres[j]) ** 2).sum(axis=1))]
    return C


def feed_entries(host: EngineHost, X: np.ndarray, w: np.ndarray | None, entry: int) -> None:
    """``X`` fed as log entries of ``entry`` rows, each with its stream ids and weights."""
    for start in range(0, X.shape[0], entry):
        ids = np.arange(start, min(start + entry, X.shape[0]))
        host.feed(X[ids], ids, n_after=int(ids[-1]) + 1,
                  weights=None if w is None else w[ids])  # fmt: skip


def run_to_fixed_point(host: EngineHost, max_rounds: int = 60) -> None:
    for _ in range(max_rounds):
        if host.step().converged:
            return
    raise AssertionError("no fixed point")


def weighted_means(X: np.ndarray, w: np.ndarray, C: np.ndarray) -> np.ndarray:
    """The weighted mean of the rows nearest to each centroid of ``C``, float64."""
    near = np.argmin(((X[:, None, :].astype(np.float64) - C[None]) ** 2).sum(-1), axis=1)
    out = np.zeros((K, D))
    for j in range(K):
        mine = near == j
        out[j] = (w[mine, None] * X[mine]).sum(axis=0) / w[mine].sum()
    return out


def test_weighted_rows_on_ray_end_where_the_local_engine_ends(local_ray) -> None:
    X = blobs(600, seed=0, d=D, k=K)
    w = np.random.default_rng(1).uniform(0.2, 3.0, 600)
    w[::17] = 0.0  # weight-0 rows are stored and vote nothing
    init = start_centroids(X)
    local, on_ray = LocalEngine(config(init)), RayEngine(config(init), "local", 2)
    try:
        for host in (local, on_ray):
            feed_entries(host, X, w, 100)
            run_to_fixed_point(host)
        np.testing.assert_allclose(on_ray.state.centroids, local.state.centroids,
                                   rtol=0, atol=1e-5)  # fmt: skip
        assert on_ray.state.counts.dtype == np.float64
        np.testing.assert_allclose(on_ray.state.counts, local.state.counts, rtol=1e-12)
        assert on_ray.state.counts.sum() == pytest.approx(w.sum(), rel=1e-12)
        np.testing.assert_allclose(on_ray.state.centroids,
                                   weighted_means(X, w, on_ray.state.centroids),
                                   rtol=0, atol=1e-5)  # fmt: skip
        assert on_ray.state.energy == pytest.approx(local.state.energy, rel=1e-6)
        some = np.array([0, 17, 5, 599])
        np.testing.assert_array_equal(on_ray.weights_of(some), w[some])

        # Every member of one cluster deleted: its sums are exactly zero on both, on the
        # coordinator, in its copies of the ledgers and in the shards' own ledgers.
        C = on_ray.state.centroids
        near = np.argmin(((X[:, None, :] - C[None]) ** 2).sum(-1), axis=1)
        j = int(near[1])
        gone = np.flatnonzero(near == j)
        for host in (local, on_ray):
            assert host.forget(gone).all()
        coord = on_ray.coordinator
        assert coord.v[j] == 0.0 and not coord.S[j].any() and coord.Q[j] == 0.0
        assert local.state.counts[j] == 0.0
        for s, ledger in enumerate(coord.ledgers):
            S_s, v_s, _ = ray.get(coord.shards[s].ledger.remote())
            assert v_s[j] == 0.0 and ledger[1][j] == 0.0 and not S_s[j].any()
        np.testing.assert_array_equal(on_ray.state.centroids[j], C[j])  # empty: it stays
        np.testing.assert_allclose(on_ray.state.centroids, local.state.centroids,
                                   rtol=0, atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(on_ray.state.counts, local.state.counts, rtol=1e-12)
    finally:
        on_ray.close()


def test_weight_w_on_ray_is_w_repeated_rows(local_ray) -> None:
    X = blobs(240, seed=0, d=D, k=K)
    w = np.random.default_rng(2).integers(1, 4, 240)
    init = start_centroids(X)
    weighted, repeated = RayEngine(config(init), "local", 2), RayEngine(config(init), "local", 1)
    try:
        feed_entries(weighted, X, w.astype(np.float64), 60)
        feed_entries(repeated, np.repeat(X, w, axis=0), None, 60)
        for host in (weighted, repeated):
            run_to_fixed_point(host)
        np.testing.assert_allclose(weighted.state.centroids, repeated.state.centroids,
                                   rtol=0, atol=1e-5)  # fmt: skip
        np.testing.assert_array_equal(weighted.state.counts, repeated.state.counts)
        assert repeated.state.counts.dtype == np.int64  # unweighted: counts stay integers
    finally:
        weighted.close()
        repeated.close()
