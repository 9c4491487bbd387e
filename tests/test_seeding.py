"""The seedings of ``nmbatch.engine.seeding`` against plain numpy versions of their formulas."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nmbatch.engine.kernels.seeding import SEED_BLOCK, sample_rows, trial_costs
from nmbatch.engine.seeding import (
    SEEDINGS,
    afkmc2,
    initial_centroids,
    kmeans_parallel,
    kmeans_plusplus,
    kmeans_plusplus_subsample,
    random_rows,
    seed_rows,
)
from tests.testkit import blobs

SETTINGS = settings(max_examples=40, deadline=None)
REPO = Path(__file__).resolve().parents[1]


def _sq32(X: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``sum((x - p)^2)`` per row in float32, widened to float64."""
    diff = X - p[None, :]
    return (diff * diff).sum(axis=1, dtype=np.float32).astype(np.float64)


def _draw(mass: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse transform on the running sum of ``mass``: the first row it exceeds ``u``."""
    cumulative = np.cumsum(mass)
    return np.minimum(np.searchsorted(cumulative, u, side="right"), mass.shape[0] - 1)


def _greedy_numpy(X, k, rng, weights=None):
    """Greedy k-means++ in float32 distances and float64 sums, in plain numpy."""
    n = X.shape[0]
    w = np.ones(n) if weights is None else weights
    t = 2 + int(math.log(k))
    if weights is None:
        chosen = [int(rng.integers(n))]
    else:
        chosen = [int(_draw(w, rng.random(1) * w.sum())[0])]
    closest = _sq32(X, X[chosen[0]])
    for _ in range(1, k):
        mass = w * closest
        picks = _draw(mass, rng.random(t) * mass.sum())
        cand = np.minimum(closest[None, :], np.stack([_sq32(X, X[p]) for p in picks]))
        best = int(np.argmin((w[None, :] * cand).sum(axis=1)))
        chosen.append(int(picks[best]))
        closest = cand[best]
    return np.array(chosen)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_greedy_chooses_what_the_numpy_formula_chooses(seed, weighted):
    X = blobs(2 * SEED_BLOCK + 77, 30, 40, seed=seed)
    w = np.random.default_rng(seed).integers(1, 9, X.shape[0]).astype(np.float64)
    w = w if weighted else None
    want = _greedy_numpy(X, 40, np.random.default_rng(seed), w)
    got = kmeans_plusplus(X, 40, np.random.default_rng(seed), weights=w)
    np.testing.assert_array_equal(got, want)


_THREADS_CHILD = textwrap.dedent(
    """
    import hashlib, json
    import numba, numpy as np
    from nmbatch.engine.kernels.parallel import every_parallel_path
    from nmbatch.engine.kernels.seeding import SEED_BLOCK, trial_costs
    from nmbatch.engine.seeding import kmeans_parallel, kmeans_plusplus
    from nmbatch.engine.threads import thread_limits

    assert numba.config.NUMBA_NUM_THREADS == 4
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((5 * SEED_BLOCK + 3, 17)) * 3).astype(np.float32)
    closest = rng.random(X.shape[0]) * 50
    P = X[[4, 900, 2000]]
    nb = -(-X.shape[0] // SEED_BLOCK)
    out = {}
    for threads in (1, 2, 3, 4):
        dist, partial = np.empty((3, X.shape[0])), np.empty((nb, 3))
        with thread_limits(threads), every_parallel_path():
            trial_costs(X, closest, P, dist, partial)
            a = kmeans_plusplus(X, 30, np.random.default_rng(1))
            b = kmeans_parallel(X, 30, np.random.default_rng(1))
        h = hashlib.sha256()
        for arr in (dist, partial, a, b):
            h.update(arr.tobytes())
        out[threads] = h.hexdigest()
    print(json.dumps(out))
    """
)


def test_trial_costs_and_choices_do_not_depend_on_threads():
    env = {**os.environ, "NUMBA_NUM_THREADS": "4"}
    done = subprocess.run([sys.executable, "-c", _THREADS_CHILD], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=True)
    hashes = json.loads(done.stdout)
    assert len(set(hashes.values())) == 1, hashes


def test_trial_costs_match_numpy():
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((5 * SEED_BLOCK + 3, 17)) * 3).astype(np.float32)
    closest = rng.random(X.shape[0]) * 50
    w = rng.random(X.shape[0]) + 0.5
    P = X[[4, 900, 2000]]
    nb = -(-X.shape[0] // SEED_BLOCK)
    out, partial = np.empty((3, X.shape[0])), np.empty((nb, 3))
    trial_costs(X, closest, P, out, partial, w)
    want = np.minimum(closest[None, :], np.stack([_sq32(X, p) for p in P]))
    np.testing.assert_allclose(out, want, rtol=1e-5)
    assert (out[0, 4] == 0.0) and (out[1, 900] == 0.0)
    starts = np.arange(0, X.shape[0], SEED_BLOCK)
    np.testing.assert_allclose(partial, np.add.reduceat(w * out, starts, axis=1).T, rtol=1e-5)


def test_sample_rows_is_the_inverse_transform_and_skips_zero_mass():
    rng = np.random.default_rng(2)
    values = rng.random(3 * SEED_BLOCK + 5)
    values[rng.random(values.shape[0]) < 0.3] = 0.0
    sums = np.add.reduceat(values, np.arange(0, values.shape[0], SEED_BLOCK))
    u = rng.random(500) * sums.sum()
    got = sample_rows(values, sums, u)
    np.testing.assert_array_equal(got, _draw(values, u))
    assert (values[got] > 0).all()
    assert values[sample_rows(values, sums, np.array([sums.sum()]))[0]] > 0  # rounding


@pytest.mark.parametrize("seed", [0, 1])
def test_subsample_is_greedy_on_uniform_rows(seed):
    X = blobs(3000, 8, 20, seed=seed)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(3000, size=4 * 25, replace=False))
    want = rows[_greedy_numpy(X[rows], 25, rng)]
    got = kmeans_plusplus_subsample(X, 25, np.random.default_rng(seed))
    np.testing.assert_array_equal(got, want)


def _kmeans_parallel_numpy(X, k, rng, ell=2.0, rounds=5):
    n = X.shape[0]
    X64 = X.astype(np.float64)
    first = int(rng.integers(n))
    cand = [first]
    D = ((X64 - X64[first]) ** 2).sum(axis=1)
    owner = np.full(n, first)
    for _ in range(rounds):
        keep = np.flatnonzero(rng.random(n) < ell * k * D / D.sum())
        keep = keep[D[keep] > 0]
        if keep.size == 0:
            continue
        dist = ((X64[:, None, :] - X64[keep][None]) ** 2).sum(axis=2)
        lab = dist.argmin(axis=1)
        new = dist[np.arange(n), lab]
        closer = new < D
        D = np.where(closer, new, D)
        owner = np.where(closer, keep[lab], owner)
        cand += keep.tolist()
    cand = np.unique(cand)
    w = np.bincount(np.searchsorted(cand, owner), minlength=cand.size).astype(np.float64)
    return cand[_greedy_numpy(X[cand], k, rng, np.maximum(w, 1.0))]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kmeans_parallel_matches_the_numpy_formula(seed):
    X = blobs(1500, 6, 12, seed=seed)
    got = kmeans_parallel(X, 12, np.random.default_rng(seed))
    np.testing.assert_array_equal(got, _kmeans_parallel_numpy(X, 12, np.random.default_rng(seed)))


def _afkmc2_numpy(X, k, rng, m=200):
    n = X.shape[0]
    X64 = X.astype(np.float64)
    chosen = [int(rng.integers(n))]
    d1 = ((X64 - X64[chosen[0]]) ** 2).sum(axis=1)
    q = 0.5 * d1 / d1.sum() + 0.5 / n
    for _ in range(1, k):
        ys = _draw(q, rng.random(m) * np.cumsum(q)[-1])
        dy = ((X64[ys][:, None, :] - X64[chosen][None]) ** 2).sum(axis=2).min(axis=1)
        u = rng.random(m)
        x, dx = ys[0], dy[0]
        for j in range(1, m):
            if dx == 0 or dy[j] * q[x] > u[j] * dx * q[ys[j]]:
                x, dx = ys[j], dy[j]
        chosen.append(int(x))
    return np.array(chosen)


@pytest.mark.parametrize("seed", [0, 1])
def test_afkmc2_matches_the_numpy_formula(seed):
    X = blobs(800, 5, 10, seed=seed)
    got = afkmc2(X, 10, np.random.default_rng(seed), chain=50)
    np.testing.assert_array_equal(got, _afkmc2_numpy(X, 10, np.random.default_rng(seed), 50))


def test_random_rows_are_a_uniform_draw():
    X = blobs(100, 3, 4)
    rng = np.random.default_rng(3)
    np.testing.assert_array_equal(random_rows(X, 7, np.random.default_rng(3)),
                                  np.sort(rng.choice(100, 7, replace=False)))


@SETTINGS
@given(
    st.tuples(st.integers(1, 40), st.integers(1, 4)).flatmap(
        lambda s: arrays(np.int8, s, elements=st.integers(-3, 3))),
    st.integers(1, 10), st.integers(0, 2**32 - 1), st.sampled_from(SEEDINGS),
)
def test_every_method_returns_k_rows_of_X_reproducibly(X, k, seed, method):
    X = X.astype(np.float32)
    if X.shape[0] < k:
        with pytest.raises(ValueError):
            seed_rows(method, X, k, np.random.default_rng(seed))
        return
    rows = seed_rows(method, X, k, np.random.default_rng(seed))
    assert rows.shape == (k,) and np.unique(rows).shape[0] == k
    assert (rows >= 0).all() and (rows < X.shape[0]).all()
    np.testing.assert_array_equal(rows, seed_rows(method, X, k, np.random.default_rng(seed)))
    C = initial_centroids(method, X, k, np.random.default_rng(seed))
    assert C.dtype == np.float32 and C.flags.c_contiguous
    np.testing.assert_array_equal(C, X[rows])
    if method == "k-means++":  # distinct values while there are any left
        n_distinct = np.unique(X, axis=0).shape[0]
        assert np.unique(C, axis=0).shape[0] == min(k, n_distinct)


def test_greedy_separates_rows_one_ulp_apart_and_duplicates():
    rng = np.random.default_rng(2)
    row = (10 * (1 + rng.random(64))).astype(np.float32)
    X = np.repeat(row[None], 3, axis=0)
    X[1, 0] = np.nextafter(X[0, 0], np.float32(np.inf))  # X[2] duplicates X[0]
    C = X[kmeans_plusplus(X, 2, np.random.default_rng(0))]
    assert not np.array_equal(C[0], C[1])


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="init must be one of"):
        seed_rows("bogus", np.zeros((5, 2), np.float32), 2, np.random.default_rng(0))


def test_auto_is_greedy_while_cheap_then_one_trial_on_4k_rows():
    from nmbatch.engine.seeding import auto_plan, kmeans_plusplus_rejection

    assert auto_plan(5000, 50, 784) == (5000, None)  # MNIST k = 50: the whole first batch
    assert auto_plan(5120, 256, 108) == (5000, None)  # patches k = 256
    assert auto_plan(5120, 256, 784) == (1024, 1)  # MNIST k = 256: 7e9 > 6e9
    assert auto_plan(20480, 1024, 108) == (4096, 1)
    assert auto_plan(3000, 50, 784) == (3000, None)  # a small first batch: all of it
    X = blobs(600, 4, 6, seed=1)
    np.testing.assert_array_equal(seed_rows("auto", X, 6, np.random.default_rng(2)),
                                  kmeans_plusplus(X, 6, np.random.default_rng(2)))
    X = blobs(6000, 784, 30, seed=1)  # greedy's work too large: 4 k rows, one trial
    k = 300  # (by rejection: tests/test_seeding_rejection.py)
    rng = np.random.default_rng(3)
    rows = np.sort(rng.choice(6000, size=1200, replace=False))
    want = rows[kmeans_plusplus_rejection(X[rows], k, rng)]
    np.testing.assert_array_equal(seed_rows("auto", X, k, np.random.default_rng(3)), want)


def test_one_trial_k_means_plus_plus_is_the_d2_draw():
    """With one trial per centroid, each round takes the row it draws (no choice)."""
    X = blobs(2 * SEED_BLOCK + 77, 30, 40, seed=4)
    rng = np.random.default_rng(4)
    got = kmeans_plusplus(X, 40, np.random.default_rng(4), trials=1)
    n = X.shape[0]
    chosen = [int(rng.integers(n))]
    closest = _sq32(X, X[chosen[0]])
    for _ in range(1, 40):
        pick = int(_draw(closest, rng.random(1) * closest.sum())[0])
        chosen.append(pick)
        closest = np.minimum(closest, _sq32(X, X[pick]))
    np.testing.assert_array_equal(got, chosen)
