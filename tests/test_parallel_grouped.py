"""The parallel group-bound kernels give the single-thread kernels' results, bit for bit.

Each grouped pass (``engine.kernels.grouped``: the dense pass, the sweep, the settle pass
and the reassignment) at 1 and at 2 threads on the same inputs, with enough rows for its
parallel driver (beside its range kernel in ``grouped``, ``grouped_reassign`` or
``grouped_dense``; checked to have run): every output and every in-out array equal
exactly. The sums they leave are also checked against numpy from the labels, and the
labels against the brute-force nearest centroid.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from nmbatch.engine.algorithms.bounds import GroupBounds
from nmbatch.engine.kernels import grouped, grouped_dense, grouped_reassign, parallel, update
from nmbatch.engine.kernels.common import sqdist32_error
from tests.engine_helpers import brute_nearest
from tests.testkit import blobs

N, K, D = 6000, 48, 16  # N above parallel.MIN_SWEEP_ROWS: every driver's parallel path

pytestmark = pytest.mark.skipif(
    numba.config.NUMBA_NUM_THREADS < 2, reason="numba's pool has one thread"
)


@pytest.fixture
def drivers(monkeypatch) -> dict[str, int]:
    """Calls of each parallel driver of the grouped passes during the test, by name."""
    modules = {
        "sweep_blocks": grouped, "settle_blocks": grouped,
        "reassign_blocks": grouped_reassign, "dense_blocks": grouped_dense,
    }  # fmt: skip
    calls = dict.fromkeys(modules, 0)
    for name, module in modules.items():
        kernel = getattr(module, name)

        def counted(*args, _kernel=kernel, _name=name):
            calls[_name] += 1
            return _kernel(*args)

        monkeypatch.setattr(module, name, counted)
    return calls


def _at(threads: int, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with numba at ``threads`` threads (restored after)."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        return fn(*args, **kwargs)
    finally:
        numba.set_num_threads(before)


def _problem(seed: int, n_groups: int):
    """Samples ``(N, D)`` float32, centroids ``(K, D)`` float32 and their groups."""
    X = blobs(N, D, K, seed=seed, separation=3.0)
    rng = np.random.default_rng(seed)
    C = X[rng.choice(N, K, replace=False)].copy()
    groups = GroupBounds("group", K, n_groups)
    groups.prepare(C)
    return X, C, groups


def _fresh_state(n_groups: int) -> dict[str, np.ndarray]:
    return {
        "labels": np.full(N, -1, dtype=np.int32), "dist2": np.zeros(N),
        "S": np.zeros((K, D)), "v": np.zeros(K, dtype=np.int64), "sse": np.zeros(K),
        "Q": np.zeros(K), "sqnorms": np.zeros(N),
        "lower_bounds": np.zeros((N, n_groups), dtype=np.float32),
        "upper_bounds": np.zeros(N),
    }  # fmt: skip


def _dense(X, C, rows, groups, state, *, remove: bool, known: bool) -> int:
    """:func:`grouped_dense.assign_dense_grouped` of ``rows`` on ``state`` (changed in place)."""
    return grouped_dense.assign_dense_grouped(
        X, rows, C, dots=X[rows] @ C.T, cc=(C.astype(np.float64) ** 2).sum(1),
        group_of=groups.group_of, remove=remove, sqnorms_known=known, **state,
    )  # fmt: skip


def _copy(state: dict) -> dict:
    return {key: value.copy() for key, value in state.items()}


def _assert_same(a: dict, b: dict) -> None:
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _assert_sums(X, state) -> None:
    """``S``, ``v``, ``Q`` (and ``sse`` where kept) against numpy from the labels."""
    labels = state["labels"]
    S = np.zeros((K, D))
    np.add.at(S, labels, X.astype(np.float64))
    np.testing.assert_array_equal(state["v"], np.bincount(labels, minlength=K))
    np.testing.assert_allclose(state["S"], S, rtol=1e-12, atol=1e-9)
    xx = (X.astype(np.float64) ** 2).sum(1)
    np.testing.assert_allclose(state["Q"], np.bincount(labels, xx, minlength=K), rtol=1e-12)


@pytest.mark.parametrize(("seed", "n_groups"), [(0, 6), (1, 1)])
def test_assign_dense_grouped_parallel_equals_single_thread(seed, n_groups, drivers):
    X, C, groups = _problem(seed, n_groups)
    rows = np.arange(N, dtype=np.int64)
    one, two = _fresh_state(n_groups), _fresh_state(n_groups)
    assert rows.shape[0] >= parallel.MIN_PARALLEL_ROWS
    n1 = _at(1, _dense, X, C, rows, groups, one, remove=False, known=False)
    assert drivers["dense_blocks"] == 0
    n2 = _at(2, _dense, X, C, rows, groups, two, remove=False, known=False)
    assert drivers["dense_blocks"] == 1  # the parallel driver ran
    assert n1 == n2 == 0
    _assert_same(one, two)
    _assert_sums(X, one)
    np.testing.assert_allclose(one["sse"], np.bincount(one["labels"], one["dist2"], K))
    np.testing.assert_array_equal(one["labels"], brute_nearest(X, C)[0])
    # A second pass with other centroids and known norms gives votes back: moves in
    # row order, old d(i)^2 taken from sse.
    C2 = C + np.float32(0.5)
    half = rows[::2]
    n1 = _at(1, _dense, X, C2, half, groups, one, remove=True, known=True)
    n2 = _at(2, _dense, X, C2, half, groups, two, remove=True, known=True)
    assert drivers["dense_blocks"] == 2
    assert n1 == n2 > 0
    _assert_same(one, two)
    _assert_sums(X, one)
    np.testing.assert_allclose(one["sse"], np.bincount(one["labels"], one["dist2"], K))
    np.testing.assert_array_equal(one["labels"][half], brute_nearest(X[half], C2)[0])


def _revisit(X, C_new, p, groups, state, *, settle: bool):
    """Sweep, settle (optional) and reassignment of the grouped revisit, on ``state``."""
    pmax = grouped.group_drift(p, groups.group_of, groups.width)
    lab, up, lo = state["labels"], state["upper_bounds"], state["lower_bounds"]
    swept, n_swept = grouped.group_sweep(p, pmax, groups.group_of, groups.sizes, lab, up, lo)
    rows, n_open, known = swept, n_swept, None
    if settle:
        known = np.zeros(N)
        rows, n_open = grouped.settle_assigned_grouped(
            X, swept, C_new, sqdist32_error(D), groups.group_of, groups.sizes, lab, up, lo,
            known,
        )  # fmt: skip
        state["s_assigned"] = known
    out = grouped.reassign_grouped_rows(
        X, rows, C_new, group_of=groups.group_of, members=groups.members, starts=groups.starts,
        p=p, pmax=pmax, labels=lab, upper_bounds=up, lower_bounds=lo, S=state["S"],
        v=state["v"], Q=state["Q"], assigned_sqdist=known,
    )  # fmt: skip
    return swept, n_swept, rows, n_open, out


@pytest.mark.parametrize("settle", [True, False])
@pytest.mark.parametrize(("seed", "n_groups"), [(0, 6), (3, 12), (2, 1)])
def test_grouped_revisit_parallel_equals_single_thread(seed, n_groups, settle, drivers):
    X, C, groups = _problem(seed, n_groups)
    base = _fresh_state(n_groups)
    _at(1, _dense, X, C, np.arange(N, dtype=np.int64), groups, base, remove=False, known=False)
    C_new, p = update.centroid_update(base["S"], base["v"], base["Q"], C)
    C_new = C_new + np.float32(0.3)  # moves big enough to reassign many rows
    p = p + 0.3 * np.sqrt(D) * 1.001
    one, two = _copy(base), _copy(base)
    res1 = _at(1, _revisit, X, C_new, p, groups, one, settle=settle)
    assert sum(drivers.values()) == 0
    res2 = _at(2, _revisit, X, C_new, p, groups, two, settle=settle)
    # The parallel drivers ran: enough rows for each.
    assert N >= parallel.MIN_SWEEP_ROWS and drivers["sweep_blocks"] == 1
    assert res1[0].shape[0] >= parallel.MIN_PARALLEL_ROWS
    assert drivers["settle_blocks"] == int(settle)
    assert res1[2].shape[0] >= parallel.MIN_PARALLEL_ROWS and drivers["reassign_blocks"] == 1
    for a, b in zip(res1, res2, strict=True):
        np.testing.assert_array_equal(a, b)  # listed rows, open pairs, (changed, distances)
    assert res1[4][0] > 0
    _assert_same(one, two)
    np.testing.assert_array_equal(one["labels"], brute_nearest(X, C_new)[0])
    _assert_sums(X, one)
