"""Group bounds (``bounds="group"``) and Hamerly's single bound (``bounds="hamerly"``).

- Each kernel of ``engine.kernels.grouped`` against a plain numpy version of the same
  formula: the sweep's rounded update and its list of open rows, the settle pass, the
  dense pass (its group bounds are the numpy minimum, over each group but the label, of
  the full dense pass's per-centroid bounds, bit for bit), and the reassignment
  (brute-force nearest, sums from scratch, every group bound below the true minimum).
- nmbatch with every bound mode: the same centroids, labels and sums bit for bit as with
  full bounds, the invariants of ``check_step_invariants`` after every step (with empty
  clusters relocated, with retirements, on both revisit paths), reproducible from the
  seed, and the memory per sample each mode promises.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import bounds_memory
from nmbatch.engine import NestedBatchStore, NestedMiniBatchKMeans, make_algorithm
from nmbatch.engine.algorithms import DENSE_REVISIT_FRACTION
from nmbatch.engine.algorithms.bounds import (
    FULL_BOUNDS_BUDGET,
    MAX_GROUPS,
    FullBounds,
    GroupBounds,
    form_groups,
    full_to_group,
    make_bounds,
    resolve_bound_mode,
)
from nmbatch.engine.hosting import feed
from nmbatch.engine.kernels import assign_dense, sqdist32_error
from nmbatch.engine.kernels.common import DOWN32, UP, UP32
from nmbatch.engine.kernels.grouped import (
    group_drift,
    group_sweep,
    reassign_grouped_rows,
    settle_assigned_grouped,
)
from nmbatch.engine.kernels.grouped_dense import assign_dense_grouped
from nmbatch.engine.retention import WindowRetention
from tests.engine_helpers import (
    assert_sums_are_means,
    brute_nearest,
    check_retire_invariants,
    check_step_invariants,
    filled_store,
    lockstep,
    row_state,
    snapshot,
    sqdist64_ref,
)
from tests.testkit import blobs

MODES = ("full", "group", "hamerly")


# -- helpers ------------------------------------------------------------------------------
def grouping(k: int, G: int, seed: int) -> tuple[np.ndarray, ...]:
    """A random grouping with every group non-empty: ``group_of, members, starts, sizes``."""
    rng = np.random.default_rng(seed)
    group_of = np.concatenate([np.arange(G), rng.integers(0, G, size=k - G)])
    group_of = rng.permutation(group_of).astype(np.int32)
    sizes = np.bincount(group_of, minlength=G).astype(np.int64)
    members = np.argsort(group_of, kind="stable").astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return group_of, members, starts, sizes


def true_group_min(X, C, labels, group_of, G) -> np.ndarray:
    """``min { ||x(i) - c(j)|| : group_of[j] == g, j != a(i) }`` (inf if none): (n, G)."""
    D = np.sqrt(sqdist64_ref(X, C))
    D[np.arange(X.shape[0]), labels] = np.inf
    out = np.full((X.shape[0], G), np.inf)
    for g in range(G):
        cols = group_of == g
        if cols.any():
            out[:, g] = D[:, cols].min(axis=1)
    return out


def dense_state(X, C, group_of, G):
    """Fresh assignment of every row with :func:`assign_dense_grouped`."""
    n, k = X.shape[0], C.shape[0]
    st = {
        "labels": np.full(n, -1, dtype=np.int32), "dist2": np.zeros(n),
        "S": np.zeros((k, X.shape[1])), "v": np.zeros(k, dtype=np.int64),
        "sse": np.zeros(k), "Q": np.zeros(k),
    }  # fmt: skip
    lower = np.zeros((n, G), dtype=np.float32)
    upper = np.zeros(n)
    assign_dense_grouped(
        X, np.arange(n, dtype=np.int64), C, dots=X @ C.T, cc=(C.astype(np.float64) ** 2).sum(1),
        lower_bounds=lower, upper_bounds=upper, group_of=group_of, **st,
    )  # fmt: skip
    return st, lower, upper


def data(seed: int, n: int, k: int, d: int, integer: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * 3
    C = X[rng.choice(n, size=k, replace=False)] + rng.normal(size=(k, d)) * 0.5
    if integer:
        X, C = np.rint(X), np.rint(C)
        C[1] = C[0]  # duplicate centroids: exact ties go to the lower index
    return X.astype(np.float32), C.astype(np.float32)


# -- kernels against numpy ----------------------------------------------------------------
def test_group_drift_is_the_largest_move_in_each_group():
    rng = np.random.default_rng(0)
    group_of, *_ = grouping(30, 7, 0)
    p = rng.random(30)
    want = np.array([max(p[j] for j in range(30) if group_of[j] == g) for g in range(7)])
    np.testing.assert_array_equal(group_drift(p, group_of, 7), want)


@pytest.mark.parametrize("seed", range(4))
def test_group_sweep_is_the_numpy_formula(seed):
    rng = np.random.default_rng(seed)
    n, k, G = 200, 23, 5
    group_of, _, _, sizes = grouping(k, G, seed)
    labels = rng.integers(0, k, size=n).astype(np.int32)
    upper = rng.random(n) * 4
    lower = (rng.random((n, G)) * 6 - 0.5).astype(np.float32)
    p = rng.random(k) * rng.choice([0.0, 0.3], size=k)
    pmax = group_drift(p, group_of, G)
    lower0, upper0 = lower.copy(), upper.copy()

    todo, n_open = group_sweep(p, pmax, group_of, sizes, labels, upper, lower)

    want_lower = (lower0 - (pmax * UP32).astype(np.float32)) * np.float32(DOWN32)
    np.testing.assert_array_equal(lower, want_lower.astype(np.float32))
    want_upper = (upper0 + p[labels]) * UP
    np.testing.assert_array_equal(upper, want_upper)
    is_open = want_lower <= (want_upper * UP32).astype(np.float32)[:, None]
    listed = np.flatnonzero(is_open.any(axis=1))
    np.testing.assert_array_equal(todo, listed)
    own_open = is_open[np.arange(n), group_of[labels]]
    pairs = (is_open * sizes).sum(1) - own_open + 1
    assert n_open == int(pairs[listed].sum())
    # Sound: the swept bound is at most the old bound minus the largest move of the group
    # (or at most 0, which bounds any distance, where that is negative).
    assert (lower.astype(np.float64) <= np.maximum(lower0 - pmax[None, :], 0.0)).all()


@pytest.mark.parametrize("seed", range(3))
def test_settle_assigned_grouped_is_the_numpy_formula(seed):
    X, C = data(seed, 150, 12, 5, integer=False)
    G = 4
    group_of, _, _, sizes = grouping(12, G, seed)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 12, size=150).astype(np.int32)
    lower = (rng.random((150, G)) * 8).astype(np.float32)
    upper = np.full(150, 1e9)
    s = np.zeros(150)
    rows = np.flatnonzero(rng.random(150) < 0.6).astype(np.int64)
    g = sqdist32_error(5)

    todo, n_open = settle_assigned_grouped(
        X, rows, C, g, group_of, sizes, labels, upper, lower, s
    )

    exact = sqdist64_ref(X, C)[rows, labels[rows]]
    assert (np.abs(s[rows] - exact) <= g * exact + 1e-30).all()
    u = np.sqrt(s[rows] / (1 - g))
    np.testing.assert_array_equal(upper[rows], u * UP)
    assert (upper[rows] >= np.sqrt(exact)).all()
    is_open = lower[rows] <= (u * UP32).astype(np.float32)[:, None]
    np.testing.assert_array_equal(todo, rows[is_open.any(axis=1)])
    own_open = is_open[np.arange(rows.shape[0]), group_of[labels[rows]]]
    pairs = (is_open * sizes).sum(1) - own_open + 1
    assert n_open == int(pairs[is_open.any(axis=1)].sum())


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("overflow", [False, True])
@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize(("seed", "G"), [(0, 1), (1, 3), (2, 9), (3, 20)])
def test_assign_dense_grouped_is_the_group_minimum_of_the_full_bounds(seed, G, integer, overflow):
    """``overflow``: some rows' float32 products overflow (their estimates are unknown)."""
    X, C = data(seed, 300, 20, 6, integer)
    if overflow:
        X[:5] *= np.float32(3e37)
        assert not np.isfinite(X[:5] @ C.T).all()
    group_of, *_ = grouping(20, G, seed)
    st, lower, upper = dense_state(X, C, group_of, G)
    # The full dense pass on the same input, reduced to groups in numpy.
    n, k = X.shape[0], C.shape[0]
    ref = {
        "labels": np.full(n, -1, dtype=np.int32), "dist2": np.zeros(n),
        "S": np.zeros((k, 6)), "v": np.zeros(k, dtype=np.int64), "sse": np.zeros(k),
        "Q": np.zeros(k),
    }  # fmt: skip
    full = np.zeros((n, k), dtype=np.float32)
    ref_upper = np.zeros(n)
    assign_dense(
        X, np.arange(n, dtype=np.int64), C, dots=X @ C.T, cc=(C.astype(np.float64) ** 2).sum(1),
        lower_bounds=full, upper_bounds=ref_upper, **ref,
    )  # fmt: skip
    masked = full.copy()
    masked[np.arange(n), ref["labels"]] = np.finfo(np.float32).max
    want = np.stack(
        [masked[:, group_of == g].min(axis=1) for g in range(G)], axis=1
    ).astype(np.float32)
    np.testing.assert_array_equal(lower, want)
    np.testing.assert_array_equal(upper, ref_upper)
    for key in ("labels", "dist2", "S", "v", "sse", "Q"):
        np.testing.assert_array_equal(st[key], ref[key])
    want_labels, _ = brute_nearest(X, C)
    np.testing.assert_array_equal(st["labels"], want_labels)
    assert (lower <= true_group_min(X, C, st["labels"], group_of, G)).all()


@pytest.mark.parametrize("known", [False, True])
@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize(("seed", "G"), [(0, 1), (1, 4), (2, 7), (3, 25)])
def test_reassign_grouped_moves_rows_to_their_nearest_with_sound_bounds(seed, G, integer, known):
    X, C_old = data(seed, 400, 25, 5, integer)
    group_of, members, starts, sizes = grouping(25, G, seed)
    st, lower, upper = dense_state(X, C_old, group_of, G)
    rng = np.random.default_rng(seed + 10)
    C = C_old + rng.normal(size=C_old.shape).astype(np.float32) * rng.choice([0.0, 0.4], size=(25, 1)).astype(np.float32)  # noqa: E501
    if integer:
        C = np.rint(C).astype(np.float32)
    p = np.sqrt(((C.astype(np.float64) - C_old) ** 2).sum(1)) * (1 + 1e-9)
    pmax = group_drift(p, group_of, G)
    labels = st["labels"]
    rows, _ = group_sweep(p, pmax, group_of, sizes, labels, upper, lower)
    s_assigned = np.zeros(400)
    if known:
        rows, _ = settle_assigned_grouped(
            X, rows, C, sqdist32_error(5), group_of, sizes, labels, upper, lower, s_assigned
        )
    listed = np.zeros(400, dtype=bool)
    listed[rows] = True
    old_labels = labels.copy()

    changed, _ = reassign_grouped_rows(
        X, rows, C, group_of=group_of, members=members, starts=starts, p=p, pmax=pmax,
        labels=labels, upper_bounds=upper, lower_bounds=lower, S=st["S"], v=st["v"],
        Q=st["Q"], assigned_sqdist=s_assigned if known else None,
    )  # fmt: skip

    want, _ = brute_nearest(X, C)
    np.testing.assert_array_equal(labels, want)  # listed or settled by the bounds: nearest
    assert changed == int((labels != old_labels).sum())
    assert not (labels != old_labels)[~listed].any()
    assert_sums_are_means(st["S"], st["v"], X, labels)
    norms = (X.astype(np.float64) ** 2).sum(1)
    np.testing.assert_allclose(st["Q"], np.bincount(labels, weights=norms, minlength=25))
    assert (lower <= true_group_min(X, C, labels, group_of, G)).all()
    d_own = np.sqrt(sqdist64_ref(X, C)[np.arange(400), labels])
    assert (upper >= d_own).all()


def test_form_groups_is_deterministic_and_fills_every_group():
    C = blobs(1_000, 6, 40, seed=1)
    a = form_groups(C, 100)
    np.testing.assert_array_equal(a, form_groups(C.copy(), 100))
    assert a.dtype == np.int32 and np.bincount(a, minlength=100).min() >= 1
    assert (form_groups(C, 1) == 0).all()
    same = np.tile(C[:1], (30, 1))  # identical centroids: Lloyd leaves groups empty
    assert np.bincount(form_groups(same, 7), minlength=7).min() >= 1


def test_auto_keeps_full_bounds_while_they_are_no_bigger_than_the_row():
    assert resolve_bound_mode("auto", 50, 2) == ("full", 50)
    assert resolve_bound_mode("auto", 256, 2) == ("full", 256)
    assert resolve_bound_mode("auto", 257, 2) == ("group", 26)
    assert resolve_bound_mode("auto", 784, 784) == ("full", 784)  # MNIST rows
    assert resolve_bound_mode("auto", 1_024, 784) == ("group", 103)
    assert resolve_bound_mode("auto", 1_024, 108) == ("group", 103)  # patches
    assert resolve_bound_mode("auto", 16_384, 784) == ("group", MAX_GROUPS)
    assert resolve_bound_mode("hamerly", 16_384) == ("hamerly", 1)
    # auto with a large k: full bounds under a memory budget, group bounds past it.
    auto = make_bounds("auto", 1_024, 784)
    assert isinstance(auto, FullBounds) and auto.budget == FULL_BOUNDS_BUDGET
    rows = FULL_BOUNDS_BUDGET // 4_096
    assert not auto.too_big(rows) and auto.too_big(rows + 1)
    assert make_bounds("auto", 50, 784).budget is None
    assert not make_bounds("full", 10**5).too_big(10**9)
    assert resolve_bound_mode("group", 3) == ("group", 1)
    with pytest.raises(ValueError, match="bounds must be one of"):
        make_bounds("elkan", 5)


# -- nmbatch with each bound mode -------------------------------------------------------
def lockstep_modes(X, k, *, steps, modes=MODES, **kwargs):
    """The same nmbatch run with each bound mode, one step at a time (checked)."""
    algos = [
        make_algorithm("nmbatch", filled_store(X, seed=0), k, bounds=m, **kwargs) for m in modes
    ]
    return lockstep(algos, steps)


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_bound_mode_gives_the_same_run_bit_for_bit(integer, seed):
    X = blobs(1_500, 4, 30, seed=seed, spread=2.0, separation=4.0, integer=integer)
    modes = (*MODES, "auto")
    for algos, stats in lockstep_modes(X, 40, steps=150, modes=modes, batch_size=60, rho=10.0):
        first = algos[0]
        for other, s in zip(algos[1:], stats[1:], strict=True):
            np.testing.assert_array_equal(other.labels(), first.labels())
            np.testing.assert_array_equal(other.centroids, first.centroids)
            np.testing.assert_array_equal(other.S, first.S)
            np.testing.assert_array_equal(other.v, first.v)
            assert (s.n_changed, s.n_relocated, s.doubled) == (
                stats[0].n_changed, stats[0].n_relocated, stats[0].doubled,
            )  # fmt: skip
    assert all(s.converged for s in stats)
    assert [a.bound_mode for a in algos] == ["full", "group", "hamerly", "full"]


@pytest.mark.parametrize("mode", ["group", "hamerly"])
def test_group_bounds_skip_distances(mode):
    X = blobs(6_000, 5, 60, seed=4, spread=1.0, separation=8.0)
    algo = make_algorithm("nmbatch", filled_store(X), 300, bounds=mode, batch_size=1_000,
                          random_state=0)  # fmt: skip
    skipped = 0
    for _ in range(30):
        stats = algo.step()
        if stats.batch_size > stats.n_new:
            skipped += stats.n_skipped
    assert skipped > 0


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("mode", ["group", "hamerly"])
def test_empty_clusters_relocated_with_group_bounds_keep_every_invariant(mode, metric):
    X = blobs(3_000, 4, 12, seed=3)
    init = np.concatenate([X[:48], X[:48] + np.float32(500.0)])  # half win no sample
    algo = make_algorithm("nmbatch", filled_store(X, metric=metric), 96, init=init,
                          batch_size=150, rho=20.0, random_state=1, bounds=mode,
                          metric=metric)  # fmt: skip
    relocated = 0
    for _ in range(40):
        before = snapshot(algo)
        relocated += algo.step().n_relocated
        check_step_invariants(algo, before)
        assert (algo._lower[: algo.batch_size] <= true_group_min(
            np.array(algo.store.data[: algo.batch_size]), before.centroids,
            algo.labels(), algo._bk.group_of, algo._bk.width,
        )).all()  # fmt: skip
    assert relocated > 0 and int((algo.v == 0).sum()) == 0


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("mode", ["group", "hamerly"])
@pytest.mark.parametrize("path", [-1.0, np.inf])
def test_both_revisit_paths_with_group_bounds(mode, path, metric):
    X = blobs(1_200, 3, 20, seed=6, spread=1.5, separation=6.0)
    algo = make_algorithm("nmbatch", filled_store(X, seed=2, metric=metric), 24, rho=5.0,
                          batch_size=50, bounds=mode, metric=metric)  # fmt: skip
    algo.dense_revisit_fraction = path
    for _ in range(80):
        before = snapshot(algo)
        if algo.step().converged:
            break
        check_step_invariants(algo, before)
    assert algo.converged


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("mode", ["group", "hamerly"])
def test_retirements_keep_group_bounds_sound(mode, metric):
    X = blobs(8_000, 4, 10, seed=8, spread=1.5, separation=5.0)
    store = NestedBatchStore(4, seed=3, metric=metric)
    algo = make_algorithm("nmbatch", store, 30, batch_size=300, rho=5.0, random_state=2,
                          bounds=mode, metric=metric)  # fmt: skip
    policy = WindowRetention(2_500)
    for start in range(0, 8_000, 400):
        if algo.initialized:
            state = row_state(algo)
            ids = set(store.ids().tolist())
            algo.retire(ids=store.ids()[::7])
            check_retire_invariants(algo, state, ids - set(store.ids().tolist()))
        feed(policy, algo, X[start : start + 400])
        before = snapshot(algo)
        algo.step()
        check_step_invariants(algo, before)


@pytest.mark.parametrize("mode", ["group", "hamerly"])
def test_runs_are_reproducible_and_restore_rebuilds_the_groups(mode):
    X = blobs(4_000, 5, 40, seed=9)

    def run():
        algo = make_algorithm("nmbatch", filled_store(X, seed=1), 300, init="k-means++",
                              batch_size=500, random_state=7, bounds=mode)  # fmt: skip
        for _ in range(12):
            algo.step()
        return algo

    a, b = run(), run()
    np.testing.assert_array_equal(a.centroids, b.centroids)
    np.testing.assert_array_equal(a._lower[: a.batch_size], b._lower[: b.batch_size])
    c = make_algorithm("nmbatch", filled_store(X, seed=1), 300, bounds=mode)
    c.restore(a.centroids, a.batch_size, a.iteration)
    np.testing.assert_array_equal(c._bk.group_of, form_groups(a.centroids, c._bk.width))
    before = snapshot(c)
    c.step()
    check_step_invariants(c, before)


@pytest.mark.parametrize(("mode", "width"), [("full", 1_024), ("group", 103), ("hamerly", 1)])
def test_bytes_per_sample_of_each_mode(mode, width):
    X = blobs(2_000, 3, 8, seed=0)
    algo = make_algorithm("nmbatch", filled_store(X), 1_024, bounds=mode, batch_size=1_500)
    algo.step()
    # labels int32, ||x||^2, d^2 scratch and u float64, and the lower bounds.
    assert algo.bytes_per_sample() == 4 + 8 + 8 + 8 + 4 * width
    assert algo._lower.shape[1] == width


def test_estimator_checks_bounds_and_every_mode_fits_the_same_model():
    X = blobs(3_000, 4, 12, seed=2)
    with pytest.raises(ValueError, match=r"'bounds' parameter .* must be a str among"):
        NestedMiniBatchKMeans(12, bounds="yinyang").fit(X)
    fits = [
        NestedMiniBatchKMeans(12, bounds=m, batch_size=200, random_state=0).fit(X)
        for m in (*MODES, "auto")
    ]
    for other in fits[1:]:
        np.testing.assert_array_equal(other.cluster_centers_, fits[0].cluster_centers_)
    assert fits[1]._algorithm.bound_mode == "group"
    assert fits[2]._algorithm.bound_mode == "hamerly"


def test_bounds_memory_report_measures_every_mode(tmp_path):
    out = tmp_path / "rows.json"
    argv = ["--n", "3000", "--dim", "6", "--ks", "40,400,5000", "--steps", "4",
            "--budget", "20", "--batch-size", "500", "--json", str(out)]  # fmt: skip
    assert bounds_memory.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[-1] == {"k": 5000, "skipped": "k > n = 3000"}
    ran = rows[:-1]
    assert [(r["k"], r["resolved"], r["bounds"]) for r in ran] == [
        (40, "full", 40), (40, "group", 4), (40, "hamerly", 1),
        (400, "full", 400), (400, "group", 40), (400, "hamerly", 1),
    ]  # fmt: skip
    for r in ran:
        assert r["bytes_per_sample"] == 28 + 4 * r["bounds"]
        assert r["with_rows"] == r["bytes_per_sample"] + 4 * 6 + 8
        assert r["same_centroids"] and r["steps"] == ran[0 if r["k"] == 40 else 3]["steps"]
        assert r["seconds"] >= r["revisit_seconds"] > 0.0 and r["distances"] > 0
    capped = bounds_memory.parse_args(["--ks", "400", "--max-bound-bytes", "1000"])
    X = bounds_memory.load_rows(None, 3000, dim=6)
    assert bounds_memory.measure(X, capped)[0]["skipped"].startswith("bounds need")


@pytest.mark.parametrize("seed", range(3))
def test_full_to_group_is_the_numpy_group_minimum(seed):
    rng = np.random.default_rng(seed)
    n, k, G = 9_000, 17, 5  # more rows than one block
    group_of, members, starts, sizes = grouping(k, G, seed)
    groups = GroupBounds("group", k, G)
    groups.prepare(np.zeros((k, 2), dtype=np.float32))
    groups.group_of, groups.members, groups.starts, groups.sizes = group_of, members, starts, sizes
    groups.position = np.argsort(members)
    lower = rng.random((n, k)).astype(np.float32)
    labels = rng.integers(0, k, size=n).astype(np.int32)
    out = full_to_group(lower, labels, groups)
    want = np.full((n, G), np.finfo(np.float32).max, dtype=np.float32)
    for i in range(0, n, 97):  # a sample of rows, one at a time
        for j in range(k):
            if j != labels[i]:
                want[i, group_of[j]] = min(want[i, group_of[j]], lower[i, j])
        np.testing.assert_array_equal(out[i], want[i])


def test_auto_switches_from_full_to_group_bounds_past_its_budget():
    X = blobs(12_000, 3, 40, seed=11, spread=1.0, separation=6.0)
    k = 300  # k > max(d, 256): auto keeps full bounds only under the budget
    auto = make_algorithm("nmbatch", filled_store(X, seed=0), k, batch_size=400, rho=3.0)
    full = make_algorithm("nmbatch", filled_store(X, seed=0), k, batch_size=400, rho=3.0,
                          bounds="full")  # fmt: skip
    modes = []
    for step in range(80):
        before = snapshot(auto)
        s = auto.step()
        full.step()
        check_step_invariants(auto, before)
        modes.append((auto.bound_mode, auto._lower.shape[1]))
        np.testing.assert_array_equal(auto.centroids, full.centroids)
        np.testing.assert_array_equal(auto.labels(), full.labels())
        if step == 0:  # full bounds for the rows reserved so far, not one more
            b_first = auto.batch_size
            assert b_first < X.shape[0]
            auto._bk.budget = 4 * k * auto._lower.shape[0]
        if s.converged or modes.count(("group", 30)) == 5:  # 5 steps after the switch
            break
    assert modes[0] == ("full", k) and modes[-1] == ("group", 30)
    assert auto.batch_size > b_first  # the switch came with the batch's growth


@pytest.mark.parametrize("mode", ["full", "group", "hamerly"])
def test_the_default_dense_revisit_fraction_applies_to_every_bound_mode(mode):
    default = DENSE_REVISIT_FRACTION

    def run(fraction):
        X = blobs(3_000, 4, 40, seed=8, spread=2.0, separation=4.0)
        algo = make_algorithm("nmbatch", filled_store(X, seed=3), 80, rho=5.0,
                              batch_size=200, bounds=mode)  # fmt: skip
        algo.dense_revisit_fraction = fraction
        steps = []
        for _ in range(40):
            stats = algo.step()
            steps.append((stats.n_distances, algo.centroids.tobytes()))
            if stats.converged:
                break
        return steps

    assert run(None) == run(default)
    other = -1.0 if mode == "full" else np.inf  # every listed row by BLAS / none
    assert [n for n, _ in run(None)] != [n for n, _ in run(other)]  # the choice matters
