"""The parallel kernels give the single-thread kernels' results, bit for bit, at any count.

Two levels:

- each parallel kernel (``engine.kernels.parallel`` and the ``*_blocks`` kernels) against
  the single-thread kernel on the same inputs, every output and every in-out array
  compared exactly, on enough rows for several blocks; the sums it leaves also against a
  plain numpy recomputation from the labels;
- whole fits at 1, 2, 3 and 4 threads (4 above this machine's cores), in a child process
  whose numba pool has 4 threads: labels, ``S``, ``v``, ``sse``, ``Q``, bounds and
  centroids identical, for every algorithm and bound mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from nmbatch.engine.assign import nearest
from nmbatch.engine.kernels import bounded, dense, lookup, parallel, update
from nmbatch.engine.kernels.common import gemm_error, sqdist32_error
from nmbatch.engine.threads import available_cores, check_threads, thread_limits
from tests.engine_helpers import brute_nearest
from tests.testkit import blobs

N, K, D = 6000, 24, 20  # above parallel.MIN_SWEEP_ROWS: every kernel's parallel path


@pytest.fixture
def two_threads():
    """numba at 2 threads in this test (1 if the pool has only one)."""
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield
    numba.set_num_threads(before)


def _problem(seed: int, n: int = N, k: int = K, d: int = D):
    X = blobs(n, d, k, seed=seed, separation=3.0)
    rng = np.random.default_rng(seed)
    C = X[rng.choice(n, k, replace=False)].copy()
    return X, C


def _dense_state(X, C, rows, *, bounds: bool):
    n, k, d = X.shape[0], C.shape[0], X.shape[1]
    return {
        "labels": np.full(n, -1, dtype=np.int32), "dist2": np.zeros(n),
        "S": np.zeros((k, d)), "v": np.zeros(k, dtype=np.int64), "sse": np.zeros(k),
        "Q": np.zeros(k), "sqnorms": np.zeros(n),
        "lower_bounds": np.zeros((n, k), dtype=np.float32) if bounds else None,
        "upper_bounds": np.zeros(n) if bounds else None,
    }  # fmt: skip


def _run_dense(X, C, rows, state, *, remove: bool, threads: int) -> int:
    dots = X[rows] @ C.T
    cc = (C.astype(np.float64) ** 2).sum(1)
    numba.set_num_threads(threads)
    try:
        return dense.assign_dense(X, rows, C, dots=dots, cc=cc, remove=remove, **state)
    finally:
        numba.set_num_threads(1)


def _copy(state):
    return {k: (None if v is None else v.copy()) for k, v in state.items()}


def _assert_same(a: dict, b: dict) -> None:
    for key in a:
        if a[key] is None:
            continue
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _sums_from_labels(X, labels, k):
    S = np.zeros((k, X.shape[1]))
    np.add.at(S, labels, X.astype(np.float64))
    return S, np.bincount(labels, minlength=k)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("bounds", [True, False])
def test_assign_dense_parallel_equals_single_thread(seed, bounds):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's pool has one thread")
    X, C = _problem(seed)
    rows = np.arange(X.shape[0], dtype=np.int64)
    one, two = _dense_state(X, C, rows, bounds=bounds), _dense_state(X, C, rows, bounds=bounds)
    assert parallel.parallel_rows(rows.shape[0]) or numba.get_num_threads() == 1
    _run_dense(X, C, rows, one, remove=False, threads=1)
    _run_dense(X, C, rows, two, remove=False, threads=2)
    _assert_same(one, two)
    S, v = _sums_from_labels(X, one["labels"], K)
    np.testing.assert_array_equal(one["v"], v)
    np.testing.assert_allclose(one["S"], S, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(one["labels"], brute_nearest(X, C)[0])
    # A second pass with other centroids gives votes back: moves in row order.
    C2 = C + np.float32(0.5)
    n1 = _run_dense(X, C2, rows, one, remove=True, threads=1)
    n2 = _run_dense(X, C2, rows, two, remove=True, threads=2)
    assert n1 == n2 > 0
    _assert_same(one, two)


def _bounded_state(X, C):
    rows = np.arange(X.shape[0], dtype=np.int64)
    state = _dense_state(X, C, rows, bounds=True)
    _run_dense(X, C, rows, state, remove=False, threads=1)
    return state


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("settle", [True, False])
def test_bounded_revisit_parallel_equals_single_thread(seed, settle):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's pool has one thread")
    X, C = _problem(seed)
    base = _bounded_state(X, C)
    C_new, p = update.centroid_update(base["S"], base["v"], base["Q"], C)
    C_new = C_new + np.float32(0.3)  # moves big enough to reassign many rows
    p = p + 0.3 * np.sqrt(D) * 1.001
    results = []
    for threads in (1, 2):
        st = _copy(base)
        numba.set_num_threads(threads)
        try:
            lab, up, lo = st["labels"], st["upper_bounds"], st["lower_bounds"]
            rows, n_open = bounded.bound_sweep(p, lab, up, lo)
            known = None
            if settle:
                s_a = np.zeros(X.shape[0])
                rows, n_open = bounded.settle_assigned(
                    X, rows, C_new, sqdist32_error(D), lab, up, lo, s_a
                )
                known = s_a
            out = bounded.reassign_rows(
                X, rows, C_new, labels=lab, upper_bounds=up, lower_bounds=lo, S=st["S"],
                v=st["v"], Q=st["Q"], assigned_sqdist=known,
            )  # fmt: skip
        finally:
            numba.set_num_threads(1)
        results.append((rows.copy(), n_open, out, st))
    (r1, o1, out1, st1), (r2, o2, out2, st2) = results
    assert r1.shape[0] >= parallel.MIN_PARALLEL_ROWS  # the parallel kernels ran
    np.testing.assert_array_equal(r1, r2)
    assert o1 == o2 and out1 == out2 and out1[0] > 0
    _assert_same(st1, st2)
    np.testing.assert_array_equal(st1["labels"], brute_nearest(X, C_new)[0])
    S, v = _sums_from_labels(X, st1["labels"], K)
    np.testing.assert_array_equal(st1["v"], v)
    np.testing.assert_allclose(st1["S"], S, rtol=1e-12, atol=1e-9)


def test_apply_moves_is_the_row_ordered_sum(two_threads):
    rng = np.random.default_rng(5)
    n, k, d = 5000, 7, 40  # n x d above MIN_PARALLEL_VALUES: column tasks
    X = rng.normal(size=(n, d)).astype(np.float32)
    rows = rng.permutation(n).astype(np.int64)
    prev = rng.integers(-1, k, n).astype(np.int32)
    new = rng.integers(0, k, n).astype(np.int32)
    S, v, Q = np.zeros((k, d)), np.zeros(k, dtype=np.int64), np.zeros(k)
    changed = parallel.apply_moves(X, rows, prev, new, S=S, v=v, Q=Q)
    S_ref, v_ref, Q_ref = np.zeros((k, d)), np.zeros(k, dtype=np.int64), np.zeros(k)
    for t in range(n):  # the formula, one row after another
        a, b, x = prev[t], new[t], X[rows[t]].astype(np.float64)
        if a == b:
            continue
        if a >= 0:
            S_ref[a] -= x
            v_ref[a] -= 1
            Q_ref[a] -= float(np.sum(x * x))
        S_ref[b] += x
        v_ref[b] += 1
        Q_ref[b] += float(np.sum(x * x))
    np.testing.assert_array_equal(S, S_ref)
    np.testing.assert_array_equal(v, v_ref)
    np.testing.assert_allclose(Q, Q_ref, rtol=1e-12)
    assert changed == int(np.sum((prev != new) & (prev >= 0)))


@pytest.mark.parametrize("unit", [False, True])  # True: metric="cosine"'s S(j)/||S(j)||
def test_centroid_update_and_nearest_parallel_equal_single_thread(unit):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's pool has one thread")
    rng = np.random.default_rng(2)
    k, d = 600, 64  # k x d above the update's parallel size
    S = rng.normal(size=(k, d)) * 100
    v = rng.integers(0, 50, k).astype(np.int64)
    Q = rng.random(k) * 1e6
    C = rng.normal(size=(k, d)).astype(np.float32)
    X = rng.normal(size=(4000, d)).astype(np.float32)
    out = []
    for threads in (1, 2):
        sse = np.zeros(k)
        numba.set_num_threads(threads)
        try:
            C_new, p = update.centroid_update(S, v, Q, C, sse_out=sse, unit=unit)
            labels, sq = nearest(X, C)
        finally:
            numba.set_num_threads(1)
        out.append((C_new, p, sse, labels, sq))
    for a, b in zip(*out, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(out[0][3], brute_nearest(X, C)[0])
    xx = (X.astype(np.float64) ** 2).sum(1)
    lab, sq = np.empty(4000, dtype=np.int64), np.empty(4000)
    none = np.empty(0)
    lookup._nearest_blocks(X, xx, X @ C.T, C, (C.astype(np.float64) ** 2).sum(1),
                           gemm_error(d), lab, sq, 100, none, none, none)  # fmt: skip
    np.testing.assert_array_equal(lab, out[0][3])


def test_thread_settings():
    assert available_cores() >= 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n_threads"):
            check_threads(bad)
    before = numba.get_num_threads()
    with thread_limits(1) as n:
        assert n == 1 and numba.get_num_threads() == 1
    assert numba.get_num_threads() == before


_CHILD = textwrap.dedent(
    """
    import hashlib, json, sys
    import numba, numpy as np
    from nmbatch.engine import NestedMiniBatchKMeans
    from tests.testkit import blobs

    assert numba.config.NUMBA_NUM_THREADS == 4
    X = blobs(6000, 16, 40, seed=3, separation=3.0)
    out = {}
    for algorithm, bounds, k in [("nmbatch", "full", 40), ("nmbatch", "group", 300),
                                 ("nmbatch", "hamerly", 40), ("nmbatch.deact", "auto", 40),
                                 ("elkan", "auto", 40), ("lloyd", "auto", 40),
                                 ("mbatch.remove", "auto", 40)]:
        for threads in (1, 2, 3, 4):
            est = NestedMiniBatchKMeans(
                n_clusters=k, algorithm=algorithm, bounds=bounds, batch_size=1000,
                random_state=7, n_threads=threads, max_iter=60,
            ).fit(X)
            algo = est._algorithm
            h = hashlib.sha256()
            for name in ("S", "v", "sse", "Q", "centroids", "_labels", "_lower", "_upper"):
                a = getattr(algo, name, None)
                if a is not None:
                    h.update(np.ascontiguousarray(a).tobytes())
            h.update(est.labels_.tobytes())
            h.update(est.predict(X).tobytes())
            out.setdefault(f"{algorithm}/{bounds}/{k}", []).append(
                [threads, h.hexdigest(), int(est.n_iter_)])
    json.dump(out, sys.stdout)
    """
)


def test_fits_are_bit_identical_at_1_2_3_and_4_threads():
    env = {**os.environ, "NUMBA_NUM_THREADS": "4"}
    run = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    fits = json.loads(run.stdout)
    assert len(fits) == 7
    for name, runs in fits.items():
        hashes = {h for _, h, _ in runs}
        assert len(hashes) == 1, (name, runs)
        assert [t for t, _, _ in runs] == [1, 2, 3, 4]
        assert runs[0][2] > 1, name  # iterations ran
