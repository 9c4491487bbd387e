"""Spherical k-means (``metric="cosine"``): unit rows on ingestion (a zero row refused by
its index, nothing stored), unit centroids ``S(j)/||S(j)||`` derived in one place (the
update, the relocation, the swaps) against plain numpy, bounds sound when normalised
centroids move, the swaps' cosine energies, the doubling test's direction standard
error, and the estimator (``transform`` and ``score`` in ``1 - cos``, reproducible,
pickled, its checks).

The invariant tests of the engine run for both metrics where they are parametrised
(``tests/test_algorithms.py``, ``test_relocation.py``, ``test_swap.py``,
``test_group_bounds.py``, ``test_growth.py``, ``test_retention.py``; the checks are
``tests.engine_helpers.check_step_invariants``'s).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.utils._param_validation import InvalidParameterError

from nmbatch.engine import METRICS, NestedBatchStore, NestedMiniBatchKMeans, make_algorithm
from nmbatch.engine.algorithms.relocation import relocate_empty
from nmbatch.engine.algorithms.swap import merge_costs, swap_clusters, ward
from nmbatch.engine.hosting import EngineConfig, LocalEngine
from nmbatch.engine.kernels.update import centroid_update
from nmbatch.engine.metric import UNIT_TOLERANCE, dissimilarity, similarity, unit_rows
from nmbatch.engine.seeding import initial_centroids
from tests.engine_helpers import (
    brute_most_similar,
    centroids_ref,
    check_step_invariants,
    filled_store,
    snapshot,
    sqdist64_ref,
)
from tests.test_relocation import _reference as relocation_reference
from tests.testkit import blobs

# A float32 row normalised in float64 has a squared norm within 2^-23 (1 + 2^-25) of 1.
UNIT_ROUNDING = 2.0**-23 * (1.0 + 2.0**-20)


def _unit_ref(X: np.ndarray) -> np.ndarray:
    """``unit_rows`` in plain numpy: the squared norm summed sequentially in float64; a
    row within ``UNIT_TOLERANCE`` of 1 kept, others divided by the norm in float64."""
    X64 = X.astype(np.float64)
    norm2 = np.zeros(X.shape[0])
    for t in range(X.shape[1]):
        norm2 = norm2 + X64[:, t] * X64[:, t]
    out = (X64 / np.sqrt(norm2)[:, None]).astype(np.float32)
    keep = np.abs(norm2 - 1.0) <= UNIT_TOLERANCE
    out[keep] = X[keep]
    return out


def _sq_norms(X: np.ndarray) -> np.ndarray:
    return (X.astype(np.float64) ** 2).sum(axis=1)


# -- unit rows ------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 3, 384])
@pytest.mark.parametrize("seed", range(3))
def test_unit_rows_is_the_numpy_formula_and_idempotent(d, seed):
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-20, 20, size=(500, 1))
    X = (rng.standard_normal((500, d)) * scale).astype(np.float32)
    X[:50] = _unit_ref(X[:50])  # some rows unit already
    U = unit_rows(X)
    np.testing.assert_array_equal(U, _unit_ref(X))
    assert U.dtype == np.float32 and U.flags.c_contiguous and U is not X
    assert (np.abs(_sq_norms(U) - 1.0) <= UNIT_ROUNDING).all()
    np.testing.assert_array_equal(unit_rows(U), U)  # idempotent, bit for bit
    np.testing.assert_array_equal(U[:50], X[:50])


def test_a_zero_row_is_refused_by_its_index_and_nothing_is_stored():
    X = blobs(20, 3, 2, seed=0)
    X[7] = 0.0
    X[12] = 0.0
    with pytest.raises(ValueError, match=r"X row 7 is a zero vector"):
        unit_rows(X)
    store = NestedBatchStore(3, seed=0, metric="cosine")
    store.append(X[:5])
    for bad in (lambda: store.append(X), lambda: store.append(X[6:9])):
        with pytest.raises(ValueError, match=r"row (7|1) is a zero vector"):
            bad()
        assert store.n_samples == 5 and store.n_ingested == 5
    empty = NestedBatchStore(3, seed=0, metric="cosine")
    with pytest.raises(ValueError, match="row 7 is a zero vector"):
        empty.load(X)
    assert empty.n_samples == 0
    # Euclidean keeps the zero row as it is.
    plain = filled_store(X)
    assert plain.n_samples == 20


def test_the_store_keeps_unit_rows_whatever_the_scale():
    X = blobs(300, 4, 3, seed=1)
    store = filled_store(X * np.float32(1e3), metric="cosine")
    np.testing.assert_array_equal(np.sort(store.samples(), axis=0),
                                  np.sort(unit_rows(X * np.float32(1e3)), axis=0))  # fmt: skip
    assert (np.abs(_sq_norms(store.samples()) - 1.0) <= UNIT_ROUNDING).all()
    loaded = NestedBatchStore(4, seed=0, metric="cosine")
    loaded.load(X)
    np.testing.assert_array_equal(np.sort(loaded.samples(), axis=0),
                                  np.sort(unit_rows(X), axis=0))  # fmt: skip


def test_metric_names_are_checked():
    assert METRICS == ("euclidean", "cosine")
    with pytest.raises(ValueError, match="metric must be one of"):
        NestedBatchStore(3, metric="manhattan")
    store = filled_store(blobs(50, 3, 2, seed=0))
    with pytest.raises(ValueError, match="the store's is 'euclidean'"):
        make_algorithm("nmbatch", store, 3, metric="cosine")


def test_dissimilarity_and_similarity_are_read_off_the_squared_distance():
    rng = np.random.default_rng(3)
    X = unit_rows(rng.standard_normal((200, 16)).astype(np.float32))
    C = unit_rows(rng.standard_normal((5, 16)).astype(np.float32))
    sq = sqdist64_ref(X, C)
    cos = brute_most_similar(X, C)
    np.testing.assert_allclose(similarity(sq), cos, rtol=0, atol=2.0**-21)
    np.testing.assert_allclose(dissimilarity(sq, "cosine"), 1.0 - cos, rtol=0, atol=2.0**-21)
    assert dissimilarity(sq, "euclidean") is sq
    assert (dissimilarity(sq, "cosine") >= 0).all()


# -- unit centroids ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_the_unit_centroid_update_is_the_numpy_formula(seed):
    rng = np.random.default_rng(seed)
    k, d = 9, 7
    S = rng.standard_normal((k, d)) * 30.0
    v = rng.integers(1, 40, size=k).astype(np.int64)
    v[2] = 0  # empty
    S[2] = 0.0
    S[5] = 0.0  # members that cancel out: no direction
    Q = v.astype(np.float64) * (1.0 + 1e-8)
    C_old = unit_rows(rng.standard_normal((k, d)).astype(np.float32))
    sse = np.empty(k)
    C, p = centroid_update(S, v, Q, C_old, sse_out=sse, unit=True)
    want, has = centroids_ref(S, v, "cosine")
    assert has.tolist() == [j not in (2, 5) for j in range(k)]
    np.testing.assert_array_equal(C[has], want[has])
    np.testing.assert_array_equal(C[~has], C_old[~has])  # kept, as an empty cluster's
    assert (np.abs(_sq_norms(C) - 1.0) <= UNIT_ROUNDING).all()
    moved = np.sqrt(((C.astype(np.float64) - C_old.astype(np.float64)) ** 2).sum(1))
    np.testing.assert_array_equal(p, moved * (1.0 + 1e-9))
    c64 = C_old.astype(np.float64)
    sse_ref = np.maximum(Q - 2.0 * (c64 * S).sum(1) + v * (c64 * c64).sum(1), 0.0)
    np.testing.assert_allclose(sse, sse_ref, rtol=1e-12, atol=1e-12)
    # Without ``unit`` the same kernel gives the means, bit for bit as before.
    C_mean, _ = centroid_update(S, v, Q, C_old)
    nz = v > 0
    np.testing.assert_array_equal(C_mean[nz], (S[nz] / v[nz, None]).astype(np.float32))


@pytest.mark.parametrize("name", ["nmbatch", "nmbatch.deact", "elkan", "lloyd"])
def test_a_cluster_whose_rows_cancel_out_keeps_its_centroid(name):
    """Opposite directions sum to 0: no direction, so the centroid stays where it was
    (as an empty cluster's), nothing is divided by 0, and the model is at a fixed point."""
    X = np.array([[3.0, 0.0], [-2.0, 0.0], [0.0, 5.0]], dtype=np.float32)
    init = np.array([[0.0, -1.0], [0.0, 1.0]], dtype=np.float32)  # both x and -x: ties, to 0
    algo = make_algorithm(name, filled_store(X, metric="cosine"), 2, init=init,
                          batch_size=3, metric="cosine")  # fmt: skip
    for _ in range(3):
        before = snapshot(algo)
        stats = algo.step()
        check_step_invariants(algo, before)
    np.testing.assert_array_equal(algo.centroids, init)
    np.testing.assert_array_equal(algo.v, [2, 1])
    assert not algo.S[0].any() and not algo.p.any() and stats.converged


@pytest.mark.parametrize("seed", range(5))
def test_bounds_stay_sound_when_normalised_centroids_move(seed):
    """docs/design.md, "Spherical k-means": the bounds of the Euclidean distances between
    unit rows and the centroids in force, corrected by ``p(j)`` measured between the
    normalised centroids actually used, bound the distances to the new ones."""
    rng = np.random.default_rng(seed)
    X = unit_rows(rng.standard_normal((400, 6)).astype(np.float32))
    k = 8
    labels = rng.integers(0, k, size=400)
    C_old = unit_rows(rng.standard_normal((k, 6)).astype(np.float32))
    S = np.zeros((k, 6))
    np.add.at(S, labels, X.astype(np.float64))
    v = np.bincount(labels, minlength=k).astype(np.int64)
    C_new, p = centroid_update(S, v, np.zeros(k), C_old, unit=True)
    d_old = np.sqrt(sqdist64_ref(X, C_old))
    d_new = np.sqrt(sqdist64_ref(X, C_new))
    lower = (d_old * (1.0 - 1e-9)).astype(np.float32).astype(np.float64)
    assert (lower - p[None, :] <= d_new).all()
    upper = d_old[np.arange(400), labels]
    assert (upper + p[labels] >= d_new[np.arange(400), labels]).all()
    # The Euclidean nearest unit centroid is the most similar one (within rounding).
    cos = brute_most_similar(X, C_new)
    nearest = np.argmin(d_new, axis=1)
    assert (cos[np.arange(400), nearest] >= cos.max(1) - 2.0**-21).all()


@pytest.mark.parametrize("seed", range(4))
def test_relocation_under_cosine_gives_the_empty_cluster_its_normalised_sample(seed):
    rng = np.random.default_rng(seed)
    k, d, b = 7, 3, 60
    X = unit_rows(rng.normal(size=(b, d)).astype(np.float32))
    labels = rng.integers(0, 3, size=b).astype(np.int32)  # clusters 3..6 empty
    v = np.bincount(labels, minlength=k).astype(np.int64)
    S = np.zeros((k, d))
    np.add.at(S, labels, X.astype(np.float64))
    norms = _sq_norms(X)
    Q = np.bincount(labels, weights=norms, minlength=k)
    C_prev = unit_rows(rng.normal(size=(k, d)).astype(np.float32))
    C = C_prev.copy()
    C[v > 0] = centroids_ref(S, v, "cosine")[0][v > 0]
    p = np.zeros(k)
    sse = np.zeros(k)
    upper = np.zeros(b)
    want_labels, want_v, taken = relocation_reference(X, labels, C, C_prev, v)
    moved = relocate_empty(X, b, labels=labels, norms=norms, S=S, v=v, Q=Q, sse=sse, C=C,
                           C_prev=C_prev, p=p, upper=upper, unit=True)  # fmt: skip
    assert moved == len(taken) > 0
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(v, want_v)
    want, has = centroids_ref(S, v, "cosine")
    np.testing.assert_array_equal(C[has], want[has])
    for i in taken:  # the relocated centroid is its sample, normalised
        np.testing.assert_array_equal(C[labels[i]], centroids_ref(
            X[i : i + 1].astype(np.float64), np.ones(1, np.int64), "cosine")[0][0])  # fmt: skip
        assert upper[i] >= np.linalg.norm(X[i].astype(np.float64) - C_prev[labels[i]])
    changed = np.flatnonzero(p > 0)  # p refreshed for the clusters the votes left or joined
    assert set(labels[taken].tolist()) <= set(changed.tolist())
    dist = np.linalg.norm(C.astype(np.float64) - C_prev.astype(np.float64), axis=1)
    assert (p[changed] >= dist[changed]).all()


# -- swaps --------------------------------------------------------------------------------
def _spherical_energy(X: np.ndarray, labels: np.ndarray, k: int) -> float:
    """``sum ||x - c(a(x))||^2`` with ``c(j)`` the normalised mean, brute force (float64)."""
    X64 = X.astype(np.float64)
    total = 0.0
    for j in range(k):
        rows = X64[labels == j]
        if rows.shape[0]:
            c = rows.sum(0) / np.linalg.norm(rows.sum(0))
            total += float(((rows - c) ** 2).sum())
    return total


def test_the_cosine_merge_cost_is_the_rise_of_the_spherical_energy():
    rng = np.random.default_rng(0)
    X = unit_rows(rng.standard_normal((300, 5)).astype(np.float32) + np.float32(0.5))
    labels = rng.integers(0, 6, size=300)
    S = np.zeros((6, 5))
    np.add.at(S, labels, X.astype(np.float64))
    v = np.bincount(labels, minlength=6).astype(np.int64)
    for a, c in [(0, 1), (2, 5), (3, 4)]:
        merged = np.where(labels == a, c, labels)
        rise = _spherical_energy(X, merged, 6) - _spherical_energy(X, labels, 6)
        np.testing.assert_allclose(ward(S[a], int(v[a]), S[c], int(v[c]), True), rise,
                                   rtol=1e-9, atol=1e-9)  # fmt: skip
    j, partner, cost = merge_costs(S, v, unit=True)
    for a, c, got in zip(j, partner, cost, strict=True):
        np.testing.assert_allclose(got, ward(S[a], int(v[a]), S[c], int(v[c]), True),
                                   rtol=1e-6, atol=1e-9)  # fmt: skip
        others = [ward(S[a], int(v[a]), S[o], int(v[o]), True) for o in range(6) if o != a]
        assert got <= min(others) * (1 + 1e-6) + 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_a_cosine_swap_moves_votes_exactly_and_lowers_the_spherical_energy(seed):
    from tests.test_swap import _crowded  # directions: one blob, two under one centroid, a few

    X, labels, k = _crowded(seed)
    X = unit_rows(X)
    b = X.shape[0]
    S = np.zeros((k, X.shape[1]))
    np.add.at(S, labels, X.astype(np.float64))
    v = np.bincount(labels, minlength=k).astype(np.int64)
    norms = _sq_norms(X)
    Q = np.bincount(labels, weights=norms, minlength=k)
    C = centroids_ref(S, v, "cosine")[0]
    C_prev = C.copy()
    sse = np.zeros(k)
    before = labels.copy()
    energy = _spherical_energy(X, labels, k)
    swaps = swap_clusters(X, b, labels=labels, norms=norms, S=S, v=v, Q=Q, sse=sse, C=C,
                          C_prev=C_prev, p=np.zeros(k), upper=np.zeros(b), unit=True)  # fmt: skip
    assert swaps, "the crowded directions were not swapped"
    S_ref = np.zeros_like(S)
    np.add.at(S_ref, labels, X.astype(np.float64))
    np.testing.assert_allclose(S, S_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(v, np.bincount(labels, minlength=k))
    want = centroids_ref(S, v, "cosine")[0]
    for s in swaps:
        for c in (s.merged, s.into, s.split):
            np.testing.assert_array_equal(C[c], want[c])
    assert (labels != before).sum() == sum(s.rows.shape[0] for s in swaps)
    assert _spherical_energy(X, labels, k) < energy


# -- the doubling test ----------------------------------------------------------------------
def test_the_doubling_test_under_cosine_takes_the_directions_standard_error():
    X = blobs(400, 3, 4, seed=2)
    algo = make_algorithm("nmbatch", filled_store(X, metric="cosine"), 4, metric="cosine")
    algo.S = np.array([[30.0, 0.0, 0.0], [0.0, 8.0, 6.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    algo.v = np.array([40, 20, 6, 0], dtype=np.int64)
    algo.Q = np.array([40.0, 20.0, 6.0, 0.0])
    algo.sse = np.full(4, 1e6)  # not read under cosine
    norm2 = (algo.S**2).sum(1)
    sigma = np.sqrt((algo.v[:2] * algo.Q[:2] - norm2[:2]) / ((algo.v[:2] - 1) * norm2[:2]))
    for rho in (0.5, 2.0, 10.0):
        for p in (1e-4, 1e-2, 0.3):
            algo.p = np.array([p, p, p, p])
            # the cluster that cancels out (S = 0) never blocks; the empty one takes no part
            assert algo._doubling_test(rho, 0) == bool((sigma / p > rho).all())
    algo.p = np.array([0.5, 1e-6, 0.5, 0.5])
    assert not algo._doubling_test(1.0, 0) and algo._doubling_test(1.0, 1)


def test_the_energy_under_cosine_is_the_mean_cosine_dissimilarity():
    X = blobs(2_000, 5, 6, seed=7, spread=1.5, separation=4.0)
    algo = make_algorithm("nmbatch", filled_store(X, seed=1, metric="cosine"), 6,
                          batch_size=200, random_state=0, metric="cosine")  # fmt: skip
    for _ in range(8):
        before = snapshot(algo)
        algo.step()
        check_step_invariants(algo, before)
        U = np.array(algo.store.data[: algo.batch_size])
        cos = brute_most_similar(U, before.centroids)[np.arange(U.shape[0]), algo.labels()]
        # sse is of the centroids in force during the step, as under euclidean
        np.testing.assert_allclose(algo.energy_estimate(), (1.0 - cos).mean(), rtol=1e-6,
                                   atol=2.0**-21)  # fmt: skip
        assert algo.state().energy == algo.energy_estimate()


# -- the estimator ---------------------------------------------------------------------------
def _directions(n: int = 900, seed: int = 0) -> np.ndarray:
    """Samples around 5 directions in 8 dimensions, of very different lengths."""
    rng = np.random.default_rng(seed)
    means = unit_rows(rng.standard_normal((5, 8)).astype(np.float32)).astype(np.float64)
    which = rng.integers(0, 5, size=n)
    X = means[which] + 0.1 * rng.standard_normal((n, 8))
    return (X * 10.0 ** rng.uniform(-3, 3, size=(n, 1))).astype(np.float32)


def test_the_estimator_fits_unit_centroids_and_answers_in_one_minus_cos():
    X = _directions()
    est = NestedMiniBatchKMeans(5, metric="cosine", batch_size=100, random_state=0).fit(X)
    C = est.cluster_centers_
    assert C.dtype == np.float32 and (np.abs(_sq_norms(C) - 1.0) <= UNIT_ROUNDING).all()
    cos = brute_most_similar(X, C)
    T = est.transform(X)
    np.testing.assert_allclose(T, 1.0 - cos, rtol=0, atol=2.0**-21)
    U = unit_rows(X).astype(np.float64)
    np.testing.assert_allclose(
        T, ((U[:, None, :] - C.astype(np.float64)[None]) ** 2).sum(-1) / 2.0, rtol=1e-14
    )
    labels = est.predict(X)
    np.testing.assert_array_equal(labels, est.labels_)
    assert (cos[np.arange(len(X)), labels] >= cos.max(1) - 2.0**-21).all()
    np.testing.assert_allclose(est.score(X), -T.min(1).sum(), rtol=1e-12)
    assert est.inertia_ == -est.score(X)
    # A fixed point: each centroid the normalised mean of its samples.
    for j in range(5):
        s = U[labels == j].sum(0)
        np.testing.assert_allclose(C[j], s / np.linalg.norm(s), rtol=0, atol=1e-6)
    # Each row counts as its direction: scaling rows changes no label.
    np.testing.assert_array_equal(est.predict(X * np.float32(1e-3)), labels)


def test_the_estimator_refuses_a_zero_row_and_stays_as_it_was():
    X = _directions(300)
    est = NestedMiniBatchKMeans(5, metric="cosine", batch_size=100, random_state=0)
    bad = X.copy()
    bad[42] = 0.0
    with pytest.raises(ValueError, match="X row 42 is a zero vector"):
        est.fit(bad)
    assert not hasattr(est, "cluster_centers_")
    est.partial_fit(X)
    centres, seen = est.cluster_centers_.copy(), est.n_samples_seen_
    for call in (est.partial_fit, est.predict, est.transform, est.score):
        with pytest.raises(ValueError, match="X row 42 is a zero vector"):
            call(bad)
    np.testing.assert_array_equal(est.cluster_centers_, centres)
    assert est.n_samples_seen_ == seen == 300


@pytest.mark.parametrize("algorithm", ["nmbatch", "elkan", "lloyd", "mbatch.remove"])
def test_a_cosine_fit_is_reproducible_whatever_the_thread_count(algorithm):
    X = _directions(4_000, seed=1)
    fits = [
        NestedMiniBatchKMeans(
            40, metric="cosine", algorithm=algorithm, batch_size=500, random_state=3,
            n_threads=threads,
        ).fit(X)
        for threads in (1, 2, 1)
    ]
    for other in fits[1:]:
        np.testing.assert_array_equal(other.cluster_centers_, fits[0].cluster_centers_)
        np.testing.assert_array_equal(other.labels_, fits[0].labels_)
        assert other.n_iter_ == fits[0].n_iter_


def test_a_pickled_cosine_model_answers_the_same_and_resumes_on_the_same_rows():
    X = _directions(1_200, seed=2)
    est = NestedMiniBatchKMeans(5, metric="cosine", batch_size=100, random_state=0)
    est.partial_fit(X[:600])
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.cluster_centers_, est.cluster_centers_)
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    np.testing.assert_array_equal(loaded.transform(X), est.transform(X))
    loaded.partial_fit(X[600:])
    est.partial_fit(X[600:])

    def rows_by_id(model: NestedMiniBatchKMeans) -> np.ndarray:
        return model._store.samples()[np.argsort(model._store.ids())]

    # The unit rows pickled come back bit for bit (unit_rows keeps a unit row).
    np.testing.assert_array_equal(rows_by_id(loaded), rows_by_id(est))
    assert (np.abs(_sq_norms(loaded.cluster_centers_) - 1.0) <= UNIT_ROUNDING).all()
    assert loaded.n_samples_seen_ == est.n_samples_seen_ == 1_200


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_every_dtype_of_sklearns_dtype_check_fits_without_zero_rows(dtype):
    """scikit-learn's ``check_estimators_dtypes`` casts ``3 * uniform`` data to integers,
    which makes all-zero rows (refused under cosine: expected to fail in
    ``test_estimator.py``); the same dtypes without a zero row fit and answer."""
    rng = np.random.default_rng(0)
    X = (1 + 3 * rng.uniform(size=(20, 5))).astype(dtype)
    est = NestedMiniBatchKMeans(3, metric="cosine", batch_size=20, random_state=0).fit(X)
    for answer in (est.predict(X), est.transform(X), est.score(X)):
        assert np.all(np.isfinite(answer))
    zero = np.zeros((1, 5), dtype=dtype)
    with pytest.raises(ValueError, match="X row 20 is a zero vector"):
        est.fit(np.concatenate([X, zero]))


def test_a_cosine_window_keeps_unit_rows_and_the_invariants_as_it_slides():
    X = _directions(3_000, seed=6)
    est = NestedMiniBatchKMeans(5, metric="cosine", retention="window", max_samples=1_000,
                                batch_size=100, random_state=0)  # fmt: skip
    for start in range(0, 3_000, 250):
        est.partial_fit(X[start : start + 250])
        algo = est._algorithm
        before = snapshot(algo)
        algo.step()
        check_step_invariants(algo, before)
    assert est.n_samples_retained_ == 1_000
    np.testing.assert_array_equal(np.sort(est._store.ids()), np.arange(2_000, 3_000))
    assert (np.abs(_sq_norms(est._store.samples()) - 1.0) <= UNIT_ROUNDING).all()


def test_the_estimators_metric_is_checked_and_kept():
    X = _directions(300)
    with pytest.raises(InvalidParameterError, match="metric"):
        NestedMiniBatchKMeans(3, metric="manhattan").fit(X)
    est = NestedMiniBatchKMeans(3, metric="cosine", random_state=0).partial_fit(X)
    est.set_params(metric="euclidean")
    with pytest.raises(ValueError, match="metric"):
        est.partial_fit(X)


def test_seeds_on_the_sphere_are_unit_rows():
    """k-means++ on the unit rows samples by ``||x - c||^2 = 2 (1 - cos)``: proportional
    to the cosine dissimilarity, so the existing seeding is spherical k-means++; every
    seed is a stored unit row."""
    U = unit_rows(_directions(500, seed=4))
    for init in ("k-means++", "k-means++.sub", "k-means||", "afk-mc2", "random", "first"):
        C = initial_centroids(init, U, 5, np.random.default_rng(0))
        rows = {r.tobytes() for r in U}
        assert all(c.tobytes() in rows for c in C), init


def test_a_cosine_engine_host_keeps_unit_rows_and_centroids():
    config = EngineConfig(dim=8, k=5, init="k-means++", rho=100.0, batch_size=200, seed=0,
                          metric="cosine")  # fmt: skip
    host = LocalEngine(config)
    host.store.append(_directions(1_000, seed=5))
    for _ in range(5):
        before = snapshot(host._algo)
        state = host.step()
        check_step_invariants(host._algo, before)
    assert (np.abs(_sq_norms(state.centroids) - 1.0) <= UNIT_ROUNDING).all()
    assert (np.abs(_sq_norms(host.store.samples()) - 1.0) <= UNIT_ROUNDING).all()
    assert 0.0 <= state.energy < 0.1  # the mean cosine dissimilarity of 0.1-noisy directions
