"""The first nested batch and its growth sized to k (``engine/algorithms/growth.py``).

``b_0 = min(max(batch_size, c k), N)`` with ``c = B0_PER_CLUSTER``: the rule itself, the
first step of nmbatch under it, the one-sample-one-vote invariants at a k where it
raises ``b_0``, and an unchanged trajectory (bit for bit) where it does not (k = 50 with
``batch_size = 5,000``, the benchmark's and the estimator's default). The doubling test
tolerates ``floor(q k)`` failing clusters exactly where ``b_0`` is sized to ``k``.
"""

from __future__ import annotations

import numpy as np
import pytest

from nmbatch.engine import make_algorithm
from nmbatch.engine.algorithms.growth import (
    B0_PER_CLUSTER,
    DOUBLING_TOLERANCE,
    LARGE_K_RHO,
    doubling_allowance,
    doubling_rho,
    first_batch_size,
)
from tests.engine_helpers import check_step_invariants, filled_store, snapshot
from tests.testkit import blobs


def test_first_batch_is_the_larger_of_batch_size_and_c_k_capped_at_n() -> None:
    c = B0_PER_CLUSTER
    assert c >= 2
    assert first_batch_size(5000, 50, 60_000) == 5000  # c * 50 <= 5000: unchanged
    assert first_batch_size(5000, 1024, 60_000) == c * 1024
    assert first_batch_size(5000, 1024, 10_000) == min(c * 1024, 10_000)
    assert first_batch_size(5000, 16_384, 60_000) == 60_000
    assert first_batch_size(5000, 50, 3_000) == 3_000
    assert first_batch_size(100, 7, 10_000, per_cluster=3) == 100
    assert first_batch_size(100, 70, 10_000, per_cluster=3) == 210
    assert first_batch_size(100, 1024, 10_000, per_cluster=0) == 100  # the paper's b_0
    with pytest.raises(ValueError, match="per_cluster"):
        first_batch_size(100, 10, 1000, per_cluster=-1)


@pytest.mark.parametrize("name", ["nmbatch", "nmbatch.deact"])
def test_first_step_takes_c_samples_per_cluster(name: str) -> None:
    k = 40
    X = blobs(6 * B0_PER_CLUSTER * k, 6, 30, seed=1)
    algo = make_algorithm(name, filled_store(X, seed=1, capacity=len(X)), k,
                          batch_size=100, random_state=0)
    stats = algo.step()
    assert stats.batch_size == B0_PER_CLUSTER * k
    assert stats.n_new == B0_PER_CLUSTER * k
    # Afterwards the batch grows by doubling only.
    b = stats.batch_size
    for _ in range(40):
        stats = algo.step()
        assert stats.batch_size in (b, min(2 * b, len(X)))
        b = stats.batch_size
        if stats.converged:
            break
    assert stats.converged


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_invariants_hold_at_a_k_that_raises_the_first_batch(metric: str) -> None:
    k = 64
    X = blobs(4 * B0_PER_CLUSTER * k, 5, 80, seed=3, spread=2.0)
    algo = make_algorithm("nmbatch", filled_store(X, seed=3, capacity=len(X), metric=metric),
                          k, batch_size=50, random_state=0, metric=metric)  # fmt: skip
    sizes = []
    for _ in range(60):
        before = snapshot(algo)
        stats = algo.step()
        check_step_invariants(algo, before)
        sizes.append(stats.batch_size)
        if stats.converged:
            break
    assert sizes[0] == B0_PER_CLUSTER * k
    assert stats.converged and sizes[-1] == len(X)


def test_doubling_allowance_is_floor_q_k_only_where_b0_is_sized_to_k() -> None:
    q = DOUBLING_TOLERANCE
    assert 0.0 < q <= 0.5
    assert doubling_allowance(5000, 50) == 0  # c * 50 <= 5000: the paper's test
    assert doubling_allowance(5000, 250) == 0
    assert doubling_allowance(5000, 251) == int(q * 251)
    assert doubling_allowance(5000, 1024) == int(q * 1024) > 0
    assert doubling_allowance(5000, 4096, tolerance=0.1) == 409
    assert doubling_allowance(5000, 4096, per_cluster=0) == 0  # the paper's protocol
    assert doubling_allowance(100, 10, per_cluster=20, tolerance=0.25) == 2
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="tolerance"):
            doubling_allowance(100, 10, tolerance=bad)


def test_doubling_rho_is_lowered_only_where_b0_is_sized_to_k() -> None:
    r = LARGE_K_RHO
    assert 0.0 < r < 100.0
    assert doubling_rho(100.0, 5000, 50) == 100.0  # c * 50 <= 5000: the paper's rho
    assert doubling_rho(100.0, 5000, 250) == 100.0
    assert doubling_rho(100.0, 5000, 251) == r
    assert doubling_rho(100.0, 5000, 4096, per_cluster=0) == 100.0  # the paper's protocol
    assert doubling_rho(0.5, 5000, 1024) == min(0.5, r)  # a lower rho is kept
    assert doubling_rho(100.0, 100, 10, per_cluster=20, large_k_rho=3.0) == 3.0
    assert doubling_rho(100.0, 5000, 1024, large_k_rho=float("inf")) == 100.0
    with pytest.raises(ValueError, match="large_k_rho"):
        doubling_rho(100.0, 5000, 1024, large_k_rho=0.0)


def _failing(algo, rho: float) -> int:
    """Moved non-empty clusters with v = 1 or sigma_C / p <= rho (plain numpy)."""
    n = 0
    for v, sse, p in zip(algo.v.tolist(), algo.sse.tolist(), algo.p.tolist(), strict=True):
        if v == 0 or p == 0.0:
            continue
        n += v == 1 or not np.sqrt(max(sse, 0.0) / (v * (v - 1))) / p > rho
    return n


def test_tolerant_doubling_decides_by_the_count_of_failing_clusters() -> None:
    k = 60
    X = blobs(8 * B0_PER_CLUSTER * k, 6, 45, seed=4, spread=2.5)
    algo = make_algorithm("nmbatch", filled_store(X, seed=4, capacity=len(X)), k,
                          batch_size=100, rho=100.0, random_state=0)
    allowed = int(DOUBLING_TOLERANCE * k)
    assert algo._doubling_allowance() == allowed > 0
    assert algo._doubling_rho() == min(algo.rho, LARGE_K_RHO)
    tolerated = 0
    for _ in range(200):
        before = snapshot(algo)
        stats = algo.step()
        check_step_invariants(algo, before)
        failing = _failing(algo, min(algo.rho, LARGE_K_RHO))
        assert stats.doubled == (failing <= allowed)
        tolerated += stats.doubled and failing > 0
        if stats.converged:
            break
    assert stats.converged and stats.batch_size == len(X)
    assert tolerated > 0  # the tolerance was used: the paper's test would not have doubled


def _trajectory(
    X: np.ndarray, k: int, batch_size: int, per_cluster: int | None,
    tolerance: float | None = None,
) -> list:
    algo = make_algorithm("nmbatch", filled_store(X, seed=0, capacity=len(X)), k,
                          init=X[:k].copy(), batch_size=batch_size, random_state=0)
    if per_cluster is not None:
        algo.b0_per_cluster = per_cluster
    if tolerance is not None:
        algo.doubling_tolerance = tolerance
    steps = []
    for _ in range(300):
        stats = algo.step()
        steps.append((stats.batch_size, stats.n_changed, stats.n_distances,
                      stats.n_relocated, algo.centroids.tobytes(), algo.labels().tobytes()))
        if stats.converged:
            break
    assert stats.converged
    return steps


def test_k_50_with_batch_size_5000_is_bit_identical_to_the_papers_first_batch() -> None:
    # per_cluster = 0 is b_0 = min(batch_size, N), the rule before growth.py.
    X = blobs(24_000, 16, 60, seed=7, spread=3.0)
    new = _trajectory(X, 50, 5000, None)
    old = _trajectory(X, 50, 5000, 0)
    assert new[0][0] == 5000
    assert len(new) == len(old) > 3
    assert new == old
    assert new == _trajectory(X, 50, 5000, None, tolerance=0.0)
    # The comparison can fail: where c k exceeds batch_size the trajectory differs.
    raised = _trajectory(X, 50, 500, None)
    assert raised[0][0] == B0_PER_CLUSTER * 50 != 500
    assert raised != _trajectory(X, 50, 500, 0)


def test_the_tolerance_changes_the_trajectory_only_where_b0_is_sized_to_k() -> None:
    X = blobs(24_000, 16, 60, seed=7, spread=3.0)
    paper = _trajectory(X, 60, 500, None, tolerance=0.0)
    tolerant = _trajectory(X, 60, 500, None, tolerance=0.25)
    assert paper != tolerant
    # Doubling sooner: the batch is never smaller at the same step.
    for a, b in zip(paper, tolerant, strict=False):
        assert b[0] >= a[0] or b[0] == len(X)
