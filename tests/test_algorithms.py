"""Correctness of the engine's algorithms (``engine.algorithms``) on a ``NestedBatchStore``.

After every ``step()`` of an algorithm that keeps one vote per sample (nmbatch,
nmbatch.deact, elkan, lloyd; mbatch.remove over the samples it has drawn), the state must
satisfy, exactly where the math allows (see ``tests.engine_helpers.check_step_invariants``):
``S(j)/v(j)`` is the mean of the prefix rows labelled ``j``, ``v`` sums to ``b``, every
(re)assigned row went to its brute-force nearest centroid among those in force during the
step, and every lower bound holds for the centroids it was computed for and, after
subtracting ``p``, for the new ones.

Then: bounds on and off agree bit for bit, elkan and lloyd agree, the doubling rule
(``docs/internals/algorithm.md``), convergence and re-growth after new samples, streaming (also from
another thread), reproducibility, restore(), and edge cases.
"""

from __future__ import annotations

import itertools
import threading
import warnings

import numpy as np
import pytest

from nmbatch.engine import ALGORITHMS, NestedBatchStore, make_algorithm
from nmbatch.engine.algorithms import NestedMiniBatch
from tests.engine_helpers import (
    assert_sums_are_means,
    brute_nearest,
    centroids_ref,
    check_step_invariants,
    filled_store,
    snapshot,
    sqdist64_ref,
)
from tests.testkit import blobs

ONE_VOTE = ("nmbatch", "nmbatch.deact", "elkan", "lloyd")
NESTED = ("nmbatch", "nmbatch.deact", "elkan")
# The invariant tests run for both metrics: under "cosine" the stored rows are unit,
# every centroid is the normalised mean of its rows and every reassigned row sits on its
# most similar centroid (tests.engine_helpers.check_step_invariants).
METRICS = ("euclidean", "cosine")


def run_checked(algo, max_steps: int, *, all_revisited: bool = True, until_converged=True):
    """Step ``algo`` up to ``max_steps`` times, checking the invariants after each step."""
    history = []
    for _ in range(max_steps):
        before = snapshot(algo)
        s = algo.step()
        check_step_invariants(algo, before, all_revisited=all_revisited)
        assert s.iteration == algo.iteration
        history.append((before, s))
        if until_converged and s.converged:
            break
    return history


# ---------------------------------------------------------------------------------------
# invariants after every iteration


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", ONE_VOTE)
@pytest.mark.parametrize(
    ("integer", "rho", "init"),
    [(True, 100.0, "first"), (False, 100.0, "k-means++"), (False, 3.0, "first")],
)
def test_invariants_hold_after_every_iteration(name, integer, rho, init, metric):
    X = blobs(700, 3, 6, seed=4, spread=1.5, separation=6.0, integer=integer)
    store = filled_store(X, seed=2, metric=metric)
    algo = make_algorithm(name, store, 6, init=init, rho=rho, batch_size=40, random_state=3,
                          metric=metric)  # fmt: skip
    history = run_checked(algo, 80)
    assert history[-1][1].converged, "did not converge in 80 iterations"
    assert algo.batch_size == store.n_samples == 700


@pytest.mark.parametrize("name", NESTED)
def test_iteration_stats_describe_the_step(name):
    X = blobs(600, 2, 5, seed=9, spread=2.0, separation=5.0)
    store = filled_store(X, seed=1)
    k = 5
    # Without swaps: their moved rows count in n_changed too (test_swap).
    algo = make_algorithm(name, store, k, batch_size=30, rho=20.0, swap=False)
    for _ in range(60):
        before = snapshot(algo)
        s = algo.step()
        b_old, b = before.batch_size, s.batch_size
        assert b == algo.batch_size and s.n_samples == 600
        assert s.n_new == b - b_old
        assert s.n_changed == int((algo.labels()[:b_old] != before.labels).sum())
        assert s.n_distances + s.n_skipped == b * k
        assert s.n_distances >= (b - b_old) * k
        if name == "nmbatch.deact":
            assert s.n_skipped == 0
        assert s.converged == (b == 600 and b_old == b and s.n_changed == 0)
        if s.converged:
            break
    assert s.converged


@pytest.mark.parametrize("name", ONE_VOTE)
def test_n_changed_counts_only_revisited_samples(name):
    # IterationStats.n_changed counts the revisited samples whose label changed. On the
    # first step nothing is revisited, so it is 0 for every algorithm.
    X = blobs(200, 2, 3, seed=2)
    algo = make_algorithm(name, filled_store(X), 3, batch_size=50)
    assert algo.step().n_changed == 0


def test_mbatch_remove_keeps_one_vote_per_drawn_sample():
    X = blobs(500, 3, 5, seed=6, spread=1.5, separation=6.0)
    store = filled_store(X, seed=3)
    algo = make_algorithm("mbatch.remove", store, 5, batch_size=60, random_state=1)
    seen_before = 0
    for _ in range(25):
        ((_, s),) = run_checked(algo, 1, all_revisited=False, until_converged=False)
        labels = algo.labels()
        seen = int((labels >= 0).sum())
        assert seen_before <= seen <= seen_before + 60
        assert int(algo.v.sum()) == seen
        assert s.batch_size == 60
        seen_before = seen
    assert seen_before > 400  # most samples drawn at least once by now


def test_mbatch_running_averages_count_every_draw():
    X = blobs(300, 2, 4, seed=6, integer=True)
    store = filled_store(X, seed=3)
    algo = make_algorithm("mbatch", store, 4, batch_size=50, random_state=2)
    for t in range(1, 11):
        algo.step()
        assert int(algo.v.sum()) == 50 * t
        nz = algo.v > 0
        np.testing.assert_array_equal(
            algo.centroids[nz], (algo.S[nz] / algo.v[nz, None]).astype(np.float32)
        )


# ---------------------------------------------------------------------------------------
# bounds on and off, elkan and lloyd


def lockstep(names, X, k, *, steps, store_seed=0, **kwargs):
    """Run the named algorithms on twin stores (same rows, same order) one step at a time.

    Yields the list of algorithms after each step.
    """
    algos = [make_algorithm(n, filled_store(X, seed=store_seed), k, **kwargs) for n in names]
    for _ in range(steps):
        stats = [a.step() for a in algos]
        yield algos, stats
        if all(s.converged for s in stats):
            return


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bounds_on_and_off_agree_bit_for_bit(integer, seed):
    X = blobs(900, 4, 8, seed=seed, spread=2.0, separation=4.0, integer=integer)
    n_steps = 0
    for (bounded, deact), (s1, s2) in lockstep(
        ("nmbatch", "nmbatch.deact"), X, 8, steps=120, batch_size=25, rho=10.0
    ):
        n_steps += 1
        assert bounded.batch_size == deact.batch_size
        np.testing.assert_array_equal(bounded.labels(), deact.labels())
        np.testing.assert_array_equal(bounded.centroids, deact.centroids)
        np.testing.assert_array_equal(bounded.v, deact.v)
        np.testing.assert_array_equal(bounded.S, deact.S)
        assert (s1.n_changed, s1.doubled, s1.converged) == (s2.n_changed, s2.doubled, s2.converged)
    assert s1.converged and bounded.batch_size == 900
    assert n_steps > 5


# The bounded revisit has two paths: scalar distances for the open pairs, or one BLAS
# product for the listed rows when most of their pairs are open. A fraction of -1 forces
# the product for every listed row, +inf never uses it.
REVISIT_PATHS = {"dense": -1.0, "scalar": np.inf}


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("path", sorted(REVISIT_PATHS))
@pytest.mark.parametrize(("integer", "rho"), [(True, 100.0), (False, 3.0)])
def test_invariants_hold_on_either_revisit_path(path, integer, rho, metric):
    X = blobs(700, 3, 6, seed=4, spread=1.5, separation=6.0, integer=integer)
    algo = make_algorithm("nmbatch", filled_store(X, seed=2, metric=metric), 6, rho=rho,
                          batch_size=40, metric=metric)  # fmt: skip
    algo.dense_revisit_fraction = REVISIT_PATHS[path]
    history = run_checked(algo, 80)
    assert history[-1][1].converged
    revisits = [s for _, s in history if s.batch_size > s.n_new]
    assert any(s.n_skipped > 0 for s in revisits)


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_revisit_paths_agree_bit_for_bit(integer, seed):
    X = blobs(900, 4, 8, seed=seed, spread=2.0, separation=4.0, integer=integer)
    algos = []
    for path in ("dense", "scalar", "auto"):
        algo = make_algorithm("nmbatch", filled_store(X, seed=0), 8, batch_size=25, rho=10.0)
        if path != "auto":
            algo.dense_revisit_fraction = REVISIT_PATHS[path]
        algos.append(algo)
    for _ in range(120):
        stats = [a.step() for a in algos]
        first = algos[0]
        for other, s in zip(algos[1:], stats[1:], strict=True):
            assert other.batch_size == first.batch_size
            np.testing.assert_array_equal(other.labels(), first.labels())
            np.testing.assert_array_equal(other.centroids, first.centroids)
            np.testing.assert_array_equal(other.v, first.v)
            np.testing.assert_array_equal(other.S, first.S)
            np.testing.assert_allclose(other.Q, first.Q, rtol=1e-12)
            assert (s.n_changed, s.converged) == (stats[0].n_changed, stats[0].converged)
        if all(s.converged for s in stats):
            break
    assert all(s.converged for s in stats)


def test_the_first_revisit_after_a_big_move_goes_through_blas():
    # Data without clusters, centroids from single samples to means: the bounds leave most
    # pairs open, and the default revisit computes all k distances of those rows by BLAS.
    X = np.random.default_rng(0).standard_normal((2000, 50)).astype(np.float32)
    algo = make_algorithm("nmbatch", filled_store(X, seed=0), 20, batch_size=1000, rho=1e9)
    twin = make_algorithm("nmbatch", filled_store(X, seed=0), 20, batch_size=1000, rho=1e9)
    twin.dense_revisit_fraction = REVISIT_PATHS["scalar"]
    algo.step(), twin.step()
    s, s_twin = algo.step(), twin.step()
    assert s.n_new == 0 and s_twin.n_new == 0
    assert s_twin.n_distances < s.n_distances  # the scalar path computes open pairs only
    assert s_twin.n_distances > 0.45 * s.n_distances  # ... but they were most of them
    # Later revisits, with small moves, compute only the open pairs.
    for _ in range(200):
        s = algo.step()
        assert s.n_skipped >= 0
        if s.converged:
            break
    assert s.converged and s.n_skipped > 0.5 * s.batch_size * 20


@pytest.mark.parametrize("seed", [0, 1])
def test_elkan_and_lloyd_agree_on_integer_data(seed):
    X = blobs(800, 3, 7, seed=seed, spread=2.0, separation=4.0, integer=True)
    for (elkan, lloyd), (s1, s2) in lockstep(("elkan", "lloyd"), X, 7, steps=100):
        np.testing.assert_array_equal(elkan.labels(), lloyd.labels())
        np.testing.assert_array_equal(elkan.centroids, lloyd.centroids)
        assert s1.converged == s2.converged
    assert s1.converged


def test_bounds_skip_most_distances_once_settled():
    X = blobs(2000, 3, 6, seed=5, spread=0.5, separation=20.0)
    store = filled_store(X, seed=1)
    algo = make_algorithm("nmbatch", store, 6, init="k-means++", random_state=0, batch_size=2000)
    history = run_checked(algo, 30)
    last = history[-1][1]
    assert last.converged
    assert last.n_distances < 0.5 * last.batch_size * 6


# ---------------------------------------------------------------------------------------
# the doubling rule


def crafted(v, sse, p, rho=2.0) -> NestedMiniBatch:
    k = len(v)
    store = filled_store(np.zeros((k, 1), dtype=np.float32))
    algo = make_algorithm("nmbatch", store, k, rho=rho)
    algo.v = np.array(v, dtype=np.int64)
    algo.sse = np.array(sse, dtype=np.float64)
    algo.p = np.array(p, dtype=np.float64)
    return algo


@pytest.mark.parametrize(
    ("v", "sse", "p", "expect"),
    [
        pytest.param([0, 0], [0.0, 0.0], [1.0, 1.0], True, id="all-empty-ignored"),
        pytest.param([0, 5], [0.0, 1e6], [1.0, 1.0], True, id="empty-ignored"),
        pytest.param([1, 1], [3.0, 0.0], [0.0, 0.0], True, id="p0-never-blocks"),
        pytest.param([2, 9], [0.0, 0.0], [0.0, 0.0], True, id="p0-sse0"),
        pytest.param([1, 5], [0.0, 1e6], [1e-9, 1e-9], False, id="v1-with-p-blocks"),
        pytest.param([2], [8.0], [1.0], False, id="ratio-equal-rho-blocks"),
        pytest.param([2], [8.0001], [1.0], True, id="ratio-above-rho"),
        pytest.param([2, 2], [8.0001, 7.9999], [1.0, 1.0], False, id="min-over-clusters"),
        pytest.param([3, 2], [-1e-12, 8.1], [1.0, 1.0], False, id="negative-sse-clamped"),
        pytest.param([3, 2], [-1e-12, 8.1], [0.0, 1.0], True, id="negative-sse-p0"),
    ],
)
def test_doubling_test_follows_design(v, sse, p, expect):
    # sigma_C(j) = sqrt(sse / (v (v - 1))); v = 2, sse = 8 gives sigma = 2 = rho * p.
    algo = crafted(v, sse, p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by zero, no NaN
        assert algo._doubling_test(algo.rho) is expect


@pytest.mark.parametrize(
    ("v", "sse", "p", "allowed", "expect"),
    [
        pytest.param([2, 2], [8.0001, 7.9999], [1.0, 1.0], 1, True, id="one-of-one-allowed"),
        pytest.param([2, 2], [8.0, 7.9999], [1.0, 1.0], 1, False, id="two-fail-one-allowed"),
        pytest.param([2, 2], [8.0, 7.9999], [1.0, 1.0], 2, True, id="two-allowed"),
        pytest.param([1, 5], [0.0, 1e6], [1e-9, 1e-9], 1, True, id="v1-counts-as-one"),
        pytest.param([1, 2], [0.0, 8.0], [1e-9, 1.0], 1, False, id="v1-and-ratio"),
        pytest.param([1, 2], [0.0, 8.0], [0.0, 1.0], 1, True, id="unmoved-v1-not-counted"),
    ],
)
def test_doubling_test_allows_a_number_of_failing_clusters(v, sse, p, allowed, expect):
    algo = crafted(v, sse, p)
    assert algo._doubling_test(algo.rho, allowed) is expect
    assert algo._doubling_test(algo.rho, 0) is False  # the paper's test: every one passes


@pytest.mark.parametrize("rho", [1.0, 10.0, 100.0, 1e4])
def test_batch_only_grows_doubling_to_min_2b_n(rho):
    X = blobs(1000, 2, 5, seed=3, spread=1.0, separation=5.0)
    store = filled_store(X, seed=5)
    algo = make_algorithm("nmbatch", store, 5, batch_size=30, rho=rho)
    algo.b0_per_cluster = 0  # b_0 = batch_size, the paper's (growth.py: max(30, c k))
    history = run_checked(algo, 200)
    sizes = [s.batch_size for _, s in history]
    assert sizes[0] == 30 and sizes[-1] == 1000 and history[-1][1].converged
    for (_, s), (_, nxt) in itertools.pairwise(history):
        assert s.next_batch_size == (min(2 * s.batch_size, 1000) if s.doubled else s.batch_size)
        assert nxt.batch_size == s.next_batch_size
        assert s.batch_size <= nxt.batch_size <= 1000
        assert store.batch_size >= s.batch_size
    # The doubling decision is the test on the state the step left behind.
    assert history[-1][1].doubled == algo._doubling_test(rho)


def test_converges_then_grows_again_after_new_samples():
    X = blobs(3000, 3, 5, seed=8, spread=1.0, separation=8.0)
    store = NestedBatchStore(3, seed=4)
    store.append(X[:1500])
    algo = make_algorithm("nmbatch", store, 5, batch_size=100, init="k-means++", random_state=1)
    history = run_checked(algo, 200)
    assert history[-1][1].converged and algo.batch_size == 1500
    # At the fixed point: labels are the nearest of the final centroids, which are means.
    np.testing.assert_array_equal(algo.labels(), brute_nearest(store.samples(), algo.centroids)[0])
    s = algo.step()
    assert s.converged and s.n_changed == 0 and (algo.p == 0).all()
    store.append(X[1500:])
    s = algo.step()
    assert s.batch_size == 3000 and s.n_new == 1500 and not s.converged
    history = run_checked(algo, 200)
    assert history[-1][1].converged and algo.batch_size == 3000
    np.testing.assert_array_equal(algo.labels(), brute_nearest(store.samples(), algo.centroids)[0])


# ---------------------------------------------------------------------------------------
# streaming


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", ONE_VOTE)
def test_appends_between_iterations_keep_invariants_and_the_prefix(name, metric):
    X = blobs(1500, 3, 4, seed=12, spread=1.0, separation=6.0)
    store = NestedBatchStore(3, seed=6, capacity=16, metric=metric)
    store.append(X[:50])
    algo = make_algorithm(name, store, 4, batch_size=20, rho=5.0, metric=metric)
    pos = 50
    for _ in range(40):
        b = store.batch_size
        prefix = store.samples()[:b]
        ids = store.ids()[:b]
        run_checked(algo, 1)
        if pos < 1500:
            store.append(X[pos : pos + 37])
            pos += 37
        np.testing.assert_array_equal(store.samples()[:b], prefix)
        np.testing.assert_array_equal(store.ids()[:b], ids)
    history = run_checked(algo, 200)
    assert history[-1][1].converged and algo.batch_size == store.n_samples == 1500


def test_mbatch_remove_keeps_its_votes_while_the_store_grows():
    X = blobs(1200, 3, 4, seed=14, spread=1.0, separation=6.0)
    store = NestedBatchStore(3, seed=6, capacity=16)
    store.append(X[:100])
    algo = make_algorithm("mbatch.remove", store, 4, batch_size=40, random_state=0)
    for pos in range(100, 1200, 50):
        ((_, s),) = run_checked(algo, 1, all_revisited=False, until_converged=False)
        assert s.n_samples == algo.batch_size == pos
        store.append(X[pos : pos + 50])
    assert int(algo.v.sum()) == int((algo.labels() >= 0).sum()) > 500


@pytest.mark.parametrize("name", ["nmbatch", "nmbatch.deact"])
def test_appends_from_another_thread_while_stepping(name):
    X = blobs(4000, 3, 5, seed=13, spread=1.0, separation=6.0)
    store = NestedBatchStore(3, seed=7, capacity=8)
    store.append(X[:100])
    algo = make_algorithm(name, store, 5, batch_size=50, rho=5.0)
    run_checked(algo, 1)  # the first step reads the first k rows: before the writer starts
    errors: list[BaseException] = []
    stepped = threading.Event()
    stop = threading.Event()

    def writer() -> None:
        try:
            for start in range(100, 4000, 60):
                if stop.is_set():
                    return
                store.append(X[start : start + 60])
                # Pace the writer by the stepping (not by the clock), so that appends
                # interleave with many steps; the timeout only guards against a hang.
                stepped.wait(timeout=10)
                stepped.clear()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=writer)
    frozen = store.samples()[: store.batch_size]
    frozen_ids = store.ids()[: store.batch_size]
    sizes_seen = set()
    steps = 0
    thread.start()
    try:
        while True:
            writing = thread.is_alive()
            ((_, s),) = run_checked(algo, 1)
            stepped.set()
            sizes_seen.add(s.n_samples)
            steps += 1
            b_old = frozen.shape[0]
            buffer = store.data
            np.testing.assert_array_equal(buffer[:b_old], frozen)
            np.testing.assert_array_equal(store.ids()[:b_old], frozen_ids)
            frozen = np.array(buffer[: algo.batch_size])
            frozen_ids = store.ids()[: algo.batch_size]
            assert steps < 500
            if not writing and s.converged:  # this step saw every sample
                break
    finally:  # a failed check must not leave the writer waiting
        stop.set()
        stepped.set()
        thread.join()
    assert not errors
    assert len(sizes_seen) > 20  # the steps did run while the store was growing
    assert algo.batch_size == store.n_samples == 4000
    np.testing.assert_array_equal(np.sort(store.ids()), np.arange(4000))


# ---------------------------------------------------------------------------------------
# reproducibility


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("init", ["first", "k-means++"])
def test_same_seeds_give_identical_runs(name, init, metric):
    X = blobs(800, 3, 6, seed=21, spread=1.5, separation=5.0)

    def run(random_state):
        store = filled_store(X, seed=11, metric=metric)
        algo = make_algorithm(name, store, 6, init=init, batch_size=60, rho=10.0,
                              random_state=random_state, metric=metric)  # fmt: skip
        out = []
        for _ in range(12):
            algo.step()
            out.append(algo.centroids)
        return out

    a, b = run(5), run(5)
    for ca, cb in zip(a, b, strict=True):
        np.testing.assert_array_equal(ca, cb)
    if init == "k-means++" or name.startswith("mbatch"):
        c = run(6)
        assert any(not np.array_equal(ca, cc) for ca, cc in zip(a, c, strict=True))


def test_centroids_are_a_new_array_after_every_step():
    X = blobs(300, 2, 3, seed=1)
    algo = make_algorithm("nmbatch", filled_store(X), 3, batch_size=50)
    algo.step()
    published, counts = algo.centroids, algo.counts
    kept, kept_counts = published.copy(), counts.copy()
    for _ in range(5):
        algo.step()
        assert algo.centroids is not published and algo.counts is not counts
    np.testing.assert_array_equal(published, kept)
    np.testing.assert_array_equal(counts, kept_counts)
    np.testing.assert_array_equal(algo.counts, algo.v)


# ---------------------------------------------------------------------------------------
# restore


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", NESTED)
def test_restore_rebuilds_the_state_and_the_next_step_continues(name, metric):
    X = blobs(1200, 3, 5, seed=30, spread=1.5, separation=5.0)
    first = make_algorithm(name, filled_store(X, seed=9, metric=metric), 5, batch_size=100,
                           rho=5.0, metric=metric)  # fmt: skip
    for _ in range(6):
        first.step()
    C, b, it = first.centroids.copy(), first.batch_size, first.iteration

    # the log replayed: same rows in the same order (cosine: the unit rows kept as stored)
    store = filled_store(X, seed=9, metric=metric)
    algo = make_algorithm(name, store, 5, batch_size=100, rho=5.0, metric=metric)
    algo.restore(C, b, it)  # cosine: the model's unit centroids are kept bit for bit
    assert (algo.batch_size, store.batch_size, algo.iteration) == (b, b, it)
    np.testing.assert_array_equal(algo.centroids, C)
    assert (algo.p == 0).all()
    Xb = store.samples()[:b]
    labels = algo.labels()
    np.testing.assert_array_equal(labels, brute_nearest(Xb, C)[0])
    assert int(algo.v.sum()) == b
    assert_sums_are_means(algo.S, algo.v, Xb, labels)
    np.testing.assert_array_equal(algo.counts, algo.v)
    lower = algo.lower_bounds()
    if lower.shape[0]:
        assert (lower.astype(np.float64) <= np.sqrt(sqdist64_ref(Xb, C))).all()

    history = run_checked(algo, 100)
    assert history[0][1].iteration == it + 1
    assert history[-1][1].converged and algo.batch_size == 1200


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("name", NESTED)
def test_restore_of_the_whole_store_runs_on_to_the_fixed_point(name, metric):
    # Restored with b = N from centroids that are not the means of their samples: the
    # first step changes no label but moves the centroids, so it is not a fixed point.
    X = blobs(1500, 4, 6, seed=31, spread=2.0, separation=3.0)
    store = filled_store(X, seed=4, metric=metric)
    algo = make_algorithm(name, store, 6, batch_size=100, rho=5.0, swap=False, metric=metric)
    algo.restore(X[:6] + 0.5, X.shape[0], 2)
    assert algo.batch_size == X.shape[0]
    first = algo.step()
    assert first.n_changed == 0 and (algo.p > 0).any()
    assert not first.converged and not algo.converged
    history = run_checked(algo, 500)
    assert history[-1][1].converged
    # A fixed point of Lloyd's algorithm: each sample on its nearest centroid, each
    # centroid the mean of its samples.
    Xb = store.samples()
    labels = algo.labels()
    np.testing.assert_array_equal(labels, brute_nearest(Xb, algo.centroids)[0])
    assert_sums_are_means(algo.S, algo.v, Xb, labels)
    expected, has = centroids_ref(algo.S, algo.v, metric)  # S/v, or S/||S|| under cosine
    assert has.all()
    np.testing.assert_array_equal(algo.centroids, expected)


def test_restore_clamps_the_batch_to_the_store():
    X = blobs(50, 2, 3, seed=1)
    algo = make_algorithm("nmbatch", filled_store(X), 4)
    C = X[:4]
    algo.restore(C, 10_000, 3)
    assert algo.batch_size == 50
    algo2 = make_algorithm("nmbatch", filled_store(X), 4)
    algo2.restore(C, 1, 0)
    assert algo2.batch_size == 4  # at least k rows
    with pytest.raises(ValueError):
        algo2.restore(X[:3], 10, 0)
    with pytest.raises(ValueError):
        algo2.restore(np.full((4, 2), np.nan), 10, 0)


# ---------------------------------------------------------------------------------------
# edge cases


@pytest.mark.parametrize("name", ONE_VOTE)
def test_single_cluster_is_the_mean(name):
    X = blobs(400, 3, 2, seed=2)
    store = filled_store(X)
    algo = make_algorithm(name, store, 1, batch_size=32)
    run_checked(algo, 50)
    assert algo.converged and algo.batch_size == 400
    np.testing.assert_array_equal(algo.labels(), np.zeros(400))
    np.testing.assert_allclose(algo.centroids[0], X.astype(np.float64).mean(0), rtol=1e-6)
    assert algo.centroids[0].tolist() == (algo.S[0] / 400).astype(np.float32).tolist()


@pytest.mark.parametrize("name", ONE_VOTE)
def test_k_equals_n_puts_every_sample_in_its_own_cluster(name):
    X = blobs(12, 2, 12, seed=3)
    store = filled_store(X)
    algo = make_algorithm(name, store, 12, init="first")
    run_checked(algo, 10)
    assert algo.converged
    np.testing.assert_array_equal(algo.labels(), np.arange(12))
    np.testing.assert_array_equal(algo.centroids, store.samples())
    assert algo.energy_estimate() == 0.0


@pytest.mark.parametrize("name", ONE_VOTE)
def test_identical_points(name):
    X = np.full((40, 3), 2.5, dtype=np.float32)
    store = filled_store(X)
    algo = make_algorithm(name, store, 3, batch_size=8, init="k-means++", random_state=0)
    run_checked(algo, 30)
    assert algo.converged and algo.batch_size == 40
    np.testing.assert_array_equal(algo.labels(), np.zeros(40))  # ties: lowest index
    np.testing.assert_array_equal(algo.v, [40, 0, 0])
    np.testing.assert_array_equal(algo.centroids, X[:3])


@pytest.mark.parametrize("name", ONE_VOTE)
def test_duplicate_points_and_duplicate_initial_centroids(name):
    rng = np.random.default_rng(4)
    base = np.rint(5 * rng.standard_normal((6, 2)))
    X = base[rng.integers(0, 6, size=300)].astype(np.float32)
    init = np.array([base[0], base[0], base[1], base[2], base[1]], dtype=np.float32)
    algo = make_algorithm(name, filled_store(X), 5, init=init, batch_size=40, rho=3.0)
    history = run_checked(algo, 60)
    assert algo.converged
    # In the first step c1 = c0 and c4 = c2 exactly: every tie goes to the lower index,
    # and the two clusters left empty take a sample each after the update.
    first_labels = history[1][0].labels
    if getattr(algo, "relocate_empty", False):
        assert np.isin(first_labels, [1, 4]).sum() == 2
    else:
        assert not np.isin(first_labels, [1, 4]).any()


@pytest.mark.parametrize("name", ONE_VOTE)
def test_one_dimension(name):
    X = blobs(500, 1, 4, seed=5, spread=1.0, separation=10.0)
    algo = make_algorithm(name, filled_store(X), 4, batch_size=30, rho=5.0)
    run_checked(algo, 80)
    assert algo.converged


@pytest.mark.parametrize("name", ALGORITHMS)
def test_two_samples_two_clusters(name):
    X = np.array([[0.0, 1.0], [3.0, -2.0]], dtype=np.float32)
    store = filled_store(X)
    algo = make_algorithm(name, store, 2, batch_size=1)
    for _ in range(3):
        before = snapshot(algo)
        algo.step()
        if name != "mbatch":
            check_step_invariants(algo, before, all_revisited=name != "mbatch.remove")
    assert sorted(map(tuple, algo.centroids.tolist())) == sorted(map(tuple, X.tolist()))
    if name in ONE_VOTE:
        assert algo.converged


@pytest.mark.parametrize("name", ALGORITHMS)
def test_explicit_init_is_used_as_given(name):
    X = blobs(200, 2, 3, seed=8, integer=True)
    init = np.array([[100.0, 100.0], [-3.0, 0.0], [0.0, 4.0]])
    algo = make_algorithm(name, filled_store(X), 3, init=init, batch_size=200)
    before = snapshot(algo)
    np.testing.assert_array_equal(before.centroids, init.astype(np.float32))
    algo.step()
    labels = algo.labels()
    seen = labels >= 0
    nearest_init = brute_nearest(algo.store.samples()[seen], init.astype(np.float32))[0]
    # Centroids that win no sample (0 is far away) are relocated onto far samples.
    differ = labels[seen] != nearest_init
    assert int(differ.sum()) == getattr(algo, "n_relocated", 0)
    moved = labels[seen][differ]
    assert (algo.v[moved] == 1).all()
    np.testing.assert_array_equal(algo.centroids[moved], algo.store.samples()[seen][differ])


def test_first_init_uses_the_first_rows_of_the_store():
    X = blobs(100, 2, 3, seed=8)
    store = filled_store(X)
    algo = make_algorithm("nmbatch", store, 3, batch_size=100)
    first = store.samples()[:3]
    algo.step()
    np.testing.assert_array_equal(algo.labels(), brute_nearest(store.samples(), first)[0])


def test_bad_parameters_are_rejected():
    store = filled_store(blobs(10, 2, 2))
    with pytest.raises(ValueError):
        make_algorithm("kmeans", store, 2)
    with pytest.raises(ValueError):
        make_algorithm("nmbatch", store, 0)
    with pytest.raises(ValueError):
        make_algorithm("nmbatch", store, 2, batch_size=0)
    with pytest.raises(ValueError):
        make_algorithm("nmbatch", store, 2, rho=0.0)
    with pytest.raises(ValueError):
        make_algorithm("nmbatch", store, 2, init="bogus")
    with pytest.raises(ValueError):
        make_algorithm("nmbatch", store, 2, init=np.zeros((3, 2)))
    with pytest.raises(ValueError):
        make_algorithm("nmbatch", store, 2, init=np.zeros((2, 3)))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_step_needs_k_samples(name):
    store = NestedBatchStore(2, seed=0)
    store.append(np.zeros((2, 2)))
    algo = make_algorithm(name, store, 3)
    assert not algo.ready()
    with pytest.raises(ValueError):
        algo.step()
    store.append(np.ones((1, 2)))
    assert algo.ready()
    algo.step()


# ---------------------------------------------------------------------------------------
# extreme scales (values the store accepts)


@pytest.mark.parametrize("name", ONE_VOTE)
@pytest.mark.parametrize(
    "scale",
    [
        1e-15,
        1e-3,
        1e4,
        1e17,
        # float32 under/overflow inside the kernels (see test_kernels' extreme-scale tests)
        pytest.param(1e-22, id="1e-22-dot-underflow"),
        pytest.param(1e-19, id="1e-19-square-underflow"),
        pytest.param(1e19, id="1e19-square-overflow"),
    ],
)
def test_invariants_at_any_scale(name, scale):
    X = blobs(300, 2, 4, seed=1, spread=1.0, separation=5.0) * np.float32(scale)
    algo = make_algorithm(name, filled_store(X), 4, batch_size=40, rho=10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run_checked(algo, 40)


@pytest.mark.parametrize("name", ONE_VOTE)
def test_overflowing_distances_leave_no_sample_unassigned(name):
    # x = 0 is 1e20 from both initial centroids (ties: c0); -3e6 has one candidate
    # whose float32 distance overflows to inf, so assign_dense labels it -1 and gives
    # its vote to S[k - 1]. Later, c1 = 1e6 is nearer to 0 than c0 = -1.5e6, but the
    # bound l(0, c1) = inf never lets nmbatch/elkan look at it.
    X = np.array([[0.0], [-3e6], [1e6], [1e6]], dtype=np.float32)
    store = filled_store(X)
    init = np.array([[-1e20], [1e20]], dtype=np.float32)
    algo = make_algorithm(name, store, 2, init=init, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        run_checked(algo, 5)


def test_state_counts_the_engine_memory():
    X = blobs(3000, 8, 4, seed=5)
    store = filled_store(X, seed=1)
    algo = make_algorithm("nmbatch", store, 10, batch_size=500)
    state = algo.state(algo.step())
    b, k = algo.batch_size, 10
    # At least the rows, their ids, the lower bounds and the labels of the prefix.
    floor = X.shape[0] * (8 * 4 + 8) + b * (k * 4 + 4)
    assert state.engine_bytes >= floor
    assert state.engine_bytes == store.nbytes + algo.nbytes()
    store.append(blobs(20_000, 8, 4, seed=6))
    for _ in range(10):
        algo.step()
    assert algo.state().engine_bytes > state.engine_bytes
