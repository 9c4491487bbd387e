"""Choosing k (issue 36, item 4): ``nmbatch.engine.sweep``.

The silhouette is plain numpy, checked against scikit-learn's ``silhouette_score``; the
elbow rule is checked on curves whose elbow is known; a sweep on blobs of a known number
of clusters recommends it; the uniform sample of a chunked stream is bounded and uniform.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import silhouette_score

from nmbatch.engine.sweep import ELBOW_RULE, UniformSample, elbow, silhouette, sweep
from tests.testkit import blobs


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("k", [2, 5, 40])
def test_silhouette_is_scikit_learns(metric: str, k: int) -> None:
    rng = np.random.default_rng(k)
    X = (blobs(400, 6, 4, seed=k) + 3.0).astype(np.float64)  # scikit-learn's in float64
    labels = rng.integers(0, k, size=400) * 7 + 3  # any label values, some clusters tiny
    labels[:3] = [1000, 1001, 1002]  # clusters of one row: s = 0
    ours = silhouette(X, labels, metric)
    assert ours == pytest.approx(silhouette_score(X, labels, metric=metric), rel=1e-9, abs=1e-12)


def test_silhouette_is_undefined_below_two_clusters_or_at_one_row_each() -> None:
    X = blobs(10, 2, 2)
    assert silhouette(X, np.zeros(10, dtype=int)) is None
    assert silhouette(X, np.arange(10)) is None
    assert silhouette(X, np.r_[np.zeros(9, dtype=int), 1]) is not None


def test_the_elbow_is_the_point_farthest_below_the_chord_on_a_log_k_axis() -> None:
    ks = [2, 4, 8, 16, 32]
    assert elbow(ks, [100.0, 50.0, 10.0, 9.0, 8.0]) == 8
    assert elbow(ks[::-1], [8.0, 9.0, 10.0, 50.0, 100.0]) == 8  # any order
    # A power law (E = k^-1/2: no clusters) is the chord itself: a tie, the smaller k.
    assert elbow(ks, [k**-0.5 for k in ks]) == 2
    assert elbow(ks, [100.0, 99.0, 98.0, 1.0, 0.5]) == 16
    # Scale-free: the same curve times any factor has the same elbow.
    assert elbow(ks, [1e-6, 5e-7, 1e-7, 9e-8, 8e-8]) == 8
    # By hand: x = 0, 1/4, 1/2, 3/4, 1; y = ln(E / 8) / ln(12.5) = 1, 0.798, 0.160, 0.047, 0;
    # below the chord (1 - x - y): 0, -0.048, 0.340, 0.203, 0: k = 8.
    assert elbow(ks, [100.0, 60.0, 12.0, 9.0, 8.0]) == 8
    assert elbow([2, 4], [10.0, 1.0]) is None  # fewer than 3 ks
    assert elbow(ks, [1.0, 2.0, 3.0, 4.0, 5.0]) is None  # no fall
    assert elbow(ks, [1.0, np.nan, 3.0, 4.0, 0.5]) is None
    assert elbow(ks, [1.0, 0.5, 0.25, 0.0, 0.0]) is None  # not positive
    assert "ln k and ln E" in ELBOW_RULE


@pytest.mark.parametrize(("true_k", "ks"), [(6, list(range(2, 13))), (8, [2, 4, 8, 16, 32])])
def test_the_sweep_on_blobs_with_a_known_k_recommends_it(true_k: int, ks: list[int]) -> None:
    X = blobs(6000, 8, true_k, seed=true_k, separation=12.0)
    result = sweep(X, ks, random_state=1, n_threads=1)
    assert result.recommended_k == true_k
    assert [p.k for p in result.points] == sorted(ks)
    assert (result.n_train, result.n_heldout, result.n_silhouette) == (4800, 1200, 1200)
    energies = [p.heldout_energy for p in result.points]
    assert energies[0] > energies[-1]
    best = max(result.points, key=lambda p: p.silhouette or -1.0)
    assert best.k == true_k  # on separated blobs the silhouette agrees
    again = sweep(X, ks, random_state=1, n_threads=1)
    assert [p.heldout_energy for p in again.points] == energies  # reproducible
    doc = result.to_dict()
    assert doc["points"][0]["k"] == min(ks) and doc["rule"] == ELBOW_RULE


def test_the_held_out_energy_is_measured_on_rows_the_fit_did_not_see() -> None:
    X = blobs(1000, 3, 3, seed=2)
    result = sweep(X, [3], holdout=0.5, silhouette_rows=100, random_state=4, n_threads=1)
    assert (result.n_train, result.n_heldout, result.n_silhouette) == (500, 500, 100)
    with pytest.raises(ValueError, match="every k"):
        sweep(X, [501], holdout=0.5)
    with pytest.raises(ValueError, match="holdout"):
        sweep(X, [3], holdout=1.0)
    with pytest.raises(ValueError, match="no row held out"):
        sweep(X[:2], [1])


def test_the_uniform_sample_is_bounded_in_arrival_order_and_uniform() -> None:
    X = np.arange(100, dtype=np.float32).reshape(50, 2)
    sample = UniformSample(10, rng=0)
    for start in range(0, 50, 7):
        sample.offer(X[start : start + 7])
    rows = sample.rows()
    assert rows.shape == (10, 2) and sample.seen == 50
    assert np.all(np.diff(rows[:, 0]) > 0)  # arrival order
    assert set(rows[:, 0].tolist()) <= set(X[:, 0].tolist())
    small = UniformSample(10, rng=0)
    small.offer(X[:4])
    np.testing.assert_array_equal(small.rows(), X[:4])
    # Each of 50 rows is kept with probability 10/50: counts over 4,000 draws.
    counts = np.zeros(50)
    for seed in range(4000):
        s = UniformSample(10, rng=seed)
        for start in range(0, 50, 7):
            s.offer(X[start : start + 7])
        counts[(s.rows()[:, 0] / 2).astype(int)] += 1
    expected = 4000 * 10 / 50
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 90.0, chi2  # 49 degrees of freedom: p < 1e-3 beyond 85


def test_given_centroids_are_checked_and_made_unit_under_cosine() -> None:
    from nmbatch.engine.metric import ZeroRowError
    from nmbatch.engine.seeding.given import GivenCentroidsError, given_centroids

    C = given_centroids([[3, 4], [0, 2]], 2, 2, "cosine")
    assert C.dtype == np.float32 and C.flags.c_contiguous
    np.testing.assert_allclose(C, [[0.6, 0.8], [0.0, 1.0]], rtol=1e-7)
    np.testing.assert_array_equal(given_centroids(C, 2, None, "euclidean"), C)
    for bad, what in (([[1.0, 2.0]], "shape"), ([[1.0], [2.0]], "shape"), ([1.0, 2.0], "shape"),
                      ([[1.0, 2.0], [3.0]], "shape"), ([[np.inf, 0.0], [0.0, 1.0]], "values"),
                      ([["a", "b"], ["c", "d"]], "values")):  # fmt: skip
        with pytest.raises(GivenCentroidsError) as refused:
            given_centroids(bad, 2, 2, "euclidean")
        assert refused.value.what == what, (bad, str(refused.value))
    with pytest.raises(ZeroRowError) as zero:
        given_centroids([[1.0, 0.0], [0.0, 0.0]], 2, 2, "cosine")
    assert zero.value.row == 1


def test_the_uniform_sample_of_a_long_stream_copies_few_rows() -> None:
    sample = UniformSample(100, rng=1)
    X = np.arange(200_000, dtype=np.float32).reshape(-1, 1)
    for start in range(0, X.shape[0], 1000):
        sample.offer(X[start : start + 1000])
    rows = sample.rows()[:, 0]
    assert rows.shape == (100,) and np.all(np.diff(rows) > 0)
    # Uniform over the stream: about as many from each half.
    assert 30 <= int((rows < 100_000).sum()) <= 70
