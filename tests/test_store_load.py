"""``NestedBatchStore.load``: a whole array in a uniformly random order, copied lazily.

What ``load`` promises (``engine/store.py``): row ``r`` is ``X[order[r]]`` for a uniformly
random permutation ``order`` drawn from the store's seed, so every prefix is a uniformly
random subset and the tail a uniformly random order; every row is stored exactly once;
rows are copied only as the prefix reaches them, or when anything reads or moves rows
past it, and never rewritten after; the result does not depend on when they are copied.
``fit`` loads its input this way and lets go of it before it returns.

The statistical tests use fixed seeds, so they are deterministic; their threshold
(p > 0.001) would catch a biased order.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from nmbatch.engine import NestedBatchStore, NestedMiniBatchKMeans
from nmbatch.engine.kernels.shuffle import shuffle_order
from tests.testkit import blobs


def numbered(n: int, d: int = 3) -> np.ndarray:
    """Rows whose every feature is ``1000 * i + j``: ``(n, d)`` float32, all distinct."""
    return (1000.0 * np.arange(n)[:, None] + np.arange(d)[None, :]).astype(np.float32)


def test_every_row_is_stored_once_under_its_index_as_id():
    X = numbered(50)
    store = NestedBatchStore(3, seed=4, capacity=8)
    assert store.load(X, first=7) == 50
    assert store.n_samples == 50 and store.n_loaded == 7 and store.batch_size == 0
    ids = store.ids()
    assert sorted(ids.tolist()) == list(range(50))
    rows = store.samples()  # finishes the load
    assert store.n_loaded == 50
    np.testing.assert_array_equal(rows, X[ids])
    np.testing.assert_array_equal(store.rows_of(np.arange(50)), X)


@pytest.mark.parametrize("m", [1, 2, 7, 300])
def test_shuffle_order_is_a_python_loop_of_the_same_swaps(m):
    swap = np.random.default_rng(m).integers(0, np.arange(m) + 1)
    expected: list[int] = []
    for t in range(m):  # inside-out Fisher-Yates: row t to swap[t], the row there to t
        expected.append(t)
        r = int(swap[t])
        expected[t], expected[r] = expected[r], t
    order = np.empty(m, dtype=np.int64)
    shuffle_order(swap, order)
    assert order.tolist() == expected


@pytest.mark.parametrize("n, first", [(1, 0), (257, 0), (257, 40), (1000, 1000)])
def test_load_is_append_bit_for_bit(n, first):
    # The same rows in the same places with the same ids, and the generator left in the
    # same state: a fit that loads is the fit that appended.
    X = np.random.default_rng(n).normal(size=(n, 5)).astype(np.float32)
    appended, loaded = NestedBatchStore(5, seed=11), NestedBatchStore(5, seed=11)
    appended.append(X)
    loaded.load(X, first=first)
    assert np.array_equal(loaded.data, appended.data)
    assert np.array_equal(loaded.ids(), appended.ids())
    more = X[: n // 2 + 1] + 1.0
    appended.append(more)
    loaded.append(more)
    assert np.array_equal(loaded.data, appended.data)
    assert np.array_equal(loaded.ids(), appended.ids())


def test_rows_are_copied_as_the_prefix_reaches_them_and_never_rewritten():
    X = numbered(40)
    store = NestedBatchStore(3, seed=1, capacity=40)
    store.load(X)
    assert store.n_loaded == 0
    data, b = store.freeze(5)
    assert b == 5 and store.n_loaded == 5
    held = data[:5].copy()
    assert store.grow_batch(12) == 12 and store.n_loaded == 12
    data, b = store.freeze(30)
    assert b == 30 and store.n_loaded == 30
    np.testing.assert_array_equal(data[:5], held)
    np.testing.assert_array_equal(data[:30], X[store.ids()[:30]])
    view = store.prefix()
    assert view.shape == (30, 3) and not view.flags.writeable


def test_the_order_does_not_depend_on_when_rows_are_copied():
    X = numbered(300)
    eager = NestedBatchStore(3, seed=9, capacity=300)
    eager.load(X, first=300)
    lazy = NestedBatchStore(3, seed=9, capacity=1)
    lazy.load(X)
    for b in (1, 2, 7, 64, 65, 200, 300):
        lazy.freeze(b)
    np.testing.assert_array_equal(eager.samples(), lazy.samples())
    np.testing.assert_array_equal(eager.ids(), lazy.ids())
    other = NestedBatchStore(3, seed=10, capacity=300)
    other.load(X)
    assert not np.array_equal(other.ids(), eager.ids())


def test_the_order_is_a_uniform_permutation_whatever_the_first_batch():
    """All 24 orders of 4 rows are equally likely, copied at once or by the prefix."""
    m, trials = 4, 2400
    perms = {p: i for i, p in enumerate(itertools.permutations(range(m)))}
    for first, grow in ((0, ()), (4, ()), (1, (2,)), (2, (3, 4))):
        counts = np.zeros(len(perms), dtype=np.int64)
        for trial in range(trials):
            store = NestedBatchStore(1, seed=10_000 * first + trial, capacity=4)
            store.load(np.arange(m, dtype=np.float32)[:, None], first=first)
            for b in grow:
                store.grow_batch(b)
            counts[perms[tuple(int(x) for x in store.samples()[:, 0])]] += 1
        assert stats.chisquare(counts).pvalue > 0.001, (first, counts)


def test_a_prefix_is_a_uniform_subset_and_its_tail_a_uniform_order():
    """n = 6, b = 2: each of the 15 prefixes (as sets) and, given one, each of the 24 tail
    orders, is equally likely."""
    trials = 3000
    subsets = {s: i for i, s in enumerate(itertools.combinations(range(6), 2))}
    prefix_counts = np.zeros(len(subsets), dtype=np.int64)
    tails: dict[tuple[int, ...], int] = {}
    for trial in range(trials):
        store = NestedBatchStore(1, seed=trial, capacity=6)
        store.load(np.arange(6, dtype=np.float32)[:, None], first=2)
        store.grow_batch(2)
        rows = store.samples()[:, 0].astype(int)
        prefix_counts[subsets[tuple(sorted(rows[:2].tolist()))]] += 1
        if set(rows[:2].tolist()) == {0, 1}:
            tail = tuple(rows[2:].tolist())
            tails[tail] = tails.get(tail, 0) + 1
    assert stats.chisquare(prefix_counts).pvalue > 0.001, prefix_counts
    assert len(tails) <= 24
    tail_counts = np.array([tails.get(p, 0) for p in itertools.permutations(range(2, 6))])
    assert stats.chisquare(tail_counts).pvalue > 0.001, tail_counts


def test_append_and_retire_during_a_load_finish_it_first():
    X = numbered(20)
    store = NestedBatchStore(3, seed=3, capacity=4)
    store.load(X, first=3)
    store.grow_batch(3)
    prefix = store.samples()[:3].copy()
    assert store.append(numbered(5)[:, :] + 0.5) == 25
    assert store.n_loaded == 25
    np.testing.assert_array_equal(store.samples()[:3], prefix)
    assert sorted(store.ids().tolist()) == list(range(25))
    np.testing.assert_array_equal(store.rows_of(np.arange(20)), X)

    again = NestedBatchStore(3, seed=3, capacity=4)
    again.load(X, first=3)
    again.grow_batch(3)
    out = again.retire(ids=np.array([0, 1, 2, 19]))
    assert out.n_retired == 4 and again.n_samples == 16 and again.n_loaded == 16
    ids = again.ids()
    assert sorted(ids.tolist()) == list(range(3, 19))
    np.testing.assert_array_equal(again.samples(), X[ids])


def test_data_finishes_the_load_and_ids_follow_the_next_id():
    store = NestedBatchStore(2, seed=0, capacity=8)
    store.append(numbered(3, 2))
    store.retire(before=3)  # empty again, next id 3
    assert store.n_samples == 0 and store.n_ingested == 3
    X = numbered(6, 2)
    store.load(X)
    assert store.n_ingested == 9 and sorted(store.ids().tolist()) == list(range(3, 9))
    assert store.n_loaded == 0
    data = store.data
    assert store.n_loaded == 6
    np.testing.assert_array_equal(data[:6], X[store.ids() - 3])


def test_load_refuses_a_non_empty_store_and_bad_input_unchanged():
    store = NestedBatchStore(2, seed=0)
    bad = numbered(4, 2)
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        store.load(bad)
    with pytest.raises(ValueError, match="float32"):
        store.load(numbered(4, 2).astype(np.float64), checked=True)
    assert store.n_samples == 0 and store.n_ingested == 0
    store.load(numbered(4, 2).astype(np.float64))  # unchecked input is converted
    with pytest.raises(ValueError, match="empty store"):
        store.load(numbered(4, 2))
    empty = NestedBatchStore(2, seed=0)
    assert empty.load(np.empty((0, 2), np.float32)) == 0 and empty.n_samples == 0


# ---------------------------------------------------------------------------------------
# fit loads its input this way


def _digest(est: NestedMiniBatchKMeans) -> tuple[bytes, bytes]:
    return est.cluster_centers_.tobytes(), est.labels_.tobytes()


def test_fit_stores_every_row_once_and_lets_go_of_the_callers_array():
    X = blobs(3000, 5, 8, seed=2)
    est = NestedMiniBatchKMeans(n_clusters=8, batch_size=200, random_state=0,
                                max_iter=2).fit(X)  # fmt: skip
    store = est._store
    assert store.n_loaded == store.n_samples == 3000 and store._source is None
    ids = store.ids()
    before = store.samples()
    np.testing.assert_array_equal(before, X[ids])
    X[:] = 0.0  # the caller's array is the caller's again
    np.testing.assert_array_equal(est._store.samples(), before)


def test_fit_is_the_same_whatever_the_thread_count_and_stopped_early():
    X = blobs(6000, 6, 12, seed=5)
    models = [NestedMiniBatchKMeans(n_clusters=12, batch_size=300, random_state=7,
                                    n_threads=t).fit(X) for t in (1, 2)]  # fmt: skip
    assert _digest(models[0]) == _digest(models[1])
    assert models[0].n_samples_seen_ == 6000
    # Stopped before the batch is the whole store: the store is complete all the same.
    early = NestedMiniBatchKMeans(n_clusters=12, batch_size=300, random_state=7,
                                  max_iter=1).fit(X)  # fmt: skip
    assert early.batch_size_ == 300 and early._store.n_loaded == 6000
    np.testing.assert_array_equal(early._store.samples(), X[early._store.ids()])


def test_init_first_is_the_first_k_rows_of_the_shuffled_store():
    X = blobs(2000, 4, 6, seed=1)
    first = NestedMiniBatchKMeans(n_clusters=6, batch_size=120, init="first",
                                  random_state=3, max_iter=3).fit(X)  # fmt: skip
    given = X[first._store.ids()[:6]]
    explicit = NestedMiniBatchKMeans(n_clusters=6, batch_size=120, init=given,
                                     random_state=3, max_iter=3).fit(X)  # fmt: skip
    assert _digest(first) == _digest(explicit)


# ---------------------------------------------------------------------------------------
# the finiteness check of every input, one pass without a temporary


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, None])
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (300, 17)])
def test_all_finite_matches_numpy(bad, shape):
    from nmbatch.engine._validation import all_finite

    rng = np.random.default_rng(shape[0])
    A = (rng.standard_normal(shape) * 1e30).astype(np.float32)
    A[0, 0] = np.finfo(np.float32).max
    if bad is not None:
        for at in ((0, 0), (shape[0] - 1, shape[1] - 1), (shape[0] // 2, shape[1] // 2)):
            B = A.copy()
            B[at] = bad
            assert all_finite(B) == bool(np.isfinite(B).all()) is False
    assert all_finite(A) == bool(np.isfinite(A).all()) is True
