"""Greedy k-means++ with the triangle inequality (``engine/kernels/seeding_pruned.py``):
each kernel against plain numpy, and the pruned rounds against the full pass, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nmbatch.engine.kernels.parallel import every_parallel_path
from nmbatch.engine.kernels.seeding import SEED_BLOCK, sample_rows, trial_costs
from nmbatch.engine.kernels.seeding_pruned import (
    adopt_best,
    centroid_distances,
    margin,
    owner_bounds,
    pruned_trial_costs,
)
from nmbatch.engine.seeding import kmeans_plusplus, n_trials
from nmbatch.engine.threads import thread_limits
from tests.testkit import blobs


def _full_pass_greedy(X, k, rng, weights=None):
    """Greedy k-means++ as it ran before the pruning: every row, every round
    (``trial_costs`` on all rows; that kernel is tested against numpy in test_seeding)."""
    n = X.shape[0]
    t = n_trials(k)
    nb = -(-n // SEED_BLOCK)
    chosen = np.empty(k, dtype=np.int64)
    if weights is None:
        chosen[0] = rng.integers(n)
    else:
        sums = np.add.reduceat(weights, np.arange(0, n, SEED_BLOCK))
        chosen[0] = sample_rows(np.ones(n), sums, rng.random(1) * sums.sum(), weights)[0]
    closest = np.empty((1, n))
    block_sums = np.empty((nb, 1))
    trial_costs(X, np.full(n, np.inf), X[chosen[:1]], closest, block_sums, weights)
    closest, block_sums = closest[0], np.ascontiguousarray(block_sums[:, 0])
    out, partial = np.empty((t, n)), np.empty((nb, t))
    for c in range(1, k):
        total = float(block_sums.sum())
        if not total > 0.0:
            unused = np.setdiff1d(np.arange(n), chosen[:c])
            chosen[c] = unused[rng.integers(unused.shape[0])]
            continue
        picks = sample_rows(closest, block_sums, rng.random(t) * total, weights)
        trial_costs(X, closest, X[picks], out, partial, weights)
        best = int(np.argmin(partial.sum(axis=0)))
        chosen[c] = picks[best]
        closest[:] = out[best]
        block_sums[:] = partial[:, best]
    return chosen


def _data(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = 3 * SEED_BLOCK + 41
    if kind == "blobs-low-d":  # well separated: most rows are skipped
        return blobs(n, 6, 64, seed=seed)
    if kind == "gaussian-high-d":  # no structure: few are
        return rng.standard_normal((n, 300)).astype(np.float32)
    if kind == "duplicates":
        base = blobs(40, 5, 8, seed=seed)
        return np.ascontiguousarray(base[rng.integers(0, 40, n)])
    if kind == "wide-range":  # large values: the margin must cover float32 rounding
        return (blobs(n, 12, 32, seed=seed) * 1e4 + 3e5).astype(np.float32)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["blobs-low-d", "gaussian-high-d", "duplicates", "wide-range"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_pruned_greedy_chooses_what_the_full_pass_chooses(kind, weighted, threads):
    for seed in (0, 1):
        X = _data(kind, seed)
        w = np.random.default_rng(seed).random(X.shape[0]) + 0.25 if weighted else None
        k = 64
        want = _full_pass_greedy(X, k, np.random.default_rng(seed), w)
        with thread_limits(threads), every_parallel_path():
            got = kmeans_plusplus(X, k, np.random.default_rng(seed), weights=w)
        np.testing.assert_array_equal(got, want)


def _midway(X: np.ndarray, chosen: np.ndarray):
    """The state after choosing ``chosen``: D(i)^2 (float32 distances, as the kernels),
    owners, the owners' radii and the centroid distances, in plain numpy."""
    C = X[chosen]
    diff = X[:, None, :] - C[None, :, :]
    sq = (diff * diff).sum(axis=2, dtype=np.float32).astype(np.float64)
    owner = np.argmin(sq, axis=1)
    closest = sq[np.arange(X.shape[0]), owner]
    R = np.zeros(chosen.shape[0])
    np.maximum.at(R, owner, np.sqrt(closest))
    return C, closest, owner.astype(np.int64), R


def test_centroid_distances_match_numpy():
    X = blobs(300, 9, 20, seed=3)
    C = np.ascontiguousarray(X[:20])
    CC = np.zeros((20, 20), dtype=np.float32)
    for c in range(1, 20):
        centroid_distances(C, c, CC)
    want = np.sqrt(((C[:, None, :].astype(np.float64) - C[None, :, :]) ** 2).sum(axis=2))
    np.testing.assert_allclose(CC, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(CC, CC.T)


@pytest.mark.parametrize("use_cc", [True, False])
def test_owner_bounds_are_lower_bounds_and_tight_where_exact(use_cc):
    X = blobs(2000, 10, 30, seed=4)
    chosen = np.random.default_rng(4).choice(2000, 30, replace=False)
    C, closest, owner, R = _midway(X, chosen)
    C = np.ascontiguousarray(C)
    CC = np.zeros((30, 30), dtype=np.float32) if use_cc else np.zeros((1, 1), np.float32)
    if use_cc:
        for c in range(1, 30):
            centroid_distances(C, c, CC)
    picks = np.random.default_rng(5).choice(2000, 5, replace=False)
    P = np.ascontiguousarray(X[picks])
    f = margin(X.shape[1])
    L, n_exact = np.empty(30), np.empty(30, dtype=np.int64)
    owner_bounds(C, 30, CC, R, P, owner[picks], np.sqrt(closest[picks]), f, L, n_exact)
    true = np.sqrt(((P[:, None, :].astype(np.float64) - C[None, :, :]) ** 2).sum(axis=2)).min(0)
    assert (true >= L).all()
    # every (centroid, trial) pair is exact without centroid distances: L = true / f
    if not use_cc:
        np.testing.assert_allclose(L, true / f, rtol=1e-5)
        assert (n_exact == 5).all()
    else:  # the centroid distances spared some exact distances on separated blobs
        assert n_exact.sum() < 30 * 5


@pytest.mark.parametrize("threads", [1, 2])
def test_pruned_trial_costs_equal_trial_costs_bit_for_bit(threads):
    X = blobs(4 * SEED_BLOCK + 9, 8, 40, seed=6)
    n = X.shape[0]
    chosen = np.random.default_rng(6).choice(n, 40, replace=False)
    C, closest, owner, R = _midway(X, chosen)
    C = np.ascontiguousarray(C)
    CC = np.zeros((40, 40), dtype=np.float32)
    for c in range(1, 40):
        centroid_distances(C, c, CC)
    nb = -(-n // SEED_BLOCK)
    w = np.random.default_rng(7).random(n) + 0.5
    block_sums = np.empty(nb)  # in row order, as the kernels take them
    for b in range(nb):
        s = 0.0
        for i in range(b * SEED_BLOCK, min(n, (b + 1) * SEED_BLOCK)):
            s += w[i] * closest[i]
        block_sums[b] = s
    picks = sample_rows(
        closest, block_sums, np.random.default_rng(8).random(4) * block_sums.sum(), w
    )
    P = np.ascontiguousarray(X[picks])
    f = margin(X.shape[1])
    L, n_exact = np.empty(40), np.empty(40, dtype=np.int64)
    owner_bounds(C, 40, CC, R, P, owner[picks], np.sqrt(closest[picks]), f, L, n_exact)
    want_out, want_partial = np.empty((4, n)), np.empty((nb, 4))
    got_out, got_partial = np.full((4, n), np.nan), np.empty((nb, 4))
    comp = np.empty(n, dtype=np.bool_)
    with thread_limits(threads), every_parallel_path():
        trial_costs(X, closest, P, want_out, want_partial, w)
        computed = pruned_trial_costs(
            X, closest, owner, L, f, P, got_out, got_partial, block_sums, comp, w
        )
    assert computed == comp.sum() and 0 < computed < n  # rows were skipped, not all
    np.testing.assert_array_equal(got_partial, want_partial)
    np.testing.assert_array_equal(got_out[:, comp], want_out[:, comp])
    # a skipped row: no trial comes nearer than its owner
    np.testing.assert_array_equal(
        want_out[:, ~comp], np.broadcast_to(closest[~comp], (4, (~comp).sum()))
    )
    # adopting the best trial: the rows it moved take it, with its largest D as R
    best = int(np.argmin(want_partial.sum(axis=0)))
    moved = want_out[best] < closest
    c2, o2 = closest.copy(), owner.copy()
    radius = adopt_best(got_out, best, 40, c2, o2, comp)
    np.testing.assert_array_equal(c2, np.minimum(closest, want_out[best]))
    np.testing.assert_array_equal(o2, np.where(moved, 40, owner))
    assert radius == (math.sqrt(want_out[best][moved].max()) if moved.any() else 0.0)
