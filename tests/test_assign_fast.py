"""``engine.assign.nearest_one`` (the single-vector ``/assign`` kernel) against ``engine.nearest``.

The fast kernel must give the same label and the same float64 squared distance as the
batch lookup for every vector: random data at several shapes, exact ties (duplicated
centroids, points half-way between two centroids: lowest index wins), a vector equal
to a centroid, magnitudes where float32 squares underflow or overflow, ``k = 1``, and
arbitrary float32 inputs drawn by hypothesis.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from nmbatch.engine import nearest
from nmbatch.engine.assign import nearest_one


def assert_same_as_nearest(X: np.ndarray, C: np.ndarray) -> None:
    labels, sqdist = nearest(X, C)
    for i, x in enumerate(X):
        label, sq = nearest_one(x, C)
        assert (label, sq) == (int(labels[i]), float(sqdist[i])), f"row {i}"


@pytest.mark.parametrize(("n", "k", "d"), [(200, 16, 128), (100, 3, 2), (50, 257, 33), (30, 1, 7)])
def test_random_data(n: int, k: int, d: int) -> None:
    rng = np.random.default_rng(k * 1000 + d)
    C = rng.normal(0, 10, size=(k, d)).astype(np.float32)
    X = (C[rng.integers(0, k, n)] + rng.normal(0, 3, size=(n, d))).astype(np.float32)
    assert_same_as_nearest(X, C)


def test_ties_go_to_the_lowest_index() -> None:
    # Integer data: every float64 sum is exact, so equal distances are exact ties.
    C = np.array([[0, 0], [2, 0], [0, 0], [1, 5], [2, 0]], dtype=np.float32)
    X = np.array([[1, 0], [0, 0], [2, 0], [-1, 0], [1, 2.5]], dtype=np.float32)
    assert_same_as_nearest(X, C)
    assert nearest_one(X[0], C) == (0, 1.0)  # equidistant from 0, 1, 2, 4: index 0
    assert nearest_one(X[2], C) == (1, 0.0)  # on centroids 1 and 4: index 1


def test_vector_on_a_centroid_has_distance_zero() -> None:
    C = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
    for j in range(8):
        assert nearest_one(C[j], C) == (j, 0.0)


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e20, 1e30])
def test_underflow_and_overflow_of_float32_squares(scale: float) -> None:
    rng = np.random.default_rng(7)
    C = (rng.normal(size=(10, 24)) * scale).astype(np.float32)
    X = (C[rng.integers(0, 10, 40)] + rng.normal(size=(40, 24)) * scale * 0.5).astype(np.float32)
    assert_same_as_nearest(X, C)


def test_input_shapes_and_dtypes() -> None:
    C = np.array([[0.0, 0.0], [3.0, 4.0]], dtype=np.float32)
    assert nearest_one(np.array([[3.0, 3.0]]), C) == (1, 1.0)  # (1, d) float64 is cast
    assert nearest_one([0.5, 0.5], C.astype(np.float64)) == (0, 0.5)
    with pytest.raises(ValueError, match="shape"):
        nearest_one(np.zeros(3, np.float32), C)
    with pytest.raises(ValueError, match="shape"):
        nearest_one(np.zeros(2, np.float32), np.zeros((0, 2), np.float32))


finite32 = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    C=arrays(np.float32, st.tuples(st.integers(1, 12), st.just(5)), elements=finite32),
    X=arrays(np.float32, st.tuples(st.integers(1, 6), st.just(5)), elements=finite32),
)
def test_any_float32_input(C: np.ndarray, X: np.ndarray) -> None:
    assert_same_as_nearest(X, C)


@settings(max_examples=100, deadline=None)
@given(
    C=arrays(np.float32, st.tuples(st.integers(1, 8), st.just(3)), elements=st.integers(-4, 4)),
    X=arrays(np.float32, st.tuples(st.integers(1, 8), st.just(3)), elements=st.integers(-4, 4)),
)
def test_small_integer_grids_full_of_ties(C: np.ndarray, X: np.ndarray) -> None:
    assert_same_as_nearest(X, C)
