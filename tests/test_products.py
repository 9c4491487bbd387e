"""Chunked BLAS products (``engine.products``): the same numbers at every thread count."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from nmbatch.engine import products as products_module
from nmbatch.engine.products import (
    CHUNKS_PER_THREAD,
    DOTS_BYTES,
    PRODUCT_ROWS,
    chunk_product,
    chunks_at_once,
    products,
)
from nmbatch.engine.threads import kernel_threads, thread_limits


def _rows(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted int64 rows: all of them, most of them (multiplied in place), or a few of
    them (gathered)."""
    if kind == "contiguous":
        return np.arange(n, dtype=np.int64)
    keep = 0.9 if kind == "dense" else 0.2
    return np.flatnonzero(rng.random(n) < keep).astype(np.int64)


@pytest.mark.parametrize("pool", [True, False])
@pytest.mark.parametrize("kind", ["contiguous", "dense", "sparse"])
def test_products_are_the_chunks_products_at_any_thread_count(kind, pool, monkeypatch):
    # pool: chunks this small go to the pool threads too (else: the calling thread).
    monkeypatch.setattr(products_module, "MIN_POOL_WORK", 0 if pool else 2**62)
    rng = np.random.default_rng(5)
    n, d, k = 3 * PRODUCT_ROWS + 1000, 33, 17
    X = rng.normal(size=(n, d)).astype(np.float32)
    Ct = np.ascontiguousarray(rng.normal(size=(k, d)).astype(np.float32).T)
    rows = _rows(kind, n, rng)
    m = rows.shape[0]
    # One thread, chunk after chunk: the reference (a row's product may depend on its
    # place in the BLAS call, so the reference makes the same calls); and the formula.
    want = np.empty((m, k), dtype=np.float32)
    for s in range(0, m, PRODUCT_ROWS):
        chunk_product(X, rows[s : s + PRODUCT_ROWS], Ct, want[s : s + PRODUCT_ROWS])
    np.testing.assert_allclose(want, X[rows].astype(np.float64) @ Ct, rtol=1e-4, atol=1e-4)
    for threads in (1, 2, 3):  # 3: above this machine's cores, if numba's pool has them
        with kernel_threads(threads):  # as the algorithms run: BLAS on one thread
            out = np.full((m + 7, k), np.nan, dtype=np.float32)
            got = products(X, rows, Ct, out)
        assert got.shape == (m, k) and np.shares_memory(got, out)
        assert np.array_equal(got, want), threads
        assert np.isnan(out[m:]).all()  # nothing past m written


def test_chunk_product_of_one_row_and_of_overflowing_values():
    X = np.array([[3e38, 3e38], [1.0, 2.0], [0.0, 1.0]], dtype=np.float32)
    Ct = np.array([[2.0], [1.0]], dtype=np.float32)
    out = np.empty((2, 1), dtype=np.float32)
    chunk_product(X, np.array([0, 2]), Ct, out)  # overflow: inf, no warning raised
    assert np.isinf(out[0, 0]) and out[1, 0] == 1.0
    one = np.empty((1, 1), dtype=np.float32)
    chunk_product(X, np.array([1]), Ct, one)
    assert one[0, 0] == 4.0


def test_chunks_at_once_is_a_fixed_buffer_per_thread_within_the_memory_cap():
    big_k = DOTS_BYTES // (PRODUCT_ROWS * 4) + 1  # one chunk alone passes the cap
    for threads in (1, 2):
        with thread_limits(threads):
            n = numba.get_num_threads()
            assert chunks_at_once(50) == CHUNKS_PER_THREAD * n
            assert chunks_at_once(big_k) == n
            mid_k = DOTS_BYTES // (PRODUCT_ROWS * 4 * (CHUNKS_PER_THREAD * n - 1))
            assert n <= chunks_at_once(mid_k) < CHUNKS_PER_THREAD * n
            assert chunks_at_once(mid_k) * PRODUCT_ROWS * mid_k * 4 <= DOTS_BYTES
