"""The dense pass chunk by chunk on the BLAS pool (``engine.pooled``): the same labels,
distances, bounds, norms and sums, bit for bit, as the single-thread kernels fed by
the same chunks' products; labels on the brute-force nearest centroid; ``S``/``v`` the sums of
the rows by label; and a fit that takes it gives the centroids of one thread."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from nmbatch.engine import pooled
from nmbatch.engine.algorithms import base
from nmbatch.engine.kernels import dense, grouped_dense
from nmbatch.engine.kernels.parallel import every_parallel_path
from nmbatch.engine.products import PRODUCT_ROWS, chunk_product
from tests.engine_helpers import brute_nearest, dense_state
from tests.testkit import blobs

pytestmark = pytest.mark.skipif(
    numba.config.NUMBA_NUM_THREADS < 2, reason="numba's pool has one thread"
)

N, K, D, G = 5000, 40, 12, 6  # more than four chunks of PRODUCT_ROWS rows


@pytest.fixture
def threads():
    """Sets numba's thread count for the test; restores it after."""
    before = numba.get_num_threads()
    yield numba.set_num_threads
    numba.set_num_threads(before)


def _problem(seed: int, overflow: bool = False):
    X = blobs(N, D, K, seed=seed, separation=3.0)
    rng = np.random.default_rng(seed)
    C = X[rng.choice(N, K, replace=False)].copy()
    if overflow:  # rows whose float32 products overflow take the per-centroid formula
        X[:7] *= np.float32(3e37)
    return X, C


def _state(width: int | None, seed: int, *, assigned: bool) -> dict:
    """:func:`~tests.engine_helpers.dense_state` of N rows, K centroids."""
    return dense_state(N, K, D, width, seed, assigned=assigned)


def _copy(state: dict) -> dict:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in state.items()}


def _reference(X, rows, C, state, group_of, remove) -> int:
    """The single-thread kernel on the rows' product by chunks of ``PRODUCT_ROWS`` (the
    pool's chunks: a float32 product's rows may depend on how many rows one BLAS call
    was given, so one call over all rows need not give the same numbers)."""
    dots = np.empty((rows.shape[0], C.shape[0]), dtype=np.float32)
    Ct = np.ascontiguousarray(C.T)
    for lo in range(0, rows.shape[0], PRODUCT_ROWS):
        chunk_product(X, rows[lo : lo + PRODUCT_ROWS], Ct, dots[lo : lo + PRODUCT_ROWS])
    args = {"dots": dots, "cc": (C.astype(np.float64) ** 2).sum(1), "remove": remove, **state}
    if group_of is None:
        return dense.assign_dense(X, rows, C, **args)
    return grouped_dense.assign_dense_grouped(X, rows, C, group_of=group_of, **args)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("bounds", ["none", "full", "group"])
@pytest.mark.parametrize(("seed", "remove", "overflow", "known"), [
    (0, False, False, False), (1, True, False, False), (2, True, True, False),
    (3, True, False, True),
])  # fmt: skip
def test_pooled_pass_equals_the_single_thread_kernel(threads, bounds, seed, remove, overflow,
                                                     known):  # fmt: skip
    """``known``: the rows' norms are read from ``sqnorms``, not computed and written."""
    X, C = _problem(seed, overflow)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(N, 4 * PRODUCT_ROWS + 77, replace=False)).astype(np.int64)
    group_of = (np.arange(K) % G).astype(np.int32) if bounds == "group" else None
    width = {"none": None, "full": K, "group": G}[bounds]
    ref = _state(width, seed, assigned=remove)
    if known:
        ref["sqnorms"] = (X.astype(np.float64) ** 2).sum(1)
        ref["sqnorms_known"] = True
    got = _copy(ref)
    threads(1)
    n_ref = _reference(X, rows, C, ref, group_of, remove)
    threads(2)
    with every_parallel_path():
        assert pooled.use_pool(rows.shape[0], K, D)
        n_got = pooled.pooled_assign(X, rows, C, np.ascontiguousarray(C.T),
                                     (C.astype(np.float64) ** 2).sum(1), group_of=group_of,
                                     remove=remove, **got)  # fmt: skip
    assert n_got == n_ref
    for key, want in ref.items():
        if isinstance(want, np.ndarray):
            np.testing.assert_array_equal(got[key], want, err_msg=key)
    if not overflow:  # on the nearest centroid; the sums are those of the rows by label
        np.testing.assert_array_equal(got["labels"][rows], brute_nearest(X[rows], C)[0])
    if not remove:
        lab = got["labels"][rows]
        S = np.zeros((K, D))
        np.add.at(S, lab, X[rows].astype(np.float64))
        np.testing.assert_array_equal(got["v"], np.bincount(lab, minlength=K))
        np.testing.assert_allclose(got["S"], S, rtol=1e-12, atol=1e-6)


def test_the_pool_is_taken_only_for_large_passes_on_several_threads(threads):
    threads(1)
    assert not pooled.use_pool(100_000, 1024, 784)
    threads(2)
    assert pooled.use_pool(100_000, 1024, 108)  # 113 M multiply-adds a chunk
    assert not pooled.use_pool(PRODUCT_ROWS, 1024, 108)  # one chunk
    assert not pooled.use_pool(100_000, 50, 108)  # 5.5 M: stays on the calling thread
    with every_parallel_path():
        assert pooled.use_pool(PRODUCT_ROWS + 1, 2, 2)


def test_a_fit_through_the_pool_gives_the_centroids_of_one_thread(threads, monkeypatch):
    from nmbatch.engine import NestedBatchStore, make_algorithm

    X, _ = _problem(5)
    calls = []
    real = base.pooled_assign
    monkeypatch.setattr(base, "pooled_assign", lambda *a, **kw: calls.append(1) or real(*a, **kw))

    def fit(n: int, bounds: str) -> np.ndarray:
        threads(n)
        store = NestedBatchStore(D, seed=0, capacity=N)
        store.append(X)
        algo = make_algorithm("nmbatch", store, K, init="first", random_state=0,
                              batch_size=2 * PRODUCT_ROWS, bounds=bounds)  # fmt: skip
        with every_parallel_path():
            for _ in range(8):
                algo.step()
        return algo.centroids.copy()

    for bounds in ("full", "group"):
        one = fit(1, bounds)
        assert not calls
        two = fit(2, bounds)
        assert calls  # the pooled pass ran
        calls.clear()
        np.testing.assert_array_equal(one, two)
