"""Tests of ``engine.estimator.NestedMiniBatchKMeans``: scikit-learn's contract and the math.

The estimator is a scikit-learn ``BaseEstimator``: its estimator checks run here, while a
subprocess test proves the engine package and the service never import scikit-learn.
"""

from __future__ import annotations

import doctest
import pickle
import subprocess
import sys

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from sklearn.base import ClusterMixin, TransformerMixin, clone
from sklearn.exceptions import NotFittedError
from sklearn.utils import get_tags
from sklearn.utils._param_validation import InvalidParameterError
from sklearn.utils.estimator_checks import parametrize_with_checks

import nmbatch.engine.estimator as estimator_module
from nmbatch.engine import (
    ALGORITHMS,
    IterationStats,
    ModelState,
    NestedMiniBatchKMeans,
    RayBackend,
)
from tests.testkit import blobs_around

EXACT = ("nmbatch", "nmbatch.deact", "lloyd", "elkan")  # converge to a Lloyd fixed point


def ignore_iteration(stats: IterationStats, state: ModelState) -> None:
    """A callback that lets the fit run (module level, so the estimator still pickles)."""


# One default estimator, one with a tiny first batch (so the batch doubles during the
# checks) and a callback, the same under metric="cosine", and one per algorithm.
CHECKED = [
    NestedMiniBatchKMeans(),
    NestedMiniBatchKMeans(
        n_clusters=3, batch_size=20, rho=10.0, random_state=0, callback=ignore_iteration
    ),
    NestedMiniBatchKMeans(
        n_clusters=3, batch_size=20, rho=10.0, random_state=0, metric="cosine"
    ),
    *(
        NestedMiniBatchKMeans(n_clusters=3, batch_size=20, random_state=0, algorithm=name)
        for name in ALGORITHMS
        if name != "nmbatch"
    ),
]


THREE_MEANS = np.array([[0.0, 0.0], [0.0, 10.0], [10.0, 10.0]])


def three_blobs(n_per: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three separated 2-D blobs, shuffled: X ``(3 n_per, 2)`` float32, blob ids ``(3 n_per,)``."""
    return blobs_around(seed, THREE_MEANS, n_per, sigma=0.5)


def blob_to_label(labels: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The label each blob got; asserts each blob is one cluster and clusters differ."""
    mapping = np.array([labels[y == i][0] for i in range(3)])
    for i in range(3):
        assert np.all(labels[y == i] == mapping[i])
    assert len(set(mapping.tolist())) == 3
    return mapping


def fitted_state(est: NestedMiniBatchKMeans) -> dict[str, object]:
    return {
        "cluster_centers_": est.cluster_centers_.copy(),
        "labels_": est.labels_.copy(),
        "inertia_": est.inertia_,
        "n_iter_": est.n_iter_,
        "batch_size_": est.batch_size_,
        "n_samples_seen_": est.n_samples_seen_,
        "n_features_in_": est.n_features_in_,
    }


def assert_same_state(est: NestedMiniBatchKMeans, before: dict[str, object]) -> None:
    after = fitted_state(est)
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert_array_equal(after[name], value, err_msg=name)


# -- scikit-learn's estimator checks ---------------------------------------------------
def _expected_failures(estimator: NestedMiniBatchKMeans) -> dict[str, str]:
    """The checks an estimator fails by design: under cosine, the dtype check's integer
    copies of ``3 * uniform`` data hold all-zero rows, which have no direction and are
    refused (``tests/test_cosine.py`` fits every one of its dtypes without them).

    The sample-weight equivalence check fits integer weights and the repeated rows from
    the same ``random_state``: the two stores hold different rows, so their shuffles and
    seedings differ and so may the local optima (scikit-learn's own ``KMeans`` and
    ``BisectingKMeans`` expect the same failure). ``tests/test_weights.py`` asserts the
    equivalence with a fixed ``init`` and the full batch, where it holds exactly."""
    out = {
        "check_sample_weight_equivalence_on_dense_data": (
            "random seeding and shuffle differ between weighted and repeated rows "
            "(as KMeans); exact with a fixed init in tests/test_weights.py"
        ),
    }
    if estimator.metric == "cosine":
        out["check_estimators_dtypes"] = "integer data with a zero row: refused by cosine"
    return out


_sklearn_checks = parametrize_with_checks(CHECKED, expected_failed_checks=_expected_failures)


@pytest.mark.filterwarnings("ignore::UserWarning")
@_sklearn_checks
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_clustering_checks_are_among_the_estimator_checks():
    """As a ``ClusterMixin``, every estimator gets scikit-learn's clustering checks (on
    a read-only memmap too) and the partial_fit feature-count check."""
    est = NestedMiniBatchKMeans()
    assert isinstance(est, ClusterMixin) and isinstance(est, TransformerMixin)
    # An expected failure comes as a pytest.param: its values are (estimator, check).
    params = [getattr(p, "values", p) for p in _sklearn_checks.mark.args[1]]
    estimators, checks = zip(*params, strict=True)
    for each in CHECKED:
        names = [
            getattr(check, "func", check).__name__
            for estimator, check in zip(estimators, checks, strict=True)
            if estimator is each
        ]
        assert names.count("check_clustering") == 2, names
        assert "check_estimators_partial_fit_n_features" in names
        assert "check_clusterer_compute_labels_predict" in names


def test_tags_describe_an_unsupervised_clusterer():
    tags = get_tags(NestedMiniBatchKMeans())
    assert tags.estimator_type == "clusterer"
    assert not tags.target_tags.required
    assert not tags.input_tags.sparse and not tags.input_tags.allow_nan


def test_engine_package_and_service_do_not_import_sklearn():
    """scikit-learn is the estimator's: ``nmbatch.engine`` loads the estimator on first
    use, and the service never does."""
    code = (
        "import sys\n"
        "import nmbatch, nmbatch.engine, nmbatch.service.main\n"
        "from nmbatch.engine import RayBackend\n"
        "RayBackend(n_shards=3)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn')\n"
        "assert not loaded, loaded\n"
        "assert 'nmbatch.engine.estimator' not in sys.modules\n"
        "from nmbatch.engine import NestedMiniBatchKMeans\n"
        "assert 'sklearn.base' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_module_docstring_example_runs():
    result = doctest.testmod(estimator_module)
    assert result.attempted > 0
    assert result.failed == 0


# -- parameters ------------------------------------------------------------------------
def test_get_params_set_params_and_repr():
    est = NestedMiniBatchKMeans(n_clusters=3, random_state=7)
    assert est.get_params() == {
        "algorithm": "nmbatch",
        "backend": "local",
        "batch_size": 5000,
        "bounds": "auto",
        "callback": None,
        "catch_up": "auto",
        "init": "auto",
        "max_age_seconds": None,
        "max_iter": 300,
        "max_samples": None,
        "metric": "euclidean",
        "n_clusters": 3,
        "n_threads": None,
        "random_state": 7,
        "relocate_empty": True,
        "swap_clusters": "auto",
        "retention": "all",
        "rho": 100.0,
    }
    assert repr(est) == "NestedMiniBatchKMeans(n_clusters=3, random_state=7)"
    assert repr(NestedMiniBatchKMeans()) == "NestedMiniBatchKMeans()"
    assert est.set_params(rho=10.0, algorithm="lloyd") is est
    assert (est.rho, est.algorithm) == (10.0, "lloyd")
    with pytest.raises(ValueError, match="Invalid parameter 'bogus'"):
        est.set_params(bogus=1)


def test_backend_is_one_parameter_holding_the_ray_settings():
    ray = RayBackend(address="auto", n_shards=3)
    est = NestedMiniBatchKMeans(n_clusters=3, backend=ray)
    assert est.get_params()["backend"] is ray
    assert repr(est) == (
        "NestedMiniBatchKMeans(backend=RayBackend(address='auto', n_shards=3),\n"
        "                      n_clusters=3)"
    )
    assert clone(est).get_params()["backend"] == ray
    assert RayBackend() == RayBackend(address=None, n_shards=2)
    with pytest.raises(AttributeError):
        ray.n_shards = 4  # frozen: a parameter value, not state
    for bad in ({"n_shards": 0}, {"n_shards": 2.0}, {"n_shards": True}, {"address": 6379}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RayBackend(**bad)
    X = np.zeros((10, 2))
    for backend in ("dask", RayBackend, {"n_shards": 2}):
        with pytest.raises(InvalidParameterError, match="'backend' parameter"):
            NestedMiniBatchKMeans(n_clusters=2, backend=backend).fit(X)
    for backend in ("ray", RayBackend(n_shards=4)):
        with pytest.raises(ValueError, match="backend='ray' runs algorithm='nmbatch'"):
            NestedMiniBatchKMeans(n_clusters=2, backend=backend, algorithm="lloyd").fit(X)
    local = NestedMiniBatchKMeans(n_clusters=2, random_state=0, backend=None).fit(X + 1)
    assert local.n_samples_seen_ == 10  # None is the local backend


def test_clone_copies_parameters_not_fit():
    X, _ = three_blobs(50)
    est = NestedMiniBatchKMeans(n_clusters=3, batch_size=30, random_state=1).fit(X)
    copy = clone(est)
    assert copy.get_params() == est.get_params()
    assert not hasattr(copy, "cluster_centers_")


def test_callback_is_a_parameter_that_clone_keeps():
    est = NestedMiniBatchKMeans(n_clusters=3, callback=ignore_iteration)
    assert est.get_params()["callback"] is ignore_iteration
    assert clone(est).get_params()["callback"] is ignore_iteration
    assert "callback=<function ignore_iteration" in repr(est)
    assert est.set_params(callback=None).callback is None


# -- the per-iteration callback --------------------------------------------------------
class Recorder:
    """A callback that keeps its arguments (and a copy of the centroids) of every call.

    It returns ``answer`` at iteration ``stop_at`` and None at the others.
    """

    def __init__(self, stop_at: int | None = None, answer: object = True) -> None:
        self.stop_at, self.answer = stop_at, answer
        self.calls: list[tuple[IterationStats, ModelState, np.ndarray]] = []

    def __call__(self, stats: IterationStats, state: ModelState) -> object:
        self.calls.append((stats, state, state.centroids.copy()))
        return self.answer if stats.iteration == self.stop_at else None


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_callback_sees_every_iteration_of_fit_and_changes_nothing(algorithm):
    X, _ = three_blobs(100, seed=4)
    params = {"n_clusters": 3, "batch_size": 40, "max_iter": 30, "random_state": 0}
    plain = NestedMiniBatchKMeans(**params, algorithm=algorithm).fit(X)
    recorder = Recorder()
    est = NestedMiniBatchKMeans(**params, algorithm=algorithm, callback=recorder).fit(X)
    assert_array_equal(est.cluster_centers_, plain.cluster_centers_)
    assert est.n_iter_ == plain.n_iter_
    assert [stats.iteration for stats, _, _ in recorder.calls] == list(range(1, est.n_iter_ + 1))
    for stats, state, centroids in recorder.calls:
        assert isinstance(stats, IterationStats) and isinstance(state, ModelState)
        assert state.stats is stats
        assert (state.iteration, state.n_samples) == (stats.iteration, len(X))
        assert state.converged == stats.converged
        assert centroids.shape == (3, 2) and centroids.dtype == np.float32
        assert state.energy is not None and state.energy >= 0.0
        if algorithm in EXACT:  # the batch is the prefix; each of its samples votes once
            assert state.batch_size == stats.batch_size == int(state.counts.sum())
    last_stats, _, last_centroids = recorder.calls[-1]
    assert_array_equal(last_centroids, est.cluster_centers_)
    assert last_stats.batch_size == est.batch_size_


def test_callback_returning_true_stops_fit_after_that_iteration():
    X, _ = three_blobs(200, seed=5)
    params = {"n_clusters": 3, "batch_size": 16, "rho": 1000.0, "random_state": 0}
    assert NestedMiniBatchKMeans(**params).fit(X).n_iter_ > 3
    recorder = Recorder(stop_at=3)
    est = NestedMiniBatchKMeans(**params, callback=recorder).fit(X)
    assert est.n_iter_ == 3 and len(recorder.calls) == 3
    assert not recorder.calls[-1][0].converged
    assert_array_equal(est.cluster_centers_, recorder.calls[-1][2])
    assert_array_equal(est.labels_, est.predict(X))
    # The same model as a fit that ran out of iterations there.
    at_max_iter = NestedMiniBatchKMeans(**params, max_iter=3).fit(X)
    assert_same_state(est, fitted_state(at_max_iter))


@pytest.mark.parametrize("answer", [False, 1, "stop", [True]], ids=repr)
def test_callback_values_other_than_true_do_not_stop(answer):
    X, _ = three_blobs(100, seed=6)
    params = {"n_clusters": 3, "batch_size": 16, "random_state": 0}
    plain = NestedMiniBatchKMeans(**params).fit(X)
    est = NestedMiniBatchKMeans(**params, callback=Recorder(stop_at=1, answer=answer)).fit(X)
    assert est.n_iter_ == plain.n_iter_ > 1
    assert_array_equal(est.cluster_centers_, plain.cluster_centers_)


def test_callback_runs_once_per_partial_fit_after_the_attributes_are_set():
    X, _ = three_blobs(50)
    seen = []

    def stop_every_time(stats: IterationStats, state: ModelState) -> bool:
        seen.append((stats.iteration, est.n_iter_, state.n_samples, est.n_samples_seen_))
        return True

    est = NestedMiniBatchKMeans(n_clusters=3, batch_size=20, callback=stop_every_time)
    est.partial_fit(X[:2])  # fewer than n_clusters samples: stored, no iteration
    assert seen == []
    est.partial_fit(X[2:40]).partial_fit(X[40:80])
    assert seen == [(1, 1, 40, 40), (2, 2, 80, 80)]


def test_callback_exception_propagates_and_fit_leaves_the_estimator_as_it_was():
    X, _ = three_blobs(60)
    est = NestedMiniBatchKMeans(n_clusters=3, batch_size=40, random_state=0).fit(X)
    before = fitted_state(est)

    def fail(stats: IterationStats, state: ModelState) -> None:
        raise RuntimeError(f"stopped at {stats.iteration}")

    with pytest.raises(RuntimeError, match="stopped at 1"):
        est.set_params(callback=fail, random_state=1).fit(X[:90])
    assert_same_state(est, before)
    est.set_params(callback=None).partial_fit(X[:5])
    assert est.n_samples_seen_ == len(X) + 5


# -- the fit ---------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", EXACT)
def test_exact_algorithms_recover_the_blob_means(algorithm):
    X, y = three_blobs()
    est = NestedMiniBatchKMeans(n_clusters=3, batch_size=64, random_state=0, algorithm=algorithm)
    est.fit(X)
    mapping = blob_to_label(est.labels_, y)
    for i in range(3):
        mean = X[y == i].astype(np.float64).mean(axis=0)
        assert_allclose(est.cluster_centers_[mapping[i]], mean, rtol=0, atol=1e-5)
    # Converged: the batch is the whole data set, before max_iter.
    assert est.batch_size_ == len(X)
    assert est.n_iter_ < est.max_iter
    assert est.n_samples_seen_ == len(X)
    assert est.n_features_in_ == 2


@pytest.mark.parametrize("algorithm", ["mbatch", "mbatch.remove"])
def test_minibatch_algorithms_land_near_the_blob_means(algorithm):
    X, y = three_blobs()
    est = NestedMiniBatchKMeans(
        n_clusters=3, batch_size=64, max_iter=50, random_state=0, algorithm=algorithm
    ).fit(X)
    mapping = blob_to_label(est.labels_, y)
    for i in range(3):
        assert_allclose(est.cluster_centers_[mapping[i]], X[y == i].mean(axis=0), atol=0.2)
    assert est.n_iter_ == 50  # mini-batch k-means never declares convergence


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_labels_inertia_transform_and_score_agree_with_brute_force(algorithm):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((120, 4)).astype(np.float32)
    est = NestedMiniBatchKMeans(
        n_clusters=5, batch_size=32, max_iter=20, random_state=0, algorithm=algorithm
    ).fit(X)
    C = est.cluster_centers_.astype(np.float64)
    D2 = ((X.astype(np.float64)[:, None, :] - C[None]) ** 2).sum(axis=2)
    assert est.cluster_centers_.shape == (5, 4) and est.cluster_centers_.dtype == np.float32
    assert_array_equal(est.labels_, D2.argmin(axis=1))
    assert_array_equal(est.labels_, est.predict(X))
    assert_allclose(est.inertia_, D2.min(axis=1).sum(), rtol=1e-10)
    assert_allclose(est.score(X), -est.inertia_, rtol=1e-12)
    T = est.transform(X)
    assert T.dtype == np.float64
    assert_allclose(T, np.sqrt(D2), rtol=1e-12)
    assert_array_equal(est.labels_, T.argmin(axis=1))


def test_fit_predict_and_fit_transform_match_fit_then_method():
    X, _ = three_blobs(60)
    params = {"n_clusters": 3, "batch_size": 40, "random_state": 5}
    est = NestedMiniBatchKMeans(**params).fit(X)
    assert_array_equal(NestedMiniBatchKMeans(**params).fit_predict(X), est.labels_)
    assert_array_equal(NestedMiniBatchKMeans(**params).fit_transform(X), est.transform(X))


@pytest.mark.parametrize(
    "make_state",
    [lambda: 42, lambda: np.random.RandomState(42), lambda: np.random.default_rng(42)],
    ids=["int", "RandomState", "Generator"],
)
def test_same_random_state_gives_identical_fits(make_state):
    X, _ = three_blobs(300, seed=1)
    fits = [
        NestedMiniBatchKMeans(n_clusters=6, batch_size=50, random_state=make_state()).fit(X)
        for _ in range(2)
    ]
    assert_array_equal(fits[0].cluster_centers_, fits[1].cluster_centers_)
    assert_array_equal(fits[0].labels_, fits[1].labels_)
    assert fits[0].n_iter_ == fits[1].n_iter_


def test_random_state_none_fits():
    X, y = three_blobs(100)
    est = NestedMiniBatchKMeans(n_clusters=3, batch_size=50).fit(X)
    blob_to_label(est.labels_, y)


def test_init_first_and_explicit_array():
    X, y = three_blobs(100)
    means = np.array([X[y == i].mean(axis=0) for i in range(3)])
    est = NestedMiniBatchKMeans(n_clusters=3, init=means, algorithm="lloyd").fit(X)
    assert_array_equal(blob_to_label(est.labels_, y), [0, 1, 2])
    assert_allclose(est.cluster_centers_, means, atol=1e-5)
    first = NestedMiniBatchKMeans(n_clusters=3, init="first", batch_size=30, random_state=0)
    assert first.fit(X).cluster_centers_.shape == (3, 2)


# -- input handling --------------------------------------------------------------------
def test_input_dtype_and_memory_order_do_not_change_the_result():
    rng = np.random.default_rng(4)
    X_uint8 = rng.integers(0, 256, size=(300, 3)).astype(np.uint8)  # exact in float32
    reference = NestedMiniBatchKMeans(n_clusters=4, batch_size=64, random_state=0)
    reference.fit(X_uint8.astype(np.float32))
    variants = {
        "uint8": X_uint8,
        "int64": X_uint8.astype(np.int64),
        "float64": X_uint8.astype(np.float64),
        "float32 Fortran": np.asfortranarray(X_uint8.astype(np.float32)),
        "float64 Fortran": np.asfortranarray(X_uint8.astype(np.float64)),
        "list": X_uint8.tolist(),
    }
    for name, X in variants.items():
        est = NestedMiniBatchKMeans(n_clusters=4, batch_size=64, random_state=0).fit(X)
        assert_array_equal(est.cluster_centers_, reference.cluster_centers_, err_msg=name)
        assert_array_equal(est.labels_, reference.labels_, err_msg=name)
        assert_array_equal(est.predict(X), reference.labels_, err_msg=name)
        assert est.inertia_ == reference.inertia_, name


def test_prediction_methods_fail_before_fit():
    est = NestedMiniBatchKMeans(n_clusters=2)
    X = np.zeros((3, 2))
    for method in (est.predict, est.transform, est.score):
        with pytest.raises(NotFittedError):
            method(X)


X_GOOD, _ = three_blobs(40)
BAD_CALLS = {
    "fit NaN": ("fit", np.where(np.eye(120, 2) > 0, np.nan, X_GOOD), {}),
    "fit inf": ("fit", np.where(np.eye(120, 2) > 0, np.inf, X_GOOD), {}),
    "fit overflows float32": ("fit", np.full((10, 2), 1e300), {}),
    "fit empty": ("fit", np.empty((0, 2)), {}),
    "fit no features": ("fit", np.empty((10, 0)), {}),
    "fit 1-D": ("fit", np.arange(10.0), {}),
    "fit 3-D": ("fit", np.zeros((4, 3, 2)), {}),
    "fit complex": ("fit", np.ones((10, 2), dtype=complex), {}),
    "fit strings": ("fit", np.array([["a", "b"]] * 10), {}),
    "fit ragged": ("fit", [[1.0, 2.0], [3.0]], {}),
    "fit k > n": ("fit", X_GOOD[:5], {"n_clusters": 6}),
    "fit init shape": ("fit", X_GOOD, {"init": np.zeros((2, 2))}),
    "fit init features": ("fit", X_GOOD, {"init": np.zeros((3, 5))}),
    "fit init NaN": ("fit", X_GOOD, {"init": np.full((3, 2), np.nan)}),
    "fit init name": ("fit", X_GOOD, {"init": "bogus"}),
    "fit algorithm": ("fit", X_GOOD, {"algorithm": "kmeans"}),
    "fit n_clusters 0": ("fit", X_GOOD, {"n_clusters": 0}),
    "fit n_clusters float": ("fit", X_GOOD, {"n_clusters": 3.0}),
    "fit rho 0": ("fit", X_GOOD, {"rho": 0.0}),
    "fit rho inf": ("fit", X_GOOD, {"rho": np.inf}),
    "fit batch_size 0": ("fit", X_GOOD, {"batch_size": 0}),
    "fit max_iter 0": ("fit", X_GOOD, {"max_iter": 0}),
    "fit random_state negative": ("fit", X_GOOD, {"random_state": -1}),
    "fit random_state str": ("fit", X_GOOD, {"random_state": "seed"}),
    "fit callback not callable": ("fit", X_GOOD, {"callback": "print"}),
    "partial_fit callback not callable": ("partial_fit", X_GOOD[:5], {"callback": 1}),
    "partial_fit wrong d": ("partial_fit", np.zeros((5, 3)), {}),
    "partial_fit NaN": ("partial_fit", np.full((5, 2), np.nan), {}),
    "partial_fit empty": ("partial_fit", np.empty((0, 2)), {}),
    "partial_fit k changed": ("partial_fit", X_GOOD, {"n_clusters": 4}),
    "predict wrong d": ("predict", np.zeros((5, 3)), {}),
    "predict inf": ("predict", np.full((5, 2), np.inf), {}),
    "transform wrong d": ("transform", np.zeros((5, 1)), {}),
    "score NaN": ("score", np.full((5, 2), np.nan), {}),
}


@pytest.mark.parametrize("case", BAD_CALLS, ids=str)
def test_value_error_leaves_the_fitted_state_unchanged(case):
    method, X, params = BAD_CALLS[case]
    est = NestedMiniBatchKMeans(n_clusters=3, batch_size=40, random_state=0).fit(X_GOOD)
    before = fitted_state(est)
    est.set_params(**params)
    with pytest.raises(ValueError):
        getattr(est, method)(X)
    assert_same_state(est, before)
    # Nothing reached the store: the next good chunk adds exactly its own samples.
    est.set_params(**NestedMiniBatchKMeans(n_clusters=3, batch_size=40).get_params())
    est.partial_fit(X_GOOD[:7])
    assert est.n_samples_seen_ == len(X_GOOD) + 7


def test_object_dtype_is_numeric_if_possible_and_sparse_is_refused():
    X, _ = three_blobs(30)
    est = NestedMiniBatchKMeans(n_clusters=3, random_state=0)
    assert_array_equal(
        est.fit(X.astype(object)).cluster_centers_, clone(est).fit(X).cluster_centers_
    )
    bad = X.astype(object)
    bad[0, 0] = {"a": 1}
    with pytest.raises(TypeError):
        est.fit(bad)
    sparse = pytest.importorskip("scipy.sparse")
    with pytest.raises(TypeError, match=r"[Ss]parse"):
        est.fit(sparse.csr_array(X))


# -- edge cases ------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_cluster_is_the_mean(algorithm):
    X, _ = three_blobs(50)
    est = NestedMiniBatchKMeans(n_clusters=1, random_state=0, algorithm=algorithm).fit(X)
    atol = 1e-5 if algorithm in EXACT else 0.5
    assert_allclose(est.cluster_centers_[0], X.astype(np.float64).mean(axis=0), atol=atol)
    assert_array_equal(est.labels_, np.zeros(len(X)))


@pytest.mark.parametrize("algorithm", EXACT)
def test_as_many_clusters_as_distinct_samples(algorithm):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((12, 3)).astype(np.float32)
    est = NestedMiniBatchKMeans(n_clusters=12, batch_size=4, random_state=0, algorithm=algorithm)
    est.fit(X)
    assert est.inertia_ == 0.0
    assert_array_equal(np.sort(est.labels_), np.arange(12))
    assert_array_equal(est.cluster_centers_[est.labels_], X)


def test_duplicate_points_give_zero_inertia():
    values = np.array([[0.0, 1.0], [2.0, 2.0], [-3.0, 5.0]], dtype=np.float32)
    X = np.repeat(values, [10, 20, 30], axis=0)
    # The first batch is the whole data set, so k-means++ sees all three values.
    est = NestedMiniBatchKMeans(n_clusters=3, random_state=0).fit(X)
    assert est.inertia_ == 0.0
    assert_array_equal(est.cluster_centers_[est.labels_], X)


def test_identical_points_with_more_clusters_than_distinct_values():
    X = np.full((10, 2), 3.5)
    est = NestedMiniBatchKMeans(n_clusters=3, random_state=0).fit(X)
    assert est.inertia_ == 0.0
    assert_array_equal(est.labels_, np.zeros(10))  # ties go to the lowest index
    assert_array_equal(est.cluster_centers_, np.full((3, 2), 3.5))
    assert_array_equal(est.predict([[0.0, 0.0]]), [0])


def test_one_feature():
    X = np.concatenate([np.zeros(20), np.full(30, 7.0)])[:, None] + np.tile([0.0, 0.5], 25)[:, None]
    est = NestedMiniBatchKMeans(n_clusters=2, batch_size=10, random_state=0).fit(X)
    assert_allclose(np.sort(est.cluster_centers_[:, 0]), [0.25, 7.25], atol=1e-6)
    assert est.transform(X).shape == (50, 2)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (2, 1), (2, 2), (3, 2)])
def test_tiny_inputs(n, k):
    X = np.arange(2.0 * n).reshape(n, 2)
    est = NestedMiniBatchKMeans(n_clusters=k, random_state=0).fit(X)
    assert est.labels_.shape == (n,)
    assert_array_equal(est.labels_, est.predict(X))
    assert est.n_samples_seen_ == n


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_batch_size_smaller_than_n_clusters(algorithm):
    X, _ = three_blobs(50)
    est = NestedMiniBatchKMeans(
        n_clusters=3, batch_size=2, max_iter=30, random_state=0, algorithm=algorithm
    ).fit(X)
    assert est.cluster_centers_.shape == (3, 2)
    assert_array_equal(est.labels_, est.predict(X))


# -- partial_fit -----------------------------------------------------------------------
def test_partial_fit_over_chunks_ends_near_fit():
    X, y = three_blobs(1000, seed=2)
    full = NestedMiniBatchKMeans(n_clusters=3, batch_size=100, random_state=0).fit(X)
    stream = NestedMiniBatchKMeans(n_clusters=3, batch_size=100, random_state=0)
    chunks = np.array_split(X, 10)
    for chunk in chunks:
        stream.partial_fit(chunk)
    assert stream.n_samples_seen_ == len(X)
    assert stream.n_iter_ == len(chunks)
    assert_array_equal(stream.labels_, stream.predict(chunks[-1]))
    mapping_full = blob_to_label(full.labels_, y)
    mapping_stream = blob_to_label(stream.predict(X), y)
    assert_allclose(
        stream.cluster_centers_[mapping_stream], full.cluster_centers_[mapping_full], atol=0.1
    )


def test_partial_fit_waits_for_n_clusters_samples():
    X, _ = three_blobs(20)
    est = NestedMiniBatchKMeans(n_clusters=5, random_state=0)
    est.partial_fit(X[:2]).partial_fit(X[2:4])
    assert est.n_samples_seen_ == 4
    assert est.n_features_in_ == 2
    with pytest.raises(NotFittedError):
        est.predict(X)
    est.partial_fit(X[4:9])
    assert est.n_iter_ == 1
    assert est.cluster_centers_.shape == (5, 2)
    assert_array_equal(est.labels_, est.predict(X[4:9]))


def test_partial_fit_continues_a_fit():
    X, _ = three_blobs(100)
    est = NestedMiniBatchKMeans(n_clusters=3, batch_size=64, random_state=0).fit(X)
    n_iter = est.n_iter_
    est.partial_fit(X[:10])
    assert est.n_samples_seen_ == len(X) + 10
    assert est.n_iter_ == n_iter + 1
    with pytest.raises(ValueError, match="changed"):
        est.set_params(algorithm="lloyd").partial_fit(X[:10])
    assert est.fit(X).n_samples_seen_ == len(X)  # fit starts a new model


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_pickle_round_trip_predicts_the_same_and_resumes(algorithm):
    X, _ = three_blobs(100)
    est = NestedMiniBatchKMeans(
        n_clusters=3, batch_size=64, max_iter=20, random_state=0, algorithm=algorithm
    ).fit(X)
    loaded = pickle.loads(pickle.dumps(est))
    assert_array_equal(loaded.cluster_centers_, est.cluster_centers_)
    assert_array_equal(loaded.predict(X), est.predict(X))
    assert_array_equal(loaded.transform(X), est.transform(X))
    loaded.partial_fit(X[:30])
    assert loaded.n_samples_seen_ == len(X) + 30
    assert loaded.n_iter_ == est.n_iter_ + 1
    assert_allclose(loaded.cluster_centers_, est.cluster_centers_, atol=0.5)


def test_relocate_empty_is_a_checked_parameter_that_reaches_the_algorithm():
    X = np.concatenate([np.zeros((50, 2)), np.ones((50, 2)) * 10]).astype(np.float32)
    X += np.random.default_rng(0).normal(size=X.shape).astype(np.float32)
    init = np.array([[0.0, 0.0], [10.0, 10.0], [500.0, 500.0]], dtype=np.float32)
    kept = NestedMiniBatchKMeans(3, init=init, relocate_empty=False, random_state=0).fit(X)
    np.testing.assert_array_equal(kept.cluster_centers_[2], init[2])  # dead, where it was
    moved = NestedMiniBatchKMeans(3, init=init, random_state=0).fit(X)
    assert np.bincount(moved.labels_, minlength=3).min() > 0  # the far centroid took a sample
    with pytest.raises(ValueError, match=r"'relocate_empty' parameter .* instance of 'bool'"):
        NestedMiniBatchKMeans(3, relocate_empty="yes").fit(X)
