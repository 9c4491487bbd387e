"""Cluster swaps (``engine.algorithms.swap``): the choice against a brute-force numpy
version of the rule, votes moved exactly, the energy lowered by exactly gain - cost, bounds
sound, invariants after every step with samples arriving and leaving, the settings, and a
window that follows an abrupt change."""

from __future__ import annotations

import numpy as np
import pytest

from nmbatch.engine import NestedBatchStore, NestedMiniBatchKMeans, make_algorithm
from nmbatch.engine.algorithms.swap import MAX_SWAPS, swap_clusters, swap_wanted
from nmbatch.engine.hosting import feed
from nmbatch.engine.retention import WindowRetention
from tests.engine_helpers import assert_sums_are_means, check_step_invariants, snapshot
from tests.testkit import blobs


def _sums(X: np.ndarray, labels: np.ndarray, k: int):
    X64 = X.astype(np.float64)
    S = np.zeros((k, X.shape[1]))
    np.add.at(S, labels, X64)
    v = np.bincount(labels, minlength=k).astype(np.int64)
    Q = np.bincount(labels, weights=(X64**2).sum(1), minlength=k)
    return S, v, Q


def _energy_at_means(X: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Sum of ``||x - mean(cluster)||^2``, brute force in float64."""
    X64 = X.astype(np.float64)
    total = 0.0
    for j in range(k):
        rows = X64[labels == j]
        if rows.shape[0]:
            total += float(((rows - rows.mean(0)) ** 2).sum())
    return total


def _ward(X: np.ndarray, labels: np.ndarray, a: int, b: int) -> float:
    A, B = X[labels == a].astype(np.float64), X[labels == b].astype(np.float64)
    gap = A.mean(0) - B.mean(0)
    return A.shape[0] * B.shape[0] / (A.shape[0] + B.shape[0]) * float(gap @ gap)


def _crowded(seed: int):
    """Cluster 0: one blob; 1: two blobs under one centroid; 2: a few far samples (the
    starving cluster); plus clusters 3.. of single blobs. Returns ``X, labels, k``."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(2, 6))
    n = [int(rng.integers(150, 250)) for _ in range(3)]
    far = int(rng.integers(2, 8))
    centre = np.zeros(d)
    parts = [
        (rng.normal(size=(n[0], d)) + np.r_[-30.0, [0.0] * (d - 1)], 0),
        (rng.normal(size=(n[1], d)) + np.r_[30.0, 15.0, [0.0] * (d - 2)], 1),
        (rng.normal(size=(n[2], d)) + np.r_[30.0, -15.0, [0.0] * (d - 2)], 1),
        (rng.normal(size=(far, d)) + np.r_[-10.0, 60.0, [0.0] * (d - 2)], 2),
    ]
    for j in range(3, 3 + int(rng.integers(0, 3))):
        centre = rng.uniform(-200, 200, size=d)
        parts.append((rng.normal(size=(100, d)) + centre, j))
    X = np.concatenate([p for p, _ in parts]).astype(np.float32)
    labels = np.concatenate([np.full(p.shape[0], j, dtype=np.int32) for p, j in parts])
    order = rng.permutation(X.shape[0])
    return X[order], labels[order], 1 + int(labels.max())


@pytest.mark.parametrize("seed", range(8))
def test_a_swap_is_the_numpy_rule_moves_votes_exactly_and_lowers_the_energy(seed):
    X, labels, k = _crowded(seed)
    b = X.shape[0]
    S, v, Q = _sums(X, labels, k)
    C = (S / v[:, None]).astype(np.float32)
    C_prev = (C + np.float32(0.5)).astype(np.float32)  # the step's centroids, before the update
    resid = ((X.astype(np.float64) - C_prev[labels].astype(np.float64)) ** 2).sum(1)
    sse = np.bincount(labels, weights=resid, minlength=k)
    norms = (X.astype(np.float64) ** 2).sum(1)
    upper = np.zeros(b)
    p = np.zeros(k)
    before = labels.copy()
    energy = _energy_at_means(X, labels, k)

    # the rule, brute force: the cheapest merge, then the largest sse at the means
    pairs = [(a, c) for a in range(k) for c in range(k) if a != c]
    j, into = min(pairs, key=lambda ac: (_ward(X, labels, *ac), ac[0], ac[1]))
    if (v[into], into) < (v[j], j):  # the smaller of the pair leaves
        j, into = into, j
    at_mean = {c: _energy_at_means(X[labels == c], np.zeros(v[c], int), 1) for c in range(k)}
    m = max((c for c in range(k) if c not in (j, into)), key=lambda c: (at_mean[c], -c))
    assert (j, into, m) == (2, 0, 1)  # the far samples join cluster 0; cluster 1 splits

    swaps = swap_clusters(X, b, labels=labels, norms=norms, S=S, v=v, Q=Q, sse=sse, C=C,
                          C_prev=C_prev, p=p, upper=upper, max_swaps=1)  # fmt: skip
    assert len(swaps) == 1
    swap = swaps[0]
    assert (swap.merged, swap.into, swap.split) == (j, into, m)
    assert (labels[before == j] == into).all()
    taken = (before == m) & (labels == j)
    assert 0 < taken.sum() < (before == m).sum()
    np.testing.assert_array_equal(np.sort(swap.rows), np.flatnonzero(labels != before))
    # votes: sums of the new labels, centroids at the means
    assert_sums_are_means(S, v, X, labels)
    _, v_ref, Q_ref = _sums(X, labels, k)
    np.testing.assert_array_equal(v, v_ref)
    np.testing.assert_allclose(Q, Q_ref, rtol=1e-12)
    for c in (j, into, m):
        np.testing.assert_array_equal(C[c], (S[c] / v[c]).astype(np.float32))
    # the energy fell by exactly the split's gain minus the merge's cost
    parts = labels.copy()
    parts[before == j] = -1  # m split, the merged rows aside
    gain = _ward(X, parts, m, j)
    cost = _ward(X, before, j, into)
    assert gain > cost
    np.testing.assert_allclose(energy - _energy_at_means(X, labels, k), gain - cost, rtol=1e-9)
    # bounds: u(i) bounds the distance to the new cluster's previous centroid, p the moves
    d_own = np.sqrt(((X.astype(np.float64) - C_prev[labels].astype(np.float64)) ** 2).sum(1))
    assert (upper[swap.rows] >= d_own[swap.rows]).all()
    moved = np.sqrt(((C.astype(np.float64) - C_prev.astype(np.float64)) ** 2).sum(1))
    assert (p[[j, into, m]] >= moved[[j, into, m]]).all()
    sse_ref = np.bincount(
        labels,
        weights=((X.astype(np.float64) - C_prev[labels].astype(np.float64)) ** 2).sum(1),
        minlength=k,
    )
    np.testing.assert_allclose(sse, sse_ref, rtol=1e-9, atol=1e-9)


def test_no_swap_where_it_would_not_lower_the_energy():
    """Well separated blobs, one centroid each: every merge costs more than any split gains."""
    X, labels, k = _crowded(0)
    keep = labels != 1  # no crowded cluster, and the far samples ...
    X, labels = X[keep], labels[keep]
    labels[labels == 2] = 1  # ... as a cluster of their own
    labels[labels > 2] -= 1
    k -= 1
    S, v, Q = _sums(X, labels, k)
    C = (S / v[:, None]).astype(np.float32)
    sse = np.zeros(k)
    before = (S.copy(), v.copy(), labels.copy())
    swaps = swap_clusters(X, X.shape[0], labels=labels, norms=None, S=S, v=v, Q=Q, sse=sse,
                          C=C, C_prev=C.copy(), p=np.zeros(k))  # fmt: skip
    assert swaps == []
    np.testing.assert_array_equal(S, before[0])
    np.testing.assert_array_equal(labels, before[2])


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("bounds", ["full", "group", "hamerly"])
def test_every_invariant_holds_after_each_step_with_swaps_in_a_moving_window(bounds, metric):
    old = blobs(12_000, 4, 8, seed=1, separation=30.0)
    new = blobs(12_000, 4, 8, seed=101, separation=30.0) + np.float32(40.0)
    store = NestedBatchStore(4, seed=3, metric=metric)
    algo = make_algorithm("nmbatch", store, 8, batch_size=400, random_state=0, bounds=bounds,
                          swap=True, metric=metric)  # fmt: skip
    policy = WindowRetention(3_000)
    n_swaps = 0
    for X in (old, new):
        for start in range(0, X.shape[0], 400):
            feed(policy, algo, X[start : start + 400])
            if not algo.ready():
                continue
            before = snapshot(algo)
            algo.step()
            check_step_invariants(algo, before)
            n_swaps += len(algo.last_swaps)
    assert n_swaps > 0


def _transition(swap: bool, threads: int = 1) -> tuple[list[float], np.ndarray]:
    """A window of 3,000 over 6,000 samples of 8 blobs, then 3,000 of 8 new ones, in chunks
    of 150: the model's energy on the window over that of scikit-learn's k-means of the
    window (3 inits) every 750 samples of the change, and the final centroids."""
    from sklearn.cluster import KMeans

    old = blobs(6_000, 4, 8, seed=4, separation=30.0)
    new = blobs(3_000, 4, 8, seed=104, separation=30.0) + np.float32(40.0)
    stream = np.concatenate([old, new])
    est = NestedMiniBatchKMeans(8, retention="window", max_samples=3_000, random_state=0,
                                swap_clusters=swap, n_threads=threads)  # fmt: skip
    ratios = []
    for start in range(0, stream.shape[0], 150):
        est.partial_fit(stream[start : start + 150])
        stop = start + 150
        if stop > 6_000 and stop % 750 == 0 and stop < stream.shape[0]:
            W = stream[stop - 3_000 : stop]
            ref = KMeans(8, n_init=3, random_state=0).fit(W).inertia_
            ratios.append(-est.score(W) / ref)
    return ratios, est.cluster_centers_


def test_swaps_let_a_window_follow_a_change_reproducibly_for_any_thread_count():
    """While old samples leave the window, Lloyd steps keep centroids on the old clusters
    and crowd the new ones; with swaps the model stays at the window's k-means."""
    with_swaps, C1 = _transition(True)
    without, _ = _transition(False)
    assert max(with_swaps) < 1.1 < 1.5 < max(without), (with_swaps, without)
    _, C2 = _transition(True)
    _, C3 = _transition(True, threads=2)
    np.testing.assert_array_equal(C1, C2)
    np.testing.assert_array_equal(C1, C3)


def test_swap_setting_follows_the_retention_unless_given():
    k50 = {"n_clusters": 50, "batch_size": 5_000}
    assert swap_wanted("auto", "window", **k50) and swap_wanted("auto", "age", **k50)
    assert not swap_wanted("auto", "all", **k50)
    assert not swap_wanted("auto", "reservoir", **k50)
    assert swap_wanted(True, "all", **k50) and not swap_wanted(False, "window", **k50)
    # The first batch sized to k (20 k > batch_size): on under every retention.
    assert not swap_wanted("auto", "all", n_clusters=250, batch_size=5_000)
    assert swap_wanted("auto", "all", n_clusters=251, batch_size=5_000)
    assert swap_wanted("auto", "reservoir", n_clusters=1_024, batch_size=5_000)
    assert not swap_wanted(False, "all", n_clusters=1_024, batch_size=5_000)
    X = blobs(2_000, 3, 4, seed=0)
    for retention, kwargs, want in [
        ("all", {}, False),
        ("window", {"max_samples": 1_000}, True),
        ("window", {"max_samples": 1_000, "swap_clusters": False}, False),
        ("all", {"swap_clusters": True}, True),
        ("all", {"batch_size": 60}, True),  # 20 k > batch_size: the first batch sized to k
        ("reservoir", {"max_samples": 1_000, "batch_size": 60}, True),
    ]:
        est = NestedMiniBatchKMeans(4, retention=retention, random_state=0, **kwargs)
        est.partial_fit(X)
        assert est._algorithm.swap is want
    with pytest.raises(ValueError, match="swap_clusters"):
        NestedMiniBatchKMeans(4, swap_clusters="yes").fit(X)


@pytest.mark.parametrize("seed", range(3))
def test_a_steps_swaps_are_those_of_one_swap_at_a_time(seed):
    """swap_clusters computes the merge costs once for all of a step's swaps; the swaps
    are those of calls making one swap each, every earlier swap's clusters frozen."""
    X = blobs(6_000, 4, 90, seed=seed, spread=1.0)
    store = NestedBatchStore(4, seed=seed)
    store.append(X)
    algo = make_algorithm("nmbatch", store, 150, batch_size=6_000, random_state=seed,
                          swap=False)  # fmt: skip
    for _ in range(3):
        algo.step()
    b, data = algo.batch_size, store.samples()
    C_prev = (algo.centroids + np.float32(0.01)).astype(np.float32)

    def state():
        return {"labels": algo._labels[:b].copy(), "norms": algo._xx[:b].copy(),
                "S": algo.S.copy(), "v": algo.v.copy(), "Q": algo.Q.copy(),
                "sse": algo.sse.copy(), "C": algo.centroids.copy(), "C_prev": C_prev,
                "p": algo.p.copy(), "upper": algo._upper[:b].copy()}  # fmt: skip

    together = state()
    swaps = swap_clusters(data, b, **together)
    assert len(swaps) >= 3
    alone = state()
    frozen = np.zeros(150, dtype=bool)
    for want in swaps:
        (got,) = swap_clusters(data, b, **alone, max_swaps=1, frozen=frozen)
        assert (got.merged, got.into, got.split) == (want.merged, want.into, want.split)
        np.testing.assert_array_equal(got.rows, want.rows)
        frozen[[got.merged, got.into, got.split]] = True
    if len(swaps) < MAX_SWAPS:  # the step stopped because no further swap lowers the energy
        assert not swap_clusters(data, b, **alone, max_swaps=1, frozen=frozen)
    for name in ("labels", "S", "v", "Q", "sse", "C", "p", "upper"):
        np.testing.assert_array_equal(together[name], alone[name])


def test_the_steps_merge_table_answers_as_merge_costs_on_the_free_clusters():
    from nmbatch.engine.algorithms.swap import MERGE_CANDIDATES, _MergeTable, merge_costs

    rng = np.random.default_rng(0)
    k = 150
    S = rng.normal(size=(k, 5)) * 40.0
    v = rng.integers(1, 60, size=k)
    v[[3, 77]] = 0  # empty clusters take no part
    table = _MergeTable(S, v, MERGE_CANDIDATES + 3 * MAX_SWAPS)
    free = np.ones(k, dtype=bool)
    by_size = np.lexsort((np.arange(k), v))
    for _ in range(MAX_SWAPS):
        # a swap's three clusters leave: the smallest free ones, the worst case for the rows
        free[by_size[free[by_size] & (v[by_size] > 0)][:3]] = False
        got = table.cheapest(free, MERGE_CANDIDATES)
        want = merge_costs(S, np.where(free, v, 0))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[2], want[2], rtol=1e-12)
