"""Exact deletion on the Ray backend: ``StreamCoordinator.forget`` and ``RayEngine``'s
``forget``/``lookup``, on a local Ray (one node, started once for the module).

What is held, as on one machine (``tests/test_forget.py``): after a deletion every
retained row is in exactly one shard and no deleted one in any, ``S / v`` is the mean of
each cluster's voted rows, the clusters the deleted rows left have ``float32(S(j)/v(j))``
at once and the others keep theirs; after the next round every voted row sits on its
brute-force nearest centroid among those the round used (the shards' bounds, loosened by
the ``p`` the deletion grew, stayed sound); a shard killed after deletions comes back
without the deleted rows; the model converges to Lloyd's fixed point on the remaining
rows; ``RayEngine.lookup`` answers the exact nearest centroid.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from nmbatch.engine.distributed.stream import StreamCoordinator  # noqa: E402
from nmbatch.engine.hosting import EngineConfig  # noqa: E402
from nmbatch.engine.hosting.ray import RayEngine  # noqa: E402
from tests.engine_helpers import brute_nearest, centroids_ref  # noqa: E402
from tests.test_ray_retention import blobs, check, wait_dead  # noqa: E402


def labels_by_id(coord: StreamCoordinator) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, labels)`` of every stored row over the shards (-1: not voted)."""
    parts = ray.get([a.assignments.remote() for a in coord.shards])
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[2] for p in parts])


def assert_bounds_sound(coord: StreamCoordinator, X: np.ndarray) -> None:
    """Every shard's bounds, as the next round's sweep will loosen them by the ``p`` it
    gets with the centroids, bound the distances to those centroids."""

    def _shard_bounds(shard) -> tuple:  # runs in the actor (a local: pickled by value)
        algo = shard._algo
        b = algo.batch_size
        return shard.ids[:b].copy(), algo.labels(), algo.lower_bounds(), algo.upper_bounds()

    C = coord.centroids.astype(np.float64)
    for ids, labels, lower, upper in ray.get(
        [a.__ray_call__.remote(_shard_bounds) for a in coord.shards]
    ):
        if not ids.shape[0]:
            continue
        dist = np.sqrt(((X[ids].astype(np.float64)[:, None, :] - C[None]) ** 2).sum(-1))
        assert (lower.astype(np.float64) - coord.p[None, :] <= dist).all(), "l - p too big"
        own = dist[np.arange(ids.shape[0]), labels]
        assert ((upper + coord.p[labels]) * (1 + 1e-12) >= own).all(), "u + p(a) too small"


def test_forget_on_the_cluster_is_exact_and_keeps_the_bounds_sound(local_ray) -> None:
    X = blobs(2400, seed=6)
    rng = np.random.default_rng(6)
    coord = StreamCoordinator(3, 4, X.shape[1], seed=4, batch_size=40)
    kept = np.empty(0, dtype=np.int64)
    try:
        for start in range(0, 2400, 300):
            ids = np.arange(start, start + 300)
            coord.append(X[ids], ids)
            kept = np.concatenate([kept, ids])
            coord.step()
            C, S, v = coord.centroids.copy(), coord.S.copy(), coord.v.copy()
            asked = np.concatenate([rng.choice(kept, size=80, replace=False), [10**7]])
            found = coord.forget(asked)
            assert found[:-1].all() and not found[-1]
            kept = np.setdiff1d(kept, asked)
            check(coord, X, kept)
            touched = (coord.v != v) | (coord.S != S).any(axis=1)
            expected, has = centroids_ref(coord.S, coord.v, "euclidean")
            np.testing.assert_array_equal(coord.centroids[touched & has],
                                          expected[touched & has])  # fmt: skip
            np.testing.assert_array_equal(coord.centroids[~touched], C[~touched])
            assert_bounds_sound(coord, X)
            before = coord.centroids.copy()
            coord.step()
            check(coord, X, kept)
            ids, labels = labels_by_id(coord)
            voted = labels >= 0
            ref, _ = brute_nearest(X[ids[voted]], before)
            np.testing.assert_array_equal(labels[voted], ref)
        assert not coord.forget(asked[:-1]).any()  # deleted before: nothing
        doomed = coord.shards[0]
        ray.kill(doomed)
        wait_dead(doomed)
        for _ in range(300):
            if coord.step().converged:
                break
        assert coord.n_lost == 1 and coord.converged
        check(coord, X, kept)  # the replacement holds no deleted row
        labels, _ = brute_nearest(X[kept], coord.centroids)
        for j in range(4):
            np.testing.assert_allclose(coord.centroids[j], X[kept][labels == j].mean(axis=0),
                                       rtol=1e-5, atol=1e-5)  # fmt: skip
    finally:
        coord.close()


def test_the_ray_host_forgets_and_looks_up(local_ray) -> None:
    config = EngineConfig(dim=5, k=4, init="k-means++", rho=100.0, batch_size=40, seed=2)
    X = blobs(1000, seed=2)
    engine = RayEngine(dataclasses.replace(config), address="local", n_shards=2)
    try:
        ids = np.arange(1000, dtype=np.int64)
        engine.feed(X, ids, n_after=1000)
        for _ in range(5):
            engine.step()
        found = engine.forget(np.array([3, 4, 5, 999, 5000]))
        assert found.tolist() == [True, True, True, True, False]
        assert engine.store.n_samples == engine.state.n_samples == 996
        assert engine.state.stats is None
        with pytest.raises(ValueError, match=">= 0"):
            engine.forget(np.array([-1]))
        look = engine.lookup(np.array([3, 10, 998]))
        assert look.present.tolist() == [False, True, True]
        labels, sqdist = brute_nearest(X[[10, 998]], engine.state.centroids)
        np.testing.assert_array_equal(look.labels[1:], labels)
        np.testing.assert_allclose(look.sqdist[1:], sqdist, rtol=1e-5, atol=1e-6)
        assert look.labels[0] == -1 and np.isnan(look.sqdist[0])
        engine.step()
    finally:
        engine.close()
