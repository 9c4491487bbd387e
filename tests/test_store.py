"""Correctness of ``engine.NestedBatchStore``: the growing, shuffled sample store.

What the store promises (``engine/store.py`` and ``docs/internals/algorithm.md``, "The store"): rows
``[0, b)`` are never moved or rewritten; the tail ``[b, N)`` is a uniformly random order of
what is waiting, whatever order the stream arrives in; ``ids()`` maps each row back to its
position in the stream; bad input is rejected whole; capacity growth never invalidates
a buffer a reader holds; appends from several threads lose nothing.

The statistical tests use fixed seeds, so they are deterministic; their thresholds
(p > 0.001, 5 standard errors) would catch a biased shuffle.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from nmbatch.engine import NestedBatchStore
from nmbatch.engine.kernels.shuffle import shuffle_insert


def stream(n: int, d: int = 2, start: int = 0) -> np.ndarray:
    """Rows whose first feature is their position in the stream: ``(n, d)`` float32."""
    X = np.zeros((n, d), dtype=np.float32)
    X[:, 0] = np.arange(start, start + n)
    if d > 1:
        X[:, 1] = -X[:, 0]
    return X


def test_append_returns_n_and_ids_map_rows_to_the_stream():
    store = NestedBatchStore(2, seed=1, capacity=4)
    everything = stream(103)
    n = 0
    for chunk in np.array_split(everything, [1, 2, 10, 40, 41]):
        n = store.append(chunk)
        assert n == store.n_samples == len(store)
    assert n == 103
    ids = store.ids()
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(np.sort(ids), np.arange(103))
    np.testing.assert_array_equal(store.samples(), everything[ids])
    assert store.samples().dtype == np.float32
    assert store.batch_size == 0


def test_append_accepts_any_real_dtype_and_order():
    store = NestedBatchStore(3, seed=0)
    store.append(np.arange(6, dtype=np.int64).reshape(2, 3))
    store.append(np.asfortranarray(np.ones((2, 3), dtype=np.float64)))
    store.append(np.zeros((1, 3), dtype=bool))
    store.append([[1.5, 2.5, 3.5]])
    store.append(np.empty((0, 3)))
    assert store.n_samples == 6
    ids = store.ids()
    expect = np.array(
        [[0, 1, 2], [3, 4, 5], [1, 1, 1], [1, 1, 1], [0, 0, 0], [1.5, 2.5, 3.5]], np.float32
    )
    np.testing.assert_array_equal(store.samples(), expect[ids])


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(np.array([[1.0, np.nan]]), id="nan"),
        pytest.param(np.array([[1.0, 2.0], [np.inf, 0.0]]), id="inf"),
        pytest.param(np.array([[-np.inf, 0.0]]), id="minus-inf"),
        pytest.param(np.array([[1e39, 0.0]]), id="overflows-float32"),
        pytest.param(np.ones((2, 3)), id="wrong-dim"),
        pytest.param(np.ones(2), id="1-D"),
        pytest.param(np.ones((1, 1, 2)), id="3-D"),
        pytest.param(np.array(5.0), id="scalar"),
        pytest.param(np.array([["a", "b"]]), id="strings"),
        pytest.param(np.ones((1, 2), dtype=complex), id="complex"),
        pytest.param([[1.0, 2.0], [3.0]], id="ragged"),
        pytest.param(np.empty((0, 3)), id="empty-wrong-dim"),
    ],
)
def test_append_rejects_bad_input_and_stores_nothing(bad):
    store = NestedBatchStore(2, seed=5, capacity=4)
    store.append(stream(3))
    store.grow_batch(1)
    before = (store.samples(), store.ids(), store.n_samples, store.batch_size)
    buffer = store.data
    with pytest.raises(ValueError):
        store.append(bad)
    np.testing.assert_array_equal(store.samples(), before[0])
    np.testing.assert_array_equal(store.ids(), before[1])
    assert (store.n_samples, store.batch_size) == before[2:]
    assert store.data is buffer
    # Nothing was drawn from the shuffle generator either: the store goes on exactly
    # as one that never saw the bad request.
    clean = NestedBatchStore(2, seed=5, capacity=4)
    clean.append(stream(3))
    clean.grow_batch(1)
    for s in (store, clean):
        s.append(stream(20, start=3))
    np.testing.assert_array_equal(store.samples(), clean.samples())
    np.testing.assert_array_equal(store.ids(), clean.ids())


def test_constructor_rejects_zero_dimensions():
    with pytest.raises(ValueError):
        NestedBatchStore(0)


def test_grow_batch_never_shrinks_and_stops_at_n():
    store = NestedBatchStore(2, seed=0)
    assert store.grow_batch(5) == 0  # empty store
    store.append(stream(10))
    assert store.grow_batch(4) == 4
    assert store.grow_batch(2) == 4
    assert store.grow_batch(50) == 10
    assert store.batch_size == 10
    buffer, b = store.freeze(3)
    assert (b, store.batch_size) == (10, 10)
    assert buffer is store.data
    store.append(stream(5, start=10))
    assert store.freeze(12)[1] == 12
    assert store.freeze(100)[1] == 15


def test_prefix_is_a_read_only_view_of_the_frozen_rows():
    store = NestedBatchStore(2, seed=3)
    store.append(stream(20))
    store.grow_batch(8)
    prefix = store.prefix()
    assert prefix.shape == (8, 2)
    np.testing.assert_array_equal(prefix, store.samples()[:8])
    with pytest.raises(ValueError):
        prefix[0, 0] = 1.0
    assert store.prefix(3).shape == (3, 2)
    with pytest.raises(ValueError):
        store.prefix(9)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 15)), min_size=1, max_size=12),
)
def test_prefix_rows_are_never_moved_or_rewritten(seed, plan):
    """Interleave appends and prefix growth: every frozen row keeps its bits and its id."""
    store = NestedBatchStore(3, seed=seed, capacity=2)
    rng = np.random.default_rng(seed)
    start = 0
    for n_rows, grow in plan:
        X = rng.standard_normal((n_rows, 3)).astype(np.float32)
        X[:, 0] = np.arange(start, start + n_rows)
        start += n_rows
        b = store.batch_size
        old_data = store.samples()[:b]
        old_ids = store.ids()[:b]
        held = store.data  # a reader's buffer, possibly replaced by a capacity growth
        store.append(X)
        np.testing.assert_array_equal(store.samples()[:b], old_data)
        np.testing.assert_array_equal(store.ids()[:b], old_ids)
        np.testing.assert_array_equal(held[:b], old_data)
        store.grow_batch(b + grow)
    ids = store.ids()
    np.testing.assert_array_equal(np.sort(ids), np.arange(start))
    np.testing.assert_array_equal(store.samples()[:, 0], ids.astype(np.float32))


def test_capacity_growth_keeps_data_and_a_held_buffer_valid():
    store = NestedBatchStore(4, seed=9, capacity=1)
    store.append(stream(3, d=4))
    buffer, b = store.freeze(2)
    frozen = buffer[:b].copy()
    first_ids = store.ids()
    for i in range(10):
        store.append(stream(17, d=4, start=3 + 17 * i))
    assert store.data is not buffer
    assert store.data.shape[0] >= store.n_samples == 173
    np.testing.assert_array_equal(buffer[:b], frozen)
    np.testing.assert_array_equal(store.data[:b], frozen)
    np.testing.assert_array_equal(store.ids()[:b], first_ids[:b])
    np.testing.assert_array_equal(np.sort(store.ids()), np.arange(173))


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_growth_in_the_reserved_range_copies_nothing():
    store = NestedBatchStore(3, seed=1, capacity=2)
    assert store.grows_in_place
    start = _address(store.data)
    store.append(stream(5, d=3))
    held, b = store.freeze(4)
    for i in range(12):  # capacity 2 -> 8192 and beyond, rows never move
        store.append(stream(1000, d=3, start=5 + 1000 * i))
        assert _address(store.data) == start
    assert store.data.shape[0] >= store.n_samples == 12_005
    np.testing.assert_array_equal(held[:b], store.data[:b])
    np.testing.assert_array_equal(np.sort(store.ids()), np.arange(12_005))
    np.testing.assert_array_equal(np.sort(store.data[: store.n_samples, 0]), np.arange(12_005))


@pytest.mark.parametrize("reserve", ["refused", "small"])
def test_without_or_beyond_the_reserved_range_the_store_doubles_and_copies(
    monkeypatch: pytest.MonkeyPatch, reserve: str
) -> None:
    """Same rows, order and ids as a store that grows in place (the shuffle is the same)."""
    import nmbatch.engine.store_memory as store_module

    chunks = [stream(37, d=5, start=37 * i) for i in range(40)]
    grows = NestedBatchStore(5, seed=4, capacity=3)
    for i, X in enumerate(chunks):
        grows.append(X)
        if i % 7 == 0:
            grows.grow_batch(grows.batch_size + 50)
    if reserve == "refused":
        monkeypatch.setattr(store_module, "_reserve", lambda nbytes: None)
    else:  # room for 100 rows of d = 5 only: in place first, copies afterwards
        monkeypatch.setattr(store_module, "RESERVE_BYTES", 100 * 4 * 5)
    other = NestedBatchStore(5, seed=4, capacity=3)
    assert other.grows_in_place is (reserve == "small")
    for i, X in enumerate(chunks):
        other.append(X)
        if i % 7 == 0:
            other.grow_batch(other.batch_size + 50)
    assert not other.grows_in_place
    n = grows.n_samples
    assert other.n_samples == n == 37 * 40
    np.testing.assert_array_equal(other.data[:n], grows.data[:n])
    np.testing.assert_array_equal(other.ids(), grows.ids())


def test_same_seed_same_order_different_seed_different_order():
    def order(seed):
        store = NestedBatchStore(2, seed=seed, capacity=8)
        for i in range(10):
            store.append(stream(13, start=13 * i))
            store.grow_batch(7 * i)
        return store.ids()

    np.testing.assert_array_equal(order(4), order(4))
    assert not np.array_equal(order(4), order(5))


# ---------------------------------------------------------------------------------------
# the shuffle kernel


def python_shuffle_insert(X, swap, n, data, ids):
    """The swaps ``shuffle_insert`` documents, one python statement at a time."""
    for t in range(X.shape[0]):
        end = n + t
        r = int(swap[t])
        data[end] = data[r]
        ids[end] = ids[r]
        data[r] = X[t]
        ids[r] = end


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 20), st.integers(0, 20), st.integers(1, 25))
def test_shuffle_insert_matches_a_python_loop_of_the_same_swaps(seed, b, tail, m):
    rng = np.random.default_rng(seed)
    n = b + tail
    d = 3
    cap = n + m
    data = np.zeros((cap, d), dtype=np.float32)
    data[:n] = rng.standard_normal((n, d))
    ids = np.full(cap, -7, dtype=np.int64)
    ids[:n] = rng.permutation(n)
    X = rng.standard_normal((m, d)).astype(np.float32)
    swap = rng.integers(b, n + np.arange(m) + 1).astype(np.int64)
    data_ref, ids_ref = data.copy(), ids.copy()
    old_ids, old_prefix = ids[:n].copy(), data[:b].copy()
    python_shuffle_insert(X, swap, n, data_ref, ids_ref)
    shuffle_insert(X, swap, n, data, ids, np.arange(n, n + m, dtype=np.int64))
    np.testing.assert_array_equal(data, data_ref)
    np.testing.assert_array_equal(ids, ids_ref)
    # The prefix is untouched and nothing is lost: the rows are the old ones plus X.
    assert sorted(ids[: n + m].tolist()) == sorted([*old_ids.tolist(), *range(n, n + m)])
    np.testing.assert_array_equal(data[:b], old_prefix)


# ---------------------------------------------------------------------------------------
# the shuffle is uniform


def test_tail_is_a_uniform_permutation_whatever_the_chunking():
    """Every order of 4 waiting rows is equally likely, for every way of chunking them."""
    m, trials = 4, 2400
    perms = {p: i for i, p in enumerate(itertools.permutations(range(m)))}
    for chunks in ([4], [1, 3], [2, 2], [1, 1, 1, 1]):
        counts = np.zeros(len(perms), dtype=np.int64)
        for trial in range(trials):
            store = NestedBatchStore(1, seed=1000 * len(chunks) + trial, capacity=4)
            store.append(np.full((3, 1), -1.0))
            store.grow_batch(3)
            start = 0
            for size in chunks:
                store.append(np.arange(start, start + size, dtype=np.float32)[:, None])
                start += size
            tail = store.samples()[3:, 0]
            assert (store.samples()[:3, 0] == -1).all()
            counts[perms[tuple(int(x) for x in tail)]] += 1
        p = stats.chisquare(counts).pvalue
        assert p > 0.001, (chunks, counts)


def test_tail_stays_uniform_when_the_prefix_grows_between_appends():
    """Rows appended after a prefix growth land uniformly over the whole tail."""
    trials = 3000
    counts = np.zeros((4, 8), dtype=np.int64)  # value 6..9 -> tail position
    early = np.zeros(8, dtype=np.int64)  # where value 0 lands when it is still waiting
    for trial in range(trials):
        store = NestedBatchStore(1, seed=trial, capacity=16)
        store.append(np.arange(6, dtype=np.float32)[:, None])
        store.grow_batch(2)
        store.append(np.arange(6, 10, dtype=np.float32)[:, None])
        tail = store.samples()[2:, 0].astype(int)
        for value in range(6, 10):
            counts[value - 6, int(np.flatnonzero(tail == value)[0])] += 1
        if (tail == 0).any():
            early[int(np.flatnonzero(tail == 0)[0])] += 1
    for row in counts:
        assert stats.chisquare(row).pvalue > 0.001, counts
    assert stats.chisquare(early).pvalue > 0.001, early
    # Value 0 is in the prefix with probability 2/6.
    in_prefix = trials - early.sum()
    assert stats.binomtest(int(in_prefix), trials, 2 / 6).pvalue > 0.001


def test_sorted_stream_gives_prefixes_with_the_population_mean():
    """A stream in sorted order: each batch taken from the tail is a uniform sample."""
    n = 20000
    store = NestedBatchStore(1, seed=123, capacity=64)
    values = np.arange(n, dtype=np.float64)
    for chunk in np.array_split(values, 50):
        store.append(chunk[:, None])
    population_mean, population_sd = values.mean(), values.std()
    b_old = 0
    for b in (50, 100, 200, 400, 1000, 5000, n):
        store.grow_batch(b)
        prefix = store.prefix()[:, 0].astype(np.float64)
        se = population_sd / np.sqrt(b) * np.sqrt(max(1.0 - b / n, 0.0))
        assert abs(prefix.mean() - population_mean) <= 5 * se + 1e-9
        block = prefix[b_old:b]
        assert abs(block.mean() - population_mean) <= 5 * population_sd / np.sqrt(b - b_old)
        b_old = b


def test_sorted_stream_interleaved_with_growth_takes_uniform_subsets_of_the_waiting_rows():
    store = NestedBatchStore(1, seed=77, capacity=8)
    start = 0
    for _ in range(40):
        chunk = np.arange(start, start + 500, dtype=np.float32)
        start += 500
        store.append(chunk[:, None])
        waiting = store.samples()[store.batch_size :, 0].astype(np.float64)
        b_old = store.batch_size
        take = len(waiting) // 2
        store.grow_batch(b_old + take)
        block = store.prefix()[b_old:, 0].astype(np.float64)
        # A uniform draw without replacement of `take` rows out of `waiting`.
        se = waiting.std() / np.sqrt(take) * np.sqrt(1.0 - take / len(waiting))
        assert abs(block.mean() - waiting.mean()) <= 5 * se


# ---------------------------------------------------------------------------------------
# threads


def test_concurrent_appends_lose_nothing_and_respect_the_prefix():
    store = NestedBatchStore(2, seed=8, capacity=2)
    n_threads, n_chunks, rows = 4, 60, 7
    barrier = threading.Barrier(n_threads + 1)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            barrier.wait()
            for c in range(n_chunks):
                X = np.zeros((rows, 2), dtype=np.float32)
                X[:, 0] = w
                X[:, 1] = c * rows + np.arange(rows)
                store.append(X)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    barrier.wait()
    frozen = np.empty((0, 2), dtype=np.float32)
    while any(t.is_alive() for t in threads):
        buffer, b = store.freeze(store.batch_size + 5)
        np.testing.assert_array_equal(buffer[: frozen.shape[0]], frozen)
        frozen = buffer[:b].copy()
    for t in threads:
        t.join()
    assert not errors
    total = n_threads * n_chunks * rows
    assert store.n_samples == total
    np.testing.assert_array_equal(np.sort(store.ids()), np.arange(total))
    X = store.samples()
    np.testing.assert_array_equal(X[: frozen.shape[0]], frozen)
    got = sorted(map(tuple, X.astype(int).tolist()))
    want = sorted((w, i) for w in range(n_threads) for i in range(n_chunks * rows))
    assert got == want
    # Each writer's rows keep their stream order relative to each other in `ids`.
    ids = store.ids()
    for w in range(n_threads):
        mine = X[:, 0] == w
        order = np.argsort(ids[mine])
        np.testing.assert_array_equal(X[mine][order, 1], np.arange(n_chunks * rows))


def test_rows_of_returns_rows_by_stream_id_and_refuses_missing_ones() -> None:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(500, 3)).astype(np.float32)
    store = NestedBatchStore(3, seed=1)
    store.append(X)
    store.freeze(100)
    store.retire(before=50)
    want = np.array([499, 50, 320, 77], dtype=np.int64)
    assert np.array_equal(store.rows_of(want), X[want])
    assert store.rows_of(np.empty(0, np.int64)).shape == (0, 3)
    with pytest.raises(ValueError, match="not stored"):
        store.rows_of(np.array([10]))  # retired
    with pytest.raises(ValueError, match="not stored"):
        NestedBatchStore(3).rows_of(np.array([0]))


def test_append_in_any_order_keeps_the_ids_and_moves_the_next_id() -> None:
    X = np.arange(12, dtype=np.float32).reshape(4, 3)
    store = NestedBatchStore(3, seed=2)
    store.append(X, ids=np.array([9, 2, 30, 4]), any_order=True)
    assert sorted(store.ids().tolist()) == [2, 4, 9, 30] and store.n_ingested == 31
    assert np.array_equal(store.rows_of(np.array([30, 2])), X[[2, 1]])
    with pytest.raises(ValueError, match="increasing"):
        store.append(X[:2], ids=np.array([40, 35]))
    with pytest.raises(ValueError, match=">= 0"):
        store.append(X[:1], ids=np.array([-1]), any_order=True)
    store.append(X[:1])
    assert store.n_ingested == 32
