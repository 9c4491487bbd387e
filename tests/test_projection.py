"""Dense passes through a subspace (``engine.projection``).

- The kernel's lower estimates are the numpy formula, and sound: never above the exact
  float64 squared distance, on data in the subspace, off it, at huge and tiny scales,
  with integer values; the distance it computes bounds the nearest one above; the
  residual norms bound the part off the span of the basis (its exact projection, QR).
- ``assign_dense`` through a subspace gives the full pass's labels, distances, upper
  bounds, norms and sums bit for bit, with lower bounds that stay sound; on one thread,
  on numba's blocks and on the BLAS pool.
- nmbatch with the projection forced on is the same run as with it off, bit for bit,
  with the invariants of ``check_step_invariants`` after every step (euclidean, cosine,
  weighted); the estimator's fit is the same with one and two threads.
- ``nearest`` through a fitted model's subspace (its ``labels_``): the same labels and
  float64 distances.
- ``fit_projection`` prices: none below ``MIN_CENTROIDS``, none where no subspace helps
  (isotropic data), a small ``p`` for data near a subspace.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from nmbatch.engine import NestedMiniBatchKMeans, make_algorithm, nearest, projection
from nmbatch.engine.kernels import assign_dense, sqdist32_error
from nmbatch.engine.kernels.common import F64_ULP, bound_factors, projected_estimates
from nmbatch.engine.pooled import pooled_assign
from nmbatch.engine.products import PRODUCT_ROWS
from nmbatch.engine.projection import Projection, Subspace, fit_projection, projected_products
from tests.engine_helpers import dense_state, filled_store, lockstep, sqdist64_ref


def near_subspace(n: int, d: int, rank: int, *, seed: int, noise: float = 0.05,
                  scale: float = 1.0, integer: bool = False) -> np.ndarray:  # fmt: skip
    """``n`` rows ``(n, d)`` float32 in clusters of a random ``rank``-dimensional
    subspace, plus isotropic ``noise``, times ``scale`` (rounded when ``integer``)."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(d, rank)))[0]
    centres = rng.normal(size=(max(2, n // 40), rank)) * 6.0
    Z = centres[rng.integers(0, centres.shape[0], n)] + rng.normal(size=(n, rank))
    X = (Z @ basis.T + noise * rng.normal(size=(n, d))) * scale
    return (np.round(X) if integer else X).astype(np.float32)


def forced(C: np.ndarray, X: np.ndarray) -> Projection:
    proj = fit_projection(C, X[:256], force=True)
    assert proj is not None
    return proj


def estimates(proj: Projection, X: np.ndarray, C: np.ndarray):
    """The kernel's ``(low, top)`` of every row, and the numpy formula's ``low``."""
    PCt, rc = proj.centroids(C)
    out = np.empty((X.shape[0], C.shape[0]), dtype=np.float32)
    rows = np.arange(X.shape[0], dtype=np.int64)
    dots, rx = projected_products(proj, X, rows, PCt, out)
    xx = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    cc = np.einsum("ij,ij->i", C, C, dtype=np.float64)
    d = X.shape[1]
    _, g_hi = bound_factors(sqdist32_error(d))
    low = np.empty_like(dots, dtype=np.float64)
    top = np.empty(X.shape[0])
    scratch = np.empty(C.shape[0])
    for q in range(X.shape[0]):
        top[q] = projected_estimates(X[q], C, xx[q], rx[q], dots[q], cc, np.sqrt(cc), rc,
                                     proj.slack, d, g_hi, low[q], scratch)  # fmt: skip
    eta = proj.slack[0]
    hi_dot = dots + rx[:, None] * rc[None, :] + eta * np.sqrt(xx)[:, None] * np.sqrt(cc)[None, :]
    s = xx[:, None] + cc[None, :]
    ref = s - 2.0 * hi_dot - (d + 16) * F64_ULP * s - (d + 1) * 2.0**-148
    return low, top, ref


CASES = {
    "near": dict(rank=5),
    "inside": dict(rank=5, noise=0.0),
    "huge": dict(rank=5, scale=1e15),
    "tiny": dict(rank=5, scale=1e-15),
    "integer": dict(rank=5, scale=40.0, integer=True),
    "isotropic": dict(rank=48, noise=1.0),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_projected_estimates_are_the_numpy_formula_and_sound(case, seed):
    X = near_subspace(600, 48, seed=seed, **CASES[case])
    C = X[np.random.default_rng(seed).choice(600, 70, replace=False)].copy()
    C[:5] += np.float32(0.5) * C[5:10]  # centroids that are not rows
    proj = forced(C, X)
    low, top, ref = estimates(proj, X, C)
    np.testing.assert_allclose(low, ref, rtol=1e-12, atol=1e-300)
    true = sqdist64_ref(X, C)
    assert (low <= true).all()
    assert (top >= true.min(axis=1)).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_residual_bounds_cover_the_part_off_the_span(seed):
    X = near_subspace(500, 40, rank=4, seed=seed, noise=0.3)
    proj = forced(X[:60], X)
    Q = np.linalg.qr(proj.basis.astype(np.float64))[0]  # the span, exactly orthonormal
    X64 = X.astype(np.float64)
    off = np.linalg.norm(X64 - (X64 @ Q) @ Q.T, axis=1)
    rx = proj.residuals(X, X @ proj.basis)
    assert (rx >= off).all()
    assert proj.slack[2] < 1e-5  # the float32 basis is orthonormal to within delta


def test_a_product_that_is_not_finite_makes_every_centroid_a_candidate():
    X = near_subspace(300, 30, rank=3, seed=3)
    C = X[:20].copy()
    proj = forced(C, X)
    X[7] *= np.float32(3e37)  # its products overflow float32
    low, top, _ = estimates(proj, X, C)
    assert top[7] == np.inf and (low[7] == 0.0).all()


def _state(n, k, d, *, bounds: bool, assigned: bool, seed: int) -> dict:
    return {**dense_state(n, k, d, k if bounds else None, seed, assigned=assigned),
            "remove": assigned}  # fmt: skip


def _same(a: dict, b: dict, *, bounds: bool) -> None:
    for key in ("labels", "dist2", "S", "v", "sse", "Q", "sqnorms", "upper_bounds"):
        if a[key] is not None:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture
def threads():
    before = numba.get_num_threads()
    yield numba.set_num_threads
    numba.set_num_threads(before)


@pytest.mark.parametrize("bounds", [True, False])
@pytest.mark.parametrize("assigned", [True, False])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_assign_dense_through_a_subspace_is_the_full_pass(bounds, assigned, n_threads, threads):
    if n_threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("numba's pool has one thread")
    threads(n_threads)
    n, k, d = 3 * PRODUCT_ROWS + 100, 50, 40
    X = near_subspace(n, d, rank=6, seed=4, scale=10.0)
    C = X[np.random.default_rng(4).choice(n, k, replace=False)].copy()
    rows = np.arange(0, n, 2, dtype=np.int64)
    weights = np.random.default_rng(5).random(n) * 3.0
    proj = forced(C, X)
    PCt, rc = proj.centroids(C)
    cc = np.einsum("ij,ij->i", C, C, dtype=np.float64)
    full = _state(n, k, d, bounds=bounds, assigned=assigned, seed=6)
    sub = _state(n, k, d, bounds=bounds, assigned=assigned, seed=6)
    if assigned:
        for state in (full, sub):
            state["v"] = state["v"].astype(np.float64)
    w = weights if assigned else None
    dots = X[rows] @ C.T
    assign_dense(X, rows, C, dots=dots, cc=cc, weights=w, **full)
    pdots, rx = projected_products(proj, X, rows, PCt, np.empty((rows.shape[0], k), np.float32))
    assign_dense(X, rows, C, dots=pdots, cc=cc, weights=w, projected=(rx, rc, proj.slack), **sub)
    _same(full, sub, bounds=bounds)
    true = np.sqrt(sqdist64_ref(X[rows], C))
    if bounds:
        assert (sub["lower_bounds"][rows] <= true).all()
        assert (full["lower_bounds"][rows] <= true).all()


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba's pool has one thread")
def test_the_pool_through_a_subspace_is_the_single_thread_pass(threads):
    threads(2)
    n, k, d = 4 * PRODUCT_ROWS + 10, 60, 36
    X = near_subspace(n, d, rank=5, seed=8, scale=3.0)
    C = X[:k].copy()
    rows = np.arange(n, dtype=np.int64)
    proj = forced(C, X)
    PCt, rc = proj.centroids(C)
    cc = np.einsum("ij,ij->i", C, C, dtype=np.float64)
    one = _state(n, k, d, bounds=True, assigned=False, seed=9)
    pool = _state(n, k, d, bounds=True, assigned=False, seed=9)
    pdots, rx = projected_products(proj, X, rows, PCt, np.empty((n, k), np.float32))
    threads(1)
    assign_dense(X, rows, C, dots=pdots, cc=cc, projected=(rx, rc, proj.slack), **one)
    threads(2)
    pooled_assign(X, rows, C, np.ascontiguousarray(C.T), cc, subspace=(proj, PCt, rc), **pool)
    _same(one, pool, bounds=True)
    np.testing.assert_array_equal(one["lower_bounds"], pool["lower_bounds"])


def on_and_off(X, k, *, steps, metric="euclidean", weights=None, **kwargs):
    """nmbatch with the projection forced on and off, one step at a time (checked)."""
    algos = []
    for enabled in (True, False):
        store = filled_store(X[:0], seed=0, metric=metric)
        store.append(X, weights=weights)
        algo = make_algorithm("nmbatch", store, k, metric=metric, **kwargs)
        algo.subspace = Subspace(enabled)
        algos.append(algo)
    return lockstep(algos, steps)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nmbatch_through_a_subspace_is_the_same_run_bit_for_bit(metric, weighted):
    X = near_subspace(4_000, 48, rank=6, seed=11, scale=5.0)
    w = np.random.default_rng(12).integers(0, 4, X.shape[0]).astype(np.float64)
    w = w if weighted else None
    for (on, off), (s_on, s_off) in on_and_off(X, 80, steps=60, metric=metric, weights=w,
                                             batch_size=400, rho=10.0, random_state=3):  # fmt: skip
        np.testing.assert_array_equal(on.labels(), off.labels())
        np.testing.assert_array_equal(on.centroids, off.centroids)
        np.testing.assert_array_equal(on.S, off.S)
        np.testing.assert_array_equal(on.v, off.v)
        assert (s_on.n_changed, s_on.doubled) == (s_off.n_changed, s_off.doubled)
    assert on.subspace.projection is not None and off.subspace.projection is None
    assert s_on.converged


def test_the_estimator_projects_at_large_k_and_fits_the_same_model(monkeypatch):
    X = near_subspace(6_000, 48, rank=6, seed=13, scale=4.0)
    k = projection.MIN_CENTROIDS

    def fit(n_threads: int) -> NestedMiniBatchKMeans:
        return NestedMiniBatchKMeans(k, random_state=0, max_iter=4, n_threads=n_threads).fit(X)

    chosen = []
    real = projection.fit_projection

    def watch(C, S, *, force=False):
        chosen.append(real(C, S, force=force))
        return chosen[-1]

    monkeypatch.setattr(projection, "fit_projection", watch)
    on = fit(1)
    assert chosen and chosen[0] is not None and chosen[0].dims < 48 / 2
    two = fit(2)
    monkeypatch.setattr(projection, "MIN_CENTROIDS", 10**9)
    off = fit(1)
    assert chosen[-1] is None
    for other in (two, off):
        np.testing.assert_array_equal(on.cluster_centers_, other.cluster_centers_)
        np.testing.assert_array_equal(on.labels_, other.labels_)


def test_fit_projection_prices_each_p():
    rng = np.random.default_rng(14)
    low_rank = near_subspace(3_000, 96, rank=4, seed=14)
    C = low_rank[rng.choice(3_000, 2_048, replace=False)]
    proj = fit_projection(C, low_rank[:256])
    assert proj is not None and proj.dims <= 16
    np.testing.assert_allclose(proj.basis.T @ proj.basis, np.eye(proj.dims), atol=1e-5)
    assert fit_projection(C[:100], low_rank[:256]) is None  # k below MIN_CENTROIDS
    iso = rng.normal(size=(3_000, 96)).astype(np.float32)
    assert fit_projection(iso[:2_048], iso[2_048:2_304]) is None  # no subspace helps


@pytest.mark.parametrize("n_threads", [1, 2])
def test_nearest_through_a_subspace_is_the_same_answer(n_threads):
    X = near_subspace(5_000, 40, rank=5, seed=15, scale=7.0)
    C = X[np.random.default_rng(15).choice(5_000, 90, replace=False)].copy()
    proj = forced(C, X)
    full = nearest(X, C, n_threads=n_threads)
    sub = nearest(X, C, n_threads=n_threads, projection=proj)
    for a, b in zip(full, sub, strict=True):
        np.testing.assert_array_equal(a, b)
