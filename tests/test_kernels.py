"""Correctness of the numba kernels (``engine.kernels``), ``engine.nearest`` and k-means++.

Every kernel is checked against a plain numpy version of the same formula:

- the float32 distance ``sqdist32`` against the exact value (rational arithmetic), within
  its documented relative bound ``sqdist32_error(d)``, and the row norms ``sqnorms32``
  within theirs;
- ``sqdist64`` and ``nearest_dense`` bit for bit against sequential float64 sums (the
  kernels' summation order);
- ``assign_dense`` and the bounded revisit (``bound_sweep``, ``settle_assigned``,
  ``reassign_rows``) against brute-force nearest centroids and sums recomputed from
  scratch, with every lower bound checked against the true distance;
- ``centroid_update`` against the numpy mean and ``sse``;
- ``remove_votes`` against sums recomputed over the rows that keep their vote.

(The store's shuffle kernel is tested with the store, in ``test_store``.)

Integer-valued data make every float64 sum exact, so exact ties (duplicated centroids,
points half-way between two centroids) are decided by the lowest-index rule, and the
tests compare exactly.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nmbatch.engine import nearest
from nmbatch.engine.assign import CHUNK_ROWS, sqnorms
from nmbatch.engine.kernels import (
    assign_dense,
    bound_sweep,
    centroid_update,
    gemm_error,
    nearest_dense,
    reassign_rows,
    remove_votes,
    settle_assigned,
    sqdist32,
    sqdist32_error,
    sqdist64,
    sqdist_safe,
    sqnorms32,
)
from nmbatch.engine.kernels.common import gemm_estimates
from tests.engine_helpers import brute_nearest, sqdist64_ref
from tests.testkit import blobs

SETTINGS = settings(max_examples=60, deadline=None)

# Values whose differences and squares stay in float32's normal range: the documented
# error bound of sqdist32 is a relative one, which float32 underflow cannot honour (see
# test_sqdist32_bound_holds_at_extreme_scales).
_moderate = st.floats(-1e3, 1e3, width=32).filter(lambda x: x == 0.0 or abs(x) > 1e-6)


def exact_sqdist(x: np.ndarray, c: np.ndarray) -> Fraction:
    """``||x - c||^2`` in exact rational arithmetic (float32 inputs)."""
    return sum(
        ((Fraction(float(a)) - Fraction(float(b))) ** 2 for a, b in zip(x, c, strict=True)),
        Fraction(0),
    )


def int_matrix(max_rows: int, max_cols: int, lo: int = -4, hi: int = 4):
    """Strategy: small integer-valued float32 matrices (many duplicates and exact ties)."""
    return (
        st.tuples(st.integers(1, max_rows), st.integers(1, max_cols))
        .flatmap(lambda s: arrays(np.int8, s, elements=st.integers(lo, hi)))
        .map(lambda a: a.astype(np.float32))
    )


def float_data(seed: int, n: int, k: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Random float32 samples ``(n, d)`` and centroids ``(k, d)`` at a random scale and offset."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-3, 3)
    offset = scale * rng.uniform(-20, 20, size=d)
    X = (offset + scale * rng.standard_normal((n, d))).astype(np.float32)
    C = (offset + scale * rng.standard_normal((k, d))).astype(np.float32)
    return X, C


def with_duplicate_centroids(C: np.ndarray, X: np.ndarray, seed: int) -> np.ndarray:
    """``C`` with some rows replaced by copies of other centroids or of samples."""
    rng = np.random.default_rng(seed)
    C = C.copy()
    k = C.shape[0]
    for j in range(k):
        r = rng.random()
        if r < 0.25 and j > 0:
            C[j] = C[rng.integers(j)]
        elif r < 0.5:
            C[j] = X[rng.integers(X.shape[0])]
    return C


# ---------------------------------------------------------------------------------------
# distances


@SETTINGS
@given(
    st.integers(1, 40).flatmap(
        lambda d: st.tuples(
            arrays(np.float32, d, elements=_moderate), arrays(np.float32, d, elements=_moderate)
        )
    )
)
def test_sqdist32_within_its_error_bound_of_the_exact_value(xc):
    x, c = xc
    exact = exact_sqdist(x, c)
    s = sqdist32(x, c)
    assert isinstance(s, float)
    g = Fraction(sqdist32_error(x.shape[0]))
    assert abs(Fraction(s) - exact) <= g * exact


@pytest.mark.parametrize("d", [1, 3, 8, 17, 64, 200])
def test_sqdist32_error_bound_on_random_vectors_of_many_scales(d):
    rng = np.random.default_rng(d)
    g = Fraction(sqdist32_error(d))
    for scale in (1e-6, 1e-2, 1.0, 1e3, 1e8):
        for _ in range(20):
            x = (scale * rng.standard_normal(d)).astype(np.float32)
            c = (x + scale * 1e-3 * rng.standard_normal(d)).astype(np.float32)  # cancellation
            for y in (c, (scale * rng.standard_normal(d)).astype(np.float32)):
                exact = exact_sqdist(x, y)
                assert abs(Fraction(sqdist32(x, y)) - exact) <= g * exact


def test_sqdist32_error_bound_formula():
    u = 2.0**-24
    for d in (1, 10, 1000):
        m = (d + 3) * u
        assert sqdist32_error(d) == m / (1 - m)
        assert gemm_error(d) == (d + 1) * u / (1 - (d + 1) * u)


@pytest.mark.parametrize(
    ("x", "c"),
    [
        pytest.param([1e-30], [0.0], id="square-underflows"),
        pytest.param([3e19], [-3e19], id="square-overflows"),
    ],
)
def test_sqdist_safe_bound_holds_at_extreme_scales(x, c):
    # Finite float32 inputs that the store accepts. Plain float32 squares under- or
    # overflow here (s = 0, resp. inf, for a true value of 1e-60, resp. 3.6e39);
    # sqdist_safe, which the kernels use, keeps the documented relative bound.
    x = np.array(x, dtype=np.float32)
    c = np.array(c, dtype=np.float32)
    exact = exact_sqdist(x, c)
    s = sqdist_safe(x, c)
    assert math.isfinite(s)
    assert abs(Fraction(s) - exact) <= Fraction(sqdist32_error(1)) * exact


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 70))
def test_sqdist64_is_the_sequential_float64_sum(seed, d):
    x, c = float_data(seed, 1, 1, d)
    x, c = x[0], c[0]
    ref = sqdist64_ref(x[None], c[None])[0, 0]
    assert sqdist64(x, c) == ref
    np.testing.assert_allclose(
        sqdist64(x, c), np.sum((x.astype(np.float64) - c.astype(np.float64)) ** 2), rtol=1e-14
    )


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 50), st.integers(1, 40))
def test_sqnorms32_equals_numpy_on_the_chosen_rows(seed, n, d):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    rows = rng.integers(0, n, size=rng.integers(0, 2 * n)).astype(np.int64)
    out = np.full(rows.shape[0], np.nan)
    sqnorms32(X[rows], out)
    X64 = X.astype(np.float64)[rows]
    # The squares are exact in float64; any order of summing d of them is within
    # (d + 1) float64 ulps (relative) of the exact sum.
    bound = Fraction((d + 1) * 2.0**-53)
    for q, row in enumerate(X[rows]):
        exact = sum((Fraction(float(a)) ** 2 for a in row), Fraction(0))
        assert abs(Fraction(out[q]) - exact) <= bound * exact
    np.testing.assert_allclose(out, np.einsum("ij,ij->i", X64, X64), rtol=1e-14)


# ---------------------------------------------------------------------------------------
# exact nearest centroid


def call_nearest_dense(X: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    labels = np.full(X.shape[0], -5, dtype=np.int64)
    sqd = np.full(X.shape[0], np.nan)
    nearest_dense(
        X,
        sqnorms(X),
        X @ np.ascontiguousarray(C.T),
        C,
        sqnorms(C),
        gemm_error(X.shape[1]),
        labels,
        sqd,
    )
    return labels, sqd


@SETTINGS
@given(int_matrix(25, 5), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_nearest_on_integer_data_with_duplicate_centroids_is_brute_force(X, k, seed):
    rng = np.random.default_rng(seed)
    C = rng.integers(-4, 5, size=(k, X.shape[1])).astype(np.float32)
    C = with_duplicate_centroids(C, X, seed)
    ref_labels, ref_sqd = brute_nearest(X, C)
    numpy_sqd = ((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
    assert np.array_equal(ref_labels, np.argmin(numpy_sqd, axis=1))  # exact data: same ties
    for labels, sqd in (nearest(X, C), call_nearest_dense(X, C)):
        assert labels.dtype == np.int64 and sqd.dtype == np.float64
        np.testing.assert_array_equal(labels, ref_labels)
        np.testing.assert_array_equal(sqd, ref_sqd)


def test_nearest_ties_go_to_the_lowest_index():
    X = np.array([[0, 0], [1, 0], [2, 0], [5, 5]], dtype=np.float32)
    C = np.array([[2, 0], [0, 0], [2, 0], [0, 0], [1, 1]], dtype=np.float32)
    labels, sqd = nearest(X, C)
    # [1, 0] is at distance 1 from c0, c1, c2, c3 and c4: index 0 wins.
    np.testing.assert_array_equal(labels, [1, 0, 0, 4])
    np.testing.assert_array_equal(sqd, [0.0, 1.0, 0.0, 32.0])


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 9), st.integers(1, 20))
def test_nearest_on_float_data_is_the_float64_argmin(seed, n, k, d):
    X, C = float_data(seed, n, k, d)
    C = with_duplicate_centroids(C, X, seed)
    ref_labels, ref_sqd = brute_nearest(X, C)
    numpy_sqd = ((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
    for labels, sqd in (nearest(X, C), call_nearest_dense(X, C)):
        np.testing.assert_array_equal(labels, ref_labels)
        np.testing.assert_allclose(sqd, numpy_sqd[np.arange(n), labels], rtol=1e-12)
        np.testing.assert_array_equal(sqd, ref_sqd)


@numba.njit
def _gemm_estimates(xx, dots, cc, g_gemm, d):
    """``gemm_estimates`` over every row of ``dots``: ``(low, top)``."""
    m, k = dots.shape
    low = np.empty((m, k), dtype=np.float64)
    top = np.empty(m, dtype=np.float64)
    high = np.empty(k, dtype=np.float64)
    norm_c = np.sqrt(cc)
    for q in range(m):
        top[q] = gemm_estimates(xx[q], dots[q], cc, norm_c, g_gemm, d, low[q], high)
    return low, top


@pytest.mark.parametrize("k", [1, 7, 8, 13, 64, 1001])
@pytest.mark.parametrize("seed", [0, 1])
def test_gemm_estimates_are_the_numpy_formula_bit_for_bit(seed, k):
    """The vectorised estimates and their smallest upper value are the float64 formula's,
    evaluated in numpy in the same order; a row with a non-finite product (overflow, NaN)
    takes the per-centroid path, where that product's estimate is unknown (-inf)."""
    rng = np.random.default_rng(seed)
    d = 37
    X = rng.normal(size=(6, d)).astype(np.float32) * 10
    C = rng.normal(size=(k, d)).astype(np.float32) * 10
    dots = X @ C.T
    dots[4, k // 2] = np.inf
    dots[5, k - 1] = np.nan
    xx = (X.astype(np.float64) ** 2).sum(1)
    cc = (C.astype(np.float64) ** 2).sum(1)
    g = gemm_error(d)
    low, top = _gemm_estimates(xx, dots, cc, g, d)
    dot64 = dots.astype(np.float64)
    est = xx[:, None] + cc[None, :] - 2.0 * dot64
    nx, nc = np.sqrt(xx), np.sqrt(cc)
    err = 2.0 * g * nx[:, None] * nc[None, :] + (d + 8) * 2.0**-53 * (xx[:, None] + cc[None, :])
    err = err + (d + 1) * 2.0**-148
    unknown = ~np.isfinite(dot64)
    est[unknown], err[unknown] = 0.0, np.inf
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(low, est - err)
        np.testing.assert_array_equal(top, (est + err).min(axis=1))
    assert (low[unknown] == -np.inf).all()


def test_nearest_spans_several_chunks_and_accepts_other_dtypes():
    X = blobs(CHUNK_ROWS + 917, 3, 5, seed=3)
    C = X[:7].copy()
    ref_labels, ref_sqd = brute_nearest(X, C)
    labels, sqd = nearest(X.astype(np.float64), C)
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_array_equal(sqd, ref_sqd)
    labels, sqd = nearest(X[:0], C)
    assert labels.shape == (0,) and sqd.shape == (0,)
    with pytest.raises(ValueError):
        nearest(X[:, :2], C)


@pytest.mark.parametrize(
    ("x", "centroids"),
    [
        # true distances 0 and 1e-25: the float32 product x.c underflows to 0.
        pytest.param([[1e-25]], [[1e-25], [0.0]], id="tiny-dot-underflows"),
        # true distances 0 and 9e19: the float32 product x.c1 = 1e39 overflows to inf.
        pytest.param([[1e19]], [[1e19], [1e20]], id="huge-dot-overflows"),
    ],
)
def test_nearest_is_exact_at_extreme_scales(x, centroids):
    # Finite float32 values, accepted by the store and the service. The candidate
    # filter trusts the BLAS float32 product within 2 g |x||c|, which float32 under- and
    # overflow break: the true nearest centroid (index 0, distance 0) is filtered out.
    X = np.array(x, dtype=np.float32)
    C = np.array(centroids, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        labels, sqd = nearest(X, C)
    np.testing.assert_array_equal(labels, [0])
    np.testing.assert_array_equal(sqd, [0.0])


# ---------------------------------------------------------------------------------------
# dense assignment


class State:
    """Per-sample and per-cluster arrays of the kernels, freshly zeroed."""

    def __init__(self, N: int, k: int, d: int, bounds: bool = True) -> None:
        self.labels = np.full(N, -1, dtype=np.int32)
        self.dist2 = np.zeros(N, dtype=np.float64)
        self.lower = np.zeros((N, k), dtype=np.float32) if bounds else None
        self.upper = np.zeros(N, dtype=np.float64) if bounds else None
        self.S = np.zeros((k, d), dtype=np.float64)
        self.v = np.zeros(k, dtype=np.int64)
        self.sse = np.zeros(k, dtype=np.float64)
        self.Q = np.zeros(k, dtype=np.float64)

    def copy(self) -> State:
        new = State.__new__(State)
        for name, value in vars(self).items():
            setattr(new, name, None if value is None else value.copy())
        return new


def run_assign_dense(
    X: np.ndarray, rows: np.ndarray, C: np.ndarray, remove: bool, state: State
) -> int:
    """Call ``assign_dense`` with its inputs prepared as the engine does (norms known)."""
    rows = np.asarray(rows, dtype=np.int64)
    Xr = X[rows]
    norms = np.full(X.shape[0], np.nan)
    norms[rows] = sqnorms(Xr)
    return assign_dense(
        X, rows, C, dots=Xr @ np.ascontiguousarray(C.T), cc=sqnorms(C),
        labels=state.labels, dist2=state.dist2, S=state.S, v=state.v, sse=state.sse, Q=state.Q,
        remove=remove, sqnorms=norms, sqnorms_known=True,
        lower_bounds=state.lower, upper_bounds=state.upper,
    )


def assert_state_consistent(
    X: np.ndarray, state: State, rtol_sse: float = 1e-9, check_sse: bool = True
) -> None:
    """Sums equal a from-scratch recomputation over the rows with a label."""
    k, d = state.S.shape
    seen = state.labels >= 0
    lab = state.labels[seen]
    X64 = X[seen].astype(np.float64)
    np.testing.assert_array_equal(state.v, np.bincount(lab, minlength=k))
    S = np.zeros((k, d))
    np.add.at(S, lab, X64)
    np.testing.assert_allclose(state.S, S, rtol=1e-12, atol=1e-9 * max(np.abs(X64).max(), 1))
    Q = np.bincount(lab, weights=(X64**2).sum(axis=1), minlength=k)
    np.testing.assert_allclose(state.Q, Q, rtol=1e-12, atol=1e-12 * max(Q.max(initial=0), 1e-300))
    if check_sse:
        sse = np.bincount(lab, weights=state.dist2[seen], minlength=k)
        np.testing.assert_allclose(
            state.sse, sse, rtol=rtol_sse, atol=rtol_sse * max(state.dist2.sum(), 1e-300)
        )


def assert_bounds_valid(X: np.ndarray, C: np.ndarray, lower: np.ndarray, rows) -> None:
    true = np.sqrt(sqdist64_ref(X[rows], C))
    assert (lower[rows].astype(np.float64) <= true).all()


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 40),
    st.integers(1, 8),
    st.integers(1, 12),
    st.booleans(),
)
def test_assign_dense_fresh_rows(seed, N, k, d, integer):
    rng = np.random.default_rng(seed)
    if integer:
        X = rng.integers(-3, 4, size=(N, d)).astype(np.float32)
        C = rng.integers(-3, 4, size=(k, d)).astype(np.float32)
    else:
        X, C = float_data(seed, N, k, d)
    C = with_duplicate_centroids(C, X, seed)
    rows = np.sort(rng.choice(N, size=rng.integers(1, N + 1), replace=False))
    state = State(N, k, d)
    changed = run_assign_dense(X, rows, C, False, state)
    assert changed == 0  # rows without a label (-1) are new, not changed
    ref_labels, ref_sqd = brute_nearest(X[rows], C)
    np.testing.assert_array_equal(state.labels[rows], ref_labels)
    others = np.setdiff1d(np.arange(N), rows)
    assert (state.labels[others] == -1).all()
    assert (state.lower[others] == 0).all() and (state.dist2[others] == 0).all()
    # d(i)^2 is a direct distance: float32-grade, or exact when float64 decided.
    g = sqdist32_error(d)
    assert (np.abs(state.dist2[rows] - ref_sqd) <= g * ref_sqd * (1 + 1e-6)).all()
    assert_state_consistent(X, state)
    assert_bounds_valid(X, C, state.lower, rows)
    # The bound of the chosen centroid is tight to float32 accuracy.
    chosen = state.lower[rows, ref_labels].astype(np.float64)
    np.testing.assert_allclose(chosen, np.sqrt(ref_sqd), rtol=4 * g + 2**-21, atol=0)


def test_assign_dense_without_bounds_array_and_accumulating_votes():
    X = blobs(60, 2, 3, seed=1, integer=True)
    C = X[:3].copy()
    state = State(60, 3, 2, bounds=False)
    rows = np.arange(60)
    run_assign_dense(X, rows, C, False, state)
    first = state.copy()
    # remove=False adds every vote again (mbatch): counts and sums double exactly.
    changed = run_assign_dense(X, rows, C, False, state)
    assert changed == 0
    np.testing.assert_array_equal(state.v, 2 * first.v)
    np.testing.assert_array_equal(state.S, 2 * first.S)
    np.testing.assert_allclose(state.sse, 2 * first.sse, rtol=1e-15)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 40), st.integers(1, 6), st.booleans())
def test_remove_votes_leaves_the_sums_of_the_other_rows(seed, N, k, cached_norms):
    """Integer data: the sums after removal equal those of the remaining rows exactly."""
    rng = np.random.default_rng(seed)
    X = rng.integers(-20, 20, size=(N, 3)).astype(np.float32)
    C = X[rng.integers(0, N, size=k)].copy()
    state = State(N, k, 3, bounds=False)
    run_assign_dense(X, np.arange(N), C, False, state)
    state.labels[:-1][rng.random(N - 1) < 0.2] = -1  # rows without a vote are skipped
    keep = state.labels >= 0
    v, S = state.v.copy(), state.S.copy()
    for j in range(k):  # drop the votes of the rows just unlabelled, the numpy way
        S[j] = X[keep & (state.labels == j)].astype(np.float64).sum(0)
        v[j] = int((keep & (state.labels == j)).sum())
    state.S, state.v = S, v
    state.Q = np.bincount(state.labels[keep], weights=(X[keep].astype(np.float64) ** 2).sum(1),
                          minlength=k)
    state.sse = np.bincount(state.labels[keep], weights=state.dist2[keep], minlength=k)
    rows = np.flatnonzero(rng.random(N - 1) < 0.5).astype(np.int64)  # the last row stays
    xx = sqnorms(X) if cached_norms else np.empty(0)
    n_votes = remove_votes(X, rows, state.labels, xx, state.dist2, state.S, state.v,
                           state.Q, state.sse, np.empty(0))
    assert n_votes == int(keep[rows].sum())
    assert (state.labels[rows] == -1).all()
    kept = keep.copy()
    kept[rows] = False
    np.testing.assert_array_equal(state.labels >= 0, kept)
    assert_state_consistent(X, state)


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.integers(2, 40),
    st.integers(1, 6),
    st.integers(1, 6),
    st.booleans(),
)
def test_assign_dense_remove_gives_back_old_votes(seed, N, k, d, integer):
    rng = np.random.default_rng(seed)
    if integer:
        X = rng.integers(-3, 4, size=(N, d)).astype(np.float32)
        C1 = rng.integers(-3, 4, size=(k, d)).astype(np.float32)
        C2 = rng.integers(-3, 4, size=(k, d)).astype(np.float32)
    else:
        X, C1 = float_data(seed, N, k, d)
        C2 = (C1 + np.abs(C1).max() * 0.3 * rng.standard_normal(C1.shape)).astype(np.float32)
    state = State(N, k, d)
    run_assign_dense(X, np.arange(N), C1, False, state)
    before = state.copy()
    rows = np.sort(rng.choice(N, size=rng.integers(1, N + 1), replace=False))
    changed = run_assign_dense(X, rows, C2, True, state)
    ref_labels, _ = brute_nearest(X[rows], C2)
    np.testing.assert_array_equal(state.labels[rows], ref_labels)
    assert changed == int((before.labels[rows] != ref_labels).sum())
    others = np.setdiff1d(np.arange(N), rows)
    np.testing.assert_array_equal(state.labels[others], before.labels[others])
    np.testing.assert_array_equal(state.dist2[others], before.dist2[others])
    assert_state_consistent(X, state)
    assert_bounds_valid(X, C2, state.lower, rows)
    assert_bounds_valid(X, C1, state.lower, others)
    if integer:  # exact sums: same as the from-scratch result, bit for bit
        fresh = State(N, k, d)
        fresh.labels[:] = state.labels
        np.add.at(fresh.S, state.labels, X.astype(np.float64))
        np.testing.assert_array_equal(state.S, fresh.S)


@pytest.mark.parametrize(
    ("X", "C"),
    [
        # x = 0 is at 1e20 from both centroids (a float32 square overflows) ...
        pytest.param([[-3e6], [5e6]], [[-1e20], [1e20]], id="squares-overflow"),
    ],
)
def test_assign_dense_assigns_every_row_at_extreme_scales(X, C):
    # Each row has one candidate whose float32 distance is inf; `s_j < best_s` never
    # holds, best stays -1, and the row is labelled -1 while its vote goes to S[-1]
    # (numba wraps the index to k - 1).
    X = np.array(X, dtype=np.float32)
    C = np.array(C, dtype=np.float32)
    state = State(2, 2, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run_assign_dense(X, np.arange(2), C, False, state)
    np.testing.assert_array_equal(state.labels, brute_nearest(X, C)[0])
    np.testing.assert_array_equal(state.v, [1, 1])


@pytest.mark.parametrize(
    ("X", "C"),
    [
        pytest.param([[1e-25]], [[1e-25], [0.0]], id="tiny-dot-underflows"),
        pytest.param([[0.0]], [[-1e20], [1e20]], id="huge-square-overflows"),
    ],
)
def test_assign_dense_lower_bounds_valid_at_extreme_scales(X, C):
    X = np.array(X, dtype=np.float32)
    C = np.array(C, dtype=np.float32)
    state = State(1, 2, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run_assign_dense(X, np.arange(1), C, False, state)
    np.testing.assert_array_equal(state.labels, brute_nearest(X, C)[0])
    assert_bounds_valid(X, C, state.lower, np.arange(1))


# ---------------------------------------------------------------------------------------
# bounded reassignment


def movement(C_old: np.ndarray, C_new: np.ndarray) -> np.ndarray:
    """``p(j) = ||c_new(j) - c_old(j)||`` in float64: ``(k,)``."""
    diff = C_new.astype(np.float64) - C_old.astype(np.float64)
    return np.sqrt((diff * diff).sum(axis=1))


def reassign_bounded(X, C, p, state):
    """A bounded revisit of every row of ``X``, all scalar: :func:`bound_sweep`, then
    :func:`reassign_rows` on the rows it lists. Returns ``(n_changed, n_distances)``."""
    n = X.shape[0]
    labels, upper, lower = state.labels[:n], state.upper[:n], state.lower[:n]
    rows, _ = bound_sweep(p, labels, upper, lower)
    return reassign_rows(
        X, rows, C, labels=labels, upper_bounds=upper, lower_bounds=lower,
        S=state.S, v=state.v, Q=state.Q,
    )


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 50),
    st.integers(1, 7),
    st.integers(1, 8),
    st.sampled_from([0.0, 0.01, 0.3, 3.0]),
    st.booleans(),
    st.integers(1, 3),
)
def test_reassign_bounded_is_exact_and_keeps_sums(seed, n, k, d, delta, integer, rounds):
    rng = np.random.default_rng(seed)
    if integer:
        X = blobs(n, d, k, seed=seed, spread=2.0, separation=6.0, integer=True)
    else:
        X, _ = float_data(seed, n, 1, d)
    C = X[rng.integers(0, n, size=k)].copy()
    C = with_duplicate_centroids(C, X, seed)
    state = State(n, k, d)
    run_assign_dense(X, np.arange(n), C, False, state)
    scale = float(np.abs(X).max()) + 1.0
    for _ in range(rounds):
        C_new = (C + delta * scale * rng.standard_normal(C.shape)).astype(np.float32)
        if integer:
            C_new = np.rint(C_new)
        p = movement(C, C_new)
        before = state.copy()
        n_changed, n_dist = reassign_bounded(X, C_new, p, state)
        ref_labels, ref_sqd = brute_nearest(X, C_new)
        np.testing.assert_array_equal(state.labels, ref_labels)
        assert n_changed == int((before.labels != ref_labels).sum())
        assert 0 <= n_dist <= n * k
        # Every upper bound is above the true distance to the sample's centroid.
        assert (state.upper >= np.sqrt(ref_sqd)).all()
        assert_state_consistent(X, state, check_sse=False)
        assert_bounds_valid(X, C_new, state.lower, np.arange(n))
        C = C_new


def bound_sweep_ref(p, labels, upper, lower):
    """numpy version of ``bound_sweep``: the same float32 / float64 operations, row-wise.

    Returns ``(todo, n_open, upper_new, lower_new)``.
    """
    p32 = (p * (1.0 + 2.0**-22)).astype(np.float32)
    lower_new = ((lower - p32[None, :]) * np.float32(1.0 - 2.0**-23)).astype(np.float32)
    upper_new = (upper + p[labels]) * (1.0 + 2.0**-50)
    ub32 = (upper_new * (1.0 + 2.0**-22)).astype(np.float32)
    is_open = lower_new <= ub32[:, None]
    is_open[np.arange(labels.shape[0]), labels] = False
    per_row = is_open.sum(axis=1)
    todo = np.flatnonzero(per_row > 0)
    return todo, int((per_row[todo] + 1).sum()), upper_new, lower_new


@SETTINGS
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 60),
    st.integers(1, 9),
    st.sampled_from([0.0, 0.05, 1.0, 30.0]),
)
def test_bound_sweep_matches_numpy_and_is_sound(seed, n, k, delta):
    # Bounds from an exact assignment, centroids moved by ``delta``: the sweep must update
    # every bound as the numpy formula does, keep them valid for the moved centroids, and
    # list exactly the rows whose label the bounds cannot prove unchanged.
    rng = np.random.default_rng(seed)
    d = 3
    X = blobs(n, d, k, seed=seed % 1000, spread=2.0, separation=4.0)
    C = X[rng.integers(0, n, size=k)].copy()
    state = State(n, k, d)
    run_assign_dense(X, np.arange(n), C, False, state)
    C_new = (C + delta * rng.standard_normal(C.shape)).astype(np.float32)
    p = movement(C, C_new) * (1.0 + 1e-9)
    todo_ref, n_open_ref, upper_ref, lower_ref = bound_sweep_ref(
        p, state.labels, state.upper.copy(), state.lower.copy()
    )
    todo, n_open = bound_sweep(p, state.labels, state.upper, state.lower)
    np.testing.assert_array_equal(todo, todo_ref)
    assert n_open == n_open_ref
    assert todo.shape[0] <= n_open <= todo.shape[0] * k
    np.testing.assert_array_equal(state.upper, upper_ref)
    np.testing.assert_array_equal(state.lower, lower_ref)
    assert_bounds_valid(X, C_new, state.lower, np.arange(n))
    dist = np.sqrt(((X.astype(np.float64) - C_new[state.labels].astype(np.float64)) ** 2).sum(1))
    assert (state.upper >= dist).all()
    # A row left off the list keeps its label: it is the nearest of the moved centroids.
    settled = np.setdiff1d(np.arange(n), todo)
    ref_labels, _ = brute_nearest(X[settled], C_new)
    np.testing.assert_array_equal(state.labels[settled], ref_labels)


def test_reassign_rows_touches_only_the_rows_it_is_given():
    X = blobs(300, 4, 6, seed=5, spread=2.0, separation=3.0)
    C = X[:6].copy()
    state = State(300, 6, 4)
    run_assign_dense(X, np.arange(300), C, False, state)
    C_new = (C + np.random.default_rng(1).standard_normal(C.shape)).astype(np.float32)
    todo, _ = bound_sweep(movement(C, C_new) * (1.0 + 1e-9), state.labels, state.upper, state.lower)
    assert 0 < todo.shape[0] < 300
    s_assigned = np.full(300, np.nan)
    todo, n_open = settle_assigned(
        X, todo, C_new, sqdist32_error(4), state.labels, state.upper, state.lower, s_assigned
    )
    assert todo.shape[0] <= n_open <= 6 * todo.shape[0]
    exact = sqdist64_ref(X, C_new)[np.arange(300), state.labels]
    np.testing.assert_allclose(s_assigned[todo], exact[todo], rtol=1e-5)
    rows = todo[::2]
    before = state.copy()
    reassign_rows(
        X, rows, C_new, labels=state.labels, upper_bounds=state.upper,
        lower_bounds=state.lower, S=state.S, v=state.v, Q=state.Q, assigned_sqdist=s_assigned,
    )
    others = np.setdiff1d(np.arange(300), rows)
    np.testing.assert_array_equal(state.labels[others], before.labels[others])
    np.testing.assert_array_equal(state.lower[others], before.lower[others])
    np.testing.assert_array_equal(state.upper[others], before.upper[others])
    np.testing.assert_array_equal(state.labels[rows], brute_nearest(X[rows], C_new)[0])
    assert_state_consistent(X, state, check_sse=False)


def test_reassign_bounded_skips_far_centroids_on_separated_data():
    k, d, n = 5, 3, 400
    rng = np.random.default_rng(7)
    centres = np.zeros((k, d))
    centres[:, 0] = 100.0 * np.arange(k)  # on a line, 100 apart
    which = rng.integers(0, k, size=n)
    X = (centres[which] + rng.standard_normal((n, d))).astype(np.float32)
    C = centres.astype(np.float32)
    state = State(n, k, d)
    run_assign_dense(X, np.arange(n), C, False, state)
    np.testing.assert_array_equal(state.labels, which)
    C_new = (C + 0.5 * rng.standard_normal(C.shape)).astype(np.float32)
    n_changed, n_dist = reassign_bounded(X, C_new, movement(C, C_new), state)
    # The bounds prove every label unchanged: no sample is even read.
    assert (n_changed, n_dist) == (0, 0)
    np.testing.assert_array_equal(state.labels, brute_nearest(X, C_new)[0])
    assert_bounds_valid(X, C_new, state.lower, np.arange(n))
    # Moving one centroid by a lot forces distances to it, and only to it.
    C_far = C_new.copy()
    C_far[0] = C_new[1]
    n_changed, n_dist = reassign_bounded(X, C_far, movement(C_new, C_far), state)
    np.testing.assert_array_equal(state.labels, brute_nearest(X, C_far)[0])
    assert n_dist <= 2 * n and n_changed == int((which == 1).sum())  # tie: index 0 wins
    assert_state_consistent(X, state, check_sse=False)


def test_reassign_bounded_with_no_movement_changes_nothing():
    X = blobs(200, 4, 6, seed=11, spread=3.0, separation=5.0)
    C = X[:6].copy()
    state = State(200, 6, 4)
    run_assign_dense(X, np.arange(200), C, False, state)
    before = state.copy()
    n_changed, _ = reassign_bounded(X, C, np.zeros(6), state)
    assert n_changed == 0
    np.testing.assert_array_equal(state.labels, before.labels)
    np.testing.assert_array_equal(state.v, before.v)
    np.testing.assert_array_equal(state.S, before.S)


# ---------------------------------------------------------------------------------------
# centroid update


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(1, 40), st.booleans())
def test_centroid_update_matches_numpy(seed, k, d, with_sse):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((5 * k + 3, d)) * 10.0).astype(np.float32)
    labels = rng.integers(0, k, size=X.shape[0])
    labels[: k // 2] = 0  # and some clusters may be empty
    C_old = (rng.standard_normal((k, d)) * 10.0).astype(np.float32)
    X64 = X.astype(np.float64)
    S = np.zeros((k, d))
    np.add.at(S, labels, X64)
    v = np.bincount(labels, minlength=k).astype(np.int64)
    Q = np.bincount(labels, weights=(X64 * X64).sum(1), minlength=k)
    sse = np.full(k, -1.0)
    C_new, p = centroid_update(S, v, Q, C_old, sse_out=sse if with_sse else None)
    # numpy: the mean where v > 0 (float64 division, then float32), else unchanged
    nz = v > 0
    ref = C_old.astype(np.float64)
    ref[nz] = S[nz] / v[nz, None]
    np.testing.assert_array_equal(C_new, ref.astype(np.float32))
    diff = C_new.astype(np.float64) - C_old.astype(np.float64)
    np.testing.assert_allclose(p, np.sqrt((diff * diff).sum(1)) * (1.0 + 1e-9), rtol=1e-12)
    if with_sse:
        # sum of squared distances to the centroids in force (the old ones), from sums
        resid = ((X64 - C_old.astype(np.float64)[labels]) ** 2).sum(1)
        ref_sse = np.bincount(labels, weights=resid, minlength=k)
        scale = Q + v * (C_old.astype(np.float64) ** 2).sum(1) + 1.0
        np.testing.assert_allclose(sse, ref_sse, atol=1e-12 * scale.max())
        assert (sse >= 0).all()
    else:
        assert (sse == -1.0).all()


# k-means++ and the other seedings: tests/test_seeding.py


# -- exact float64 distances for relocation and swaps (kernels/exact.py) ----------------


@pytest.mark.parametrize("d", [1, 7, 108, 784])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_distances_match_numpy(d, seed):
    from nmbatch.engine.kernels.exact import closer_to, own_sqdist

    rng = np.random.default_rng(seed)
    n, k, b = 300, 9, 250
    data = (rng.standard_normal((n, d)) * rng.uniform(0.1, 50.0)).astype(np.float32)
    C = (rng.standard_normal((k, d)) * 3.0).astype(np.float32)
    labels = rng.integers(0, k, n).astype(np.int32)
    X64 = data[:b].astype(np.float64)
    want = ((X64 - C.astype(np.float64)[labels[:b]]) ** 2).sum(1)
    got = own_sqdist(data, b, labels, C)
    assert got.shape == (b,) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0.0)
    # integer-valued rows: every partial sum is an exact integer, so any order agrees
    Xi = np.rint(data * 4).astype(np.float32)
    Ci = np.rint(C * 4).astype(np.float32)
    want_i = ((Xi[:b].astype(np.float64) - Ci.astype(np.float64)[labels[:b]]) ** 2).sum(1)
    np.testing.assert_array_equal(own_sqdist(Xi, b, labels, Ci), want_i)

    x = data[n - 1]
    dist2 = got.copy()
    dist2[::7] = -1.0  # rows that cannot move stay negative
    to_x = ((X64 - x.astype(np.float64)) ** 2).sum(1)
    expect = np.minimum(dist2, to_x)
    closer_to(dist2, data, b, x)
    np.testing.assert_allclose(dist2, expect, rtol=1e-12, atol=0.0)
    assert (dist2[::7] < 0).all()
