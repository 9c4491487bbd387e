"""Smoke test: the engine clusters well-separated blobs from a seed."""

import numpy as np

from nmbatch.engine import NestedBatchStore, make_algorithm, nearest


def test_nmbatch_recovers_three_separated_blobs() -> None:
    rng = np.random.default_rng(0)
    means = np.array([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0]])
    X = np.concatenate([rng.normal(m, 1.0, size=(300, 2)) for m in means]).astype(np.float32)
    store = NestedBatchStore(2, seed=0)
    store.append(X)
    algo = make_algorithm("nmbatch", store, 3, init="k-means++", batch_size=100, random_state=0)
    for _ in range(100):
        if algo.step().converged:
            break
    assert algo.converged
    order = np.argsort(algo.centroids[:, 0] + 2 * algo.centroids[:, 1])
    np.testing.assert_allclose(algo.centroids[order], means, atol=0.3)
    labels, _ = nearest(X, algo.centroids)
    assert len(set(labels[:300])) == len(set(labels[300:600])) == len(set(labels[600:])) == 1
