"""Sample weights (issue 35): a weight of ``w`` is the model of ``w`` copies.

What is asserted exactly, and why: a store of repeated rows has other rows, so another
shuffle, another first batch and another seeding than the weighted store. The models
are therefore compared with a fixed ``init`` and the whole store as the first batch
(``batch_size >= n``: the full batch from the first step; no doubling test decides
anything): then every step sees the same centroids, the same labels of the distinct
rows, and sums of the same terms in another order. ``v`` (integer weights) is then equal
exactly, the centroids (``float32(S(j)/v(j))``) equal exactly for these seeds, the
labels of the distinct rows equal, and the inertia equal to float64 rounding of the sum
(``rtol=1e-12``). The number of iterations may differ by one: a weight-0 row changes
label without changing a sum, which the stopping rule counts as a change.
"""

from __future__ import annotations

import pickle

import numba
import numpy as np
import pytest

from nmbatch.engine import NestedBatchStore, make_algorithm
from nmbatch.engine.estimator import NestedMiniBatchKMeans
from nmbatch.engine.kernels.parallel import every_parallel_path
from nmbatch.engine.seeding import seed_rows
from tests.engine_helpers import (
    check_retire_invariants,
    check_step_invariants,
    row_state,
    snapshot,
)
from tests.testkit import blobs

ONE_VOTE = ("nmbatch", "nmbatch.deact", "elkan", "lloyd")


def weighted_store(X, w, *, seed=2, metric="euclidean", chunks=1):
    """A store of the rows of ``X`` with weights ``w``, appended in ``chunks`` calls."""
    store = NestedBatchStore(X.shape[1], seed=seed, capacity=16, metric=metric)
    for part, wp in zip(np.array_split(X, chunks), np.array_split(w, chunks), strict=True):
        store.append(part, weights=wp)
    return store


def float_weights(n, seed=0, zeros=0.1):
    """Weights in ``[0, 3)``, about ``zeros`` of them 0."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.0, 3.0, n)
    w[rng.random(n) < zeros] = 0.0
    return w


# -- refused weights ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("weights", "match"),
    [
        (-1.0, "must be >= 0"),
        (np.nan, "NaN or infinity"),
        (np.inf, "NaN or infinity"),
        ("wrong length", "shape"),
        ("text", "real numbers"),
    ],
)
def test_bad_weights_are_refused_and_change_nothing(weights, match):
    X = blobs(60, 2, 3, seed=1)
    n = X.shape[0]
    if isinstance(weights, float):
        w = np.ones(n)
        w[7] = weights
    elif weights == "wrong length":
        w = np.ones(n - 1)
    else:
        w = np.array(["a"] * n)
    km = NestedMiniBatchKMeans(n_clusters=3, random_state=0).fit(X)
    centers = km.cluster_centers_.copy()
    for call in (km.fit, km.partial_fit):
        with pytest.raises(ValueError, match=match):
            call(X, sample_weight=w)
    np.testing.assert_array_equal(km.cluster_centers_, centers)
    store = NestedBatchStore(2, seed=0)
    with pytest.raises(ValueError, match=match):
        store.append(X, weights=w)
    assert store.n_samples == 0 and not store.weighted
    with pytest.raises(ValueError, match=match):
        km.score(X, sample_weight=w)


# -- the store ----------------------------------------------------------------------------
def test_unweighted_store_keeps_no_weights():
    X = blobs(100, 3, 2, seed=0)
    store = NestedBatchStore(3, seed=0)
    store.append(X)
    store.append(X, weights=np.ones(100))  # all ones: still unweighted
    assert not store.weighted and store.weights_buffer.shape == (0,)
    np.testing.assert_array_equal(store.weights(), np.ones(200))
    nbytes = store.nbytes
    store.append(X[:1], weights=[2.0])
    assert store.weighted and store.nbytes > nbytes


@pytest.mark.parametrize("load", [False, True])
def test_weights_move_with_their_rows(load):
    """Each row keeps its weight through the shuffled appends, a load, the growth of the
    capacity and the compaction of ``retire``."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(500, 3)).astype(np.float32)
    w = np.arange(500, dtype=np.float64) / 7.0  # the weight names the row
    store = NestedBatchStore(3, seed=1, capacity=8)
    if load:
        store.load(X[:300], weights=w[:300])
    else:
        store.append(X[:10])  # unweighted rows first: weight 1
        store.append(X[10:300], weights=w[10:300])
    store.grow_batch(120)
    store.append(X[300:], weights=w[300:])

    def check():
        ids = store.ids()
        expect = w[ids].copy()
        if not load:
            expect[ids < 10] = 1.0
        np.testing.assert_array_equal(store.weights(), expect)
        np.testing.assert_array_equal(store.samples(), X[ids])

    check()
    store.retire(ids=rng.choice(500, 90, replace=False))
    check()
    store.retire(before=200)
    check()


# -- invariants after every step ----------------------------------------------------------
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("name", ONE_VOTE)
@pytest.mark.parametrize("init", ["first", "k-means++"])
def test_weighted_invariants_after_every_step(name, metric, init):
    """``S(j)/v(j)`` is the weighted mean of the prefix rows of ``j`` and ``v(j)`` their
    weight, after every step; the rows arrive weighted in chunks while the model runs."""
    X = blobs(700, 3, 6, seed=4, spread=1.5, separation=6.0)
    w = float_weights(700, seed=3)
    store = weighted_store(X[:400], w[:400], metric=metric)
    algo = make_algorithm(name, store, 6, init=init, rho=3.0, batch_size=40,
                          random_state=3, metric=metric)  # fmt: skip
    for t in range(60):
        if t == 10:
            store.append(X[400:], weights=w[400:])
        before = snapshot(algo)
        algo.step()
        check_step_invariants(algo, before)
        assert algo.v.dtype == np.float64
    assert algo.batch_size == 700


@pytest.mark.parametrize("bound_mode", ["full", "group", "hamerly"])
def test_weighted_invariants_with_every_bound_mode(bound_mode):
    X = blobs(900, 4, 40, seed=7, spread=1.0, separation=3.0)
    store = weighted_store(X, float_weights(900, seed=1), chunks=3)
    algo = make_algorithm("nmbatch", store, 40, init="k-means++", rho=3.0, batch_size=60,
                          random_state=1, bounds=bound_mode)  # fmt: skip
    for _ in range(40):
        before = snapshot(algo)
        algo.step()
        check_step_invariants(algo, before)


# -- a weight of w is w copies ------------------------------------------------------------
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("algorithm", ["nmbatch", "nmbatch.deact", "elkan", "lloyd"])
def test_integer_weights_equal_repeated_rows(algorithm, metric):
    X = blobs(400, 5, 6, seed=2, spread=2.0, separation=2.0)
    w = np.random.default_rng(4).integers(0, 4, 400)
    init = X[np.flatnonzero(w)[:6]]
    params = dict(n_clusters=6, init=init, batch_size=10_000, max_iter=300,
                  random_state=0, algorithm=algorithm, metric=metric)  # fmt: skip
    weighted = NestedMiniBatchKMeans(**params).fit(X, sample_weight=w.astype(float))
    repeated = NestedMiniBatchKMeans(**params).fit(np.repeat(X, w, axis=0))
    np.testing.assert_array_equal(weighted.cluster_centers_, repeated.cluster_centers_)
    np.testing.assert_array_equal(weighted._algorithm.v, repeated._algorithm.v)
    np.testing.assert_array_equal(np.repeat(weighted.labels_, w), repeated.labels_)
    np.testing.assert_allclose(weighted.inertia_, repeated.inertia_, rtol=1e-12)
    assert abs(weighted.n_iter_ - repeated.n_iter_) <= 1
    np.testing.assert_allclose(
        weighted.score(X, sample_weight=w), repeated.score(np.repeat(X, w, axis=0)), rtol=1e-12
    )


def test_zero_weight_rows_count_nowhere_but_are_labelled():
    """A weight-0 row is stored and labelled (``labels_``, ``predict``) but the model is
    that of the data without it: same centroids, inertia, ``v``."""
    X = blobs(300, 3, 4, seed=9)
    w = np.ones(300)
    w[::3] = 0.0
    init = X[1:5]
    params = dict(n_clusters=4, init=init, batch_size=10_000, random_state=0)
    with_zeros = NestedMiniBatchKMeans(**params).fit(X, sample_weight=w)
    without = NestedMiniBatchKMeans(**params).fit(X[w > 0])
    np.testing.assert_array_equal(with_zeros.cluster_centers_, without.cluster_centers_)
    np.testing.assert_allclose(with_zeros.inertia_, without.inertia_, rtol=1e-12)
    assert with_zeros._store.n_samples == 300
    np.testing.assert_array_equal(with_zeros.labels_, with_zeros.predict(X))
    np.testing.assert_array_equal(with_zeros._algorithm.v, without._algorithm.v)


def test_scaling_every_weight_keeps_the_centroids():
    X = blobs(300, 3, 4, seed=3)
    w = float_weights(300, seed=2, zeros=0.0)
    init = X[:4]
    a = NestedMiniBatchKMeans(n_clusters=4, init=init, batch_size=10_000).fit(X, sample_weight=w)
    b = NestedMiniBatchKMeans(n_clusters=4, init=init, batch_size=10_000).fit(
        X, sample_weight=4.0 * w
    )
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-6)
    np.testing.assert_allclose(4.0 * a.inertia_, b.inertia_, rtol=1e-9)


# -- the doubling test --------------------------------------------------------------------
def test_doubling_test_counts_weights_as_copies():
    """``sigma_C(j)^2 = sse(j) / (v(j) (v(j) - 1))`` with ``v(j)`` the weight of ``j``
    (docs/design.md): the test of two copies of a cluster's samples; ``v(j) <= 1`` with
    ``p(j) > 0`` fails."""
    store = weighted_store(blobs(50, 2, 2, seed=0), np.full(50, 0.5))
    algo = make_algorithm("nmbatch", store, 2, init="first", batch_size=50, random_state=0)
    algo.v = np.array([0.5, 6.0])
    algo.sse = np.array([1.0, 30.0])
    algo.p = np.array([0.0, 0.1])  # cluster 0 did not move: not tested
    sigma = np.sqrt(30.0 / (6.0 * 5.0))
    assert algo._doubling_test(0.99 * sigma / 0.1, allowed=0)
    assert not algo._doubling_test(1.01 * sigma / 0.1, allowed=0)
    algo.p = np.array([0.1, 0.1])  # now cluster 0 moved with v = 0.5 <= 1: it fails
    assert not algo._doubling_test(0.5 * sigma / 0.1, allowed=0)
    assert algo._doubling_test(0.5 * sigma / 0.1, allowed=1)


# -- retention: a weighted vote leaves exactly --------------------------------------------
@pytest.mark.parametrize("name", ONE_VOTE)
def test_retire_takes_back_weighted_votes(name):
    X = blobs(600, 3, 5, seed=6)
    w = float_weights(600, seed=8)
    store = weighted_store(X, w)
    algo = make_algorithm(name, store, 5, init="first", rho=3.0, batch_size=80, random_state=0)
    rng = np.random.default_rng(0)
    for t in range(12):
        algo.step()
        before = row_state(algo)
        gone = set(rng.choice(store.ids(), 25, replace=False).tolist())
        if t % 3 == 2:
            cut = int(np.sort(store.ids())[20])
            gone |= {i for i in store.ids().tolist() if i < cut}
            algo.retire(ids=np.array(sorted(gone)), before=cut)
        else:
            algo.retire(ids=np.array(sorted(gone)))
        check_retire_invariants(algo, before, gone)


def test_integer_weighted_votes_retire_exactly():
    """With integer weights every sum is exact: after a retirement ``v`` equals the
    retained rows' weights, to the last bit."""
    X = np.round(blobs(400, 3, 4, seed=1) * 8) / 8  # exact in float32 and their sums
    w = np.random.default_rng(1).integers(0, 5, 400).astype(float)
    store = weighted_store(X, w)
    algo = make_algorithm("nmbatch", store, 4, init="first", batch_size=100, random_state=0)
    for _ in range(5):
        algo.step()
    algo.retire(before=150)
    b = algo.batch_size
    labels = algo.labels()
    wb = store.weights()[:b]
    np.testing.assert_array_equal(algo.v, np.bincount(labels, weights=wb, minlength=4))
    Xb = np.array(store.data[:b], dtype=np.float64)
    S = np.zeros_like(algo.S)
    np.add.at(S, labels, wb[:, None] * Xb)
    np.testing.assert_array_equal(algo.S, S)


@pytest.mark.parametrize("retention", ["window", "reservoir", "age"])
def test_partial_fit_retention_with_weights(retention):
    X = blobs(1200, 3, 4, seed=2)
    w = float_weights(1200, seed=5)
    limit = {"max_age_seconds": 2.5} if retention == "age" else {"max_samples": 300}
    km = NestedMiniBatchKMeans(n_clusters=4, retention=retention, random_state=0, **limit)
    for t, lo in enumerate(range(0, 1200, 100)):
        before = row_state(km._algorithm) if t else None
        km.partial_fit(X[lo : lo + 100], sample_weight=w[lo : lo + 100], now=float(t))
        algo, store = km._algorithm, km._store
        ids = store.ids()
        np.testing.assert_array_equal(store.weights(), w[ids])  # weights by stream id
        b = algo.batch_size
        labels = algo.labels()
        np.testing.assert_allclose(
            algo.v, np.bincount(labels, weights=w[ids[:b]], minlength=4), rtol=1e-9, atol=1e-9
        )
        assert before is None or set(row_state(algo)) <= set(before) | set(range(lo, lo + 100))
        assert np.isclose(km.inertia_, -km.score(X[lo : lo + 100], sample_weight=w[lo : lo + 100]))
    assert store.n_samples <= 300


# -- seeding, pickling --------------------------------------------------------------------
@pytest.mark.parametrize("init", ["auto", "k-means++", "k-means++.sub", "random"])
def test_weighted_seeding_never_picks_a_weight_zero_row(init):
    X = np.random.default_rng(0).normal(size=(400, 3)).astype(np.float32)
    w = np.zeros(400)
    w[np.random.default_rng(1).choice(400, 40, replace=False)] = 2.0
    for seed in range(5):
        rows = seed_rows(init, X, 8, np.random.default_rng(seed), w)
        if init == "k-means++.sub":  # drawn among a subsample: zero weights may be drawn
            continue
        assert (w[rows] > 0).all()


def test_weighted_seeding_draws_by_weight():
    """A row of weight 3 is drawn first as often as three copies of it: the first
    k-means++ centre, over many seeds, in proportion to the weights."""
    X = np.arange(4, dtype=np.float32).reshape(4, 1)
    w = np.array([1.0, 3.0, 0.0, 4.0])
    firsts = [seed_rows("k-means++", X, 1, np.random.default_rng(s), w)[0] for s in range(4000)]
    freq = np.bincount(firsts, minlength=4) / 4000
    np.testing.assert_allclose(freq, w / w.sum(), atol=0.03)


def test_pickle_keeps_the_weights():
    X = blobs(300, 2, 3, seed=0)
    w = float_weights(300, seed=0)
    km = NestedMiniBatchKMeans(n_clusters=3, random_state=0)
    km.partial_fit(X[:200], sample_weight=w[:200])
    again = pickle.loads(pickle.dumps(km))
    km.partial_fit(X[200:], sample_weight=w[200:])
    again.partial_fit(X[200:], sample_weight=w[200:])
    ids = again._store.ids()
    np.testing.assert_array_equal(again._store.weights(), w[ids])
    np.testing.assert_array_equal(km._store.weights()[np.argsort(km._store.ids())],
                                  again._store.weights()[np.argsort(ids)])


# -- the parallel paths -------------------------------------------------------------------
@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba's pool has one thread")
@pytest.mark.parametrize("bounds", ["full", "group"])
@pytest.mark.parametrize("name", ["nmbatch", "nmbatch.deact", "lloyd"])
def test_weighted_votes_on_every_parallel_path(name, bounds):
    """Two threads and every parallel kernel (the votes cast by ``apply_moves``, the
    pooled dense pass): the same model, bit for bit, as one thread."""
    X = blobs(1500, 6, 12, seed=3, separation=3.0)
    w = float_weights(1500, seed=4)
    models = []
    for threads in (1, 2):
        before = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            with every_parallel_path():
                algo = make_algorithm(name, weighted_store(X, w), 12, init="first",
                                      rho=3.0, batch_size=200, bounds=bounds, random_state=0)
                for _ in range(15):
                    before_step = snapshot(algo)
                    algo.step()
                    check_step_invariants(algo, before_step)
        finally:
            numba.set_num_threads(before)
        models.append((algo.centroids.copy(), algo.v.copy(), algo.S.copy()))
    for a, b in zip(*models, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_cluster_emptied_of_fractional_weights_is_empty():
    """``0.1 + 0.2 + 0.3`` taken back in another order leaves a float64 residue; a cluster
    with no voting row left has ``S = 0`` and ``v = 0`` exactly (an empty cluster, not
    a centroid at ``residue / residue``)."""
    X = np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [9.0, 9.0], [9.1, 9.0], [9.0, 9.1]],
                 dtype=np.float32)
    w = np.array([0.1, 0.2, 0.7, 0.1, 0.2, 0.3])
    store = NestedBatchStore(2, seed=0)
    store.append(X, weights=w)
    algo = make_algorithm("nmbatch", store, 2, init=np.array([[0, 0], [9, 9]]),
                          batch_size=6, relocate_empty=False)  # fmt: skip
    algo.step()
    far = store.ids()[store.samples()[:, 0] > 5]
    algo.retire(ids=far[::-1])  # in another order than the votes were cast
    assert algo.v[1] == 0.0 and not algo.S[1].any() and algo.Q[1] == 0.0
    centroid = algo.centroids[1].copy()
    algo.step()
    np.testing.assert_array_equal(algo.centroids[1], centroid)  # empty: it stays


def test_fit_predict_and_fit_transform_take_weights():
    X = blobs(200, 2, 3, seed=4)
    w = float_weights(200, seed=6)
    params = dict(n_clusters=3, init=X[:3], batch_size=10_000)
    km = NestedMiniBatchKMeans(**params).fit(X, sample_weight=w)
    np.testing.assert_array_equal(
        NestedMiniBatchKMeans(**params).fit_predict(X, sample_weight=w), km.labels_
    )
    np.testing.assert_array_equal(
        NestedMiniBatchKMeans(**params).fit_transform(X, sample_weight=w), km.transform(X)
    )
