"""k-means++ by rejection (``engine/seeding/rejection.py``, its kernels in
``engine/kernels/seeding_rejection.py``): each kernel against plain numpy, the whole
seeding against a numpy twin bit for bit, its law against k-means++'s exact law, and the
same rows with any thread count."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from nmbatch.engine.kernels.parallel import every_parallel_path
from nmbatch.engine.kernels.seeding_rejection import (
    RECOMPUTE_BELOW,
    apply_pending,
    propose,
)
from nmbatch.engine.products import PRODUCT_ROWS
from nmbatch.engine.seeding import auto_plan, kmeans_plusplus_auto
from nmbatch.engine.seeding.rejection import MAX_PENDING, _centred, kmeans_plusplus_rejection
from nmbatch.engine.threads import thread_limits
from tests.testkit import blobs


def _apply_numpy(X, xx, rows, Da):
    """``apply_pending`` in numpy: the product in the chunks of ``products``, the same
    float64 formula, the recomputation from the differences where it is small."""
    m = X.shape[0]
    P = np.empty((m, rows.shape[0]), dtype=np.float32)
    Ct = np.ascontiguousarray(X[rows].T)
    for lo in range(0, m, PRODUCT_ROWS):
        np.matmul(X[lo : lo + PRODUCT_ROWS], Ct, out=P[lo : lo + PRODUCT_ROWS])
    cc = xx[rows]
    dist = xx[:, None] - 2.0 * P.astype(np.float64) + cc[None, :]
    small = dist < RECOMPUTE_BELOW * (xx[:, None] + cc[None, :])
    for i, j in zip(*np.nonzero(small), strict=True):
        diff = X[i].astype(np.float64) - X[rows[j]].astype(np.float64)
        dist[i, j] = float(np.cumsum(diff * diff)[-1])  # added in column order, as numba
    new = np.minimum(Da, np.maximum(dist, 0.0).min(axis=1, initial=np.inf))
    return np.where(new < Da, new, Da)


def _propose_numpy(X, cum, Da, pending, room, u):
    """``propose`` in plain Python and numpy."""
    pending = list(pending)
    total = cum[-1]
    rejected = t = 0
    while t < u.shape[0] and len(pending) < room and rejected <= 4 + len(pending):
        i = int(np.searchsorted(cum, u[t, 0] * total, side="right"))
        if i >= cum.shape[0]:
            i = int(np.nonzero(Da > 0)[0][-1])
        dn = Da[i]
        for p in pending:
            diff = X[i].astype(np.float64) - X[p].astype(np.float64)
            dn = min(dn, float(np.cumsum(diff * diff)[-1]))
        if u[t, 1] * Da[i] < dn:
            pending.append(i)
        else:
            rejected += 1
        t += 1
    return pending, t


def _rejection_numpy(X, k, rng, weights=None):
    """The whole seeding in numpy (the kernels replaced by their twins above)."""
    m = X.shape[0]
    Xc = _centred(X)
    xx = np.einsum("ij,ij->i", Xc, Xc, dtype=np.float64)
    chosen = []
    if weights is None:
        chosen.append(int(rng.integers(m)))
    else:
        r = rng.random() * weights.sum()
        chosen.append(min(int(np.searchsorted(np.cumsum(weights), r, "right")), m - 1))
    Da = np.full(m, np.inf)
    pending = list(chosen)
    while True:
        Da = _apply_numpy(Xc, xx, np.array(pending, dtype=np.int64), Da)
        if len(chosen) == k:
            return np.array(chosen, dtype=np.int64)
        mass = Da if weights is None else Da * weights
        cum = np.cumsum(mass)
        if not cum[-1] > 0.0:
            unused = np.setdiff1d(np.arange(m), chosen)
            return np.array(chosen + list(rng.choice(unused, size=k - len(chosen),
                                                     replace=False)), dtype=np.int64)
        room = min(MAX_PENDING, k - len(chosen))
        u = rng.random((2 * room + 6, 2))
        pending, _ = _propose_numpy(Xc, cum, Da, [], room, u)
        chosen += pending


def _data(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "blobs":
        return blobs(3000, 12, 20, seed=seed)
    if kind == "offset":  # far from the origin: cancellation without the centring
        return (rng.normal(size=(2500, 16)) + 1e4).astype(np.float32)
    if kind == "duplicates":  # 40 distinct rows, each many times
        base = rng.normal(size=(40, 8)).astype(np.float32)
        return base[rng.integers(0, 40, 2000)]
    return rng.normal(size=(2200, 30)).astype(np.float32)


def test_apply_pending_is_its_numpy_twin():
    X = _centred(_data("blobs", 1))
    xx = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    rows = np.array([5, 77, 1200, 2999, 5], dtype=np.int64)  # a repeated row too
    Da = np.random.default_rng(2).uniform(0, 50, X.shape[0])
    Da[::7] = np.inf
    expected = _apply_numpy(X, xx, rows, Da.copy())
    P = np.empty((X.shape[0], rows.shape[0]), dtype=np.float32)
    for i0 in range(0, X.shape[0], PRODUCT_ROWS):  # products' chunks, as the twin
        np.matmul(X[i0 : i0 + PRODUCT_ROWS], np.ascontiguousarray(X[rows].T),
                  out=P[i0 : i0 + PRODUCT_ROWS])  # fmt: skip
    got = Da.copy()
    apply_pending(X, P, xx, xx[rows], rows, got)
    assert np.array_equal(got, expected)
    assert np.all(got[rows] == 0.0)  # a chosen row is exactly 0, never drawn again


def test_propose_is_its_numpy_twin():
    X = _centred(_data("gauss", 3))
    rng = np.random.default_rng(4)
    Da = rng.uniform(0.0, 10.0, X.shape[0])
    Da[rng.integers(0, X.shape[0], 300)] = 0.0
    cum = np.cumsum(Da)
    for room in (1, 7, 64):
        u = rng.random((2 * room + 6, 2))
        pending = np.empty(MAX_PENDING, dtype=np.int64)
        n, used = propose(X, cum, Da, pending, 0, room, u)
        want, want_used = _propose_numpy(X, cum, Da, [], room, u)
        assert (list(pending[:n]), used) == (want, want_used)
        assert n >= 1 and all(Da[i] > 0.0 for i in want)  # no row of zero mass


@pytest.mark.parametrize("kind", ["blobs", "offset", "duplicates", "gauss"])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_seeding_is_its_numpy_twin_bit_for_bit(kind, weighted):
    X = _data(kind, 5)
    k = 60 if kind == "duplicates" else 300  # 60 > 40 distinct rows: the fallback too
    w = np.random.default_rng(6).integers(0, 4, X.shape[0]).astype(np.float64) \
        if weighted else None  # fmt: skip
    got = kmeans_plusplus_rejection(X, k, np.random.default_rng(7), weights=w)
    want = _rejection_numpy(X, k, np.random.default_rng(7), weights=w)
    assert np.array_equal(got, want)
    assert len(set(got.tolist())) == k
    if kind == "duplicates" and not weighted:  # every distinct row before a repeat of one
        assert len({X[i].tobytes() for i in got[:40]}) == 40
    if weighted and kind != "duplicates":  # weight 0: never drawn while others remain
        assert np.all(w[got] > 0)


def test_the_same_rows_with_any_thread_count():
    X = _data("blobs", 8)
    picks = []
    for threads in (1, 2):
        with thread_limits(threads), every_parallel_path():
            picks.append(kmeans_plusplus_rejection(X, 500, np.random.default_rng(9)))
    assert np.array_equal(picks[0], picks[1])


def _exact_law(X, w, k):
    """Probability of every ordered choice of ``k`` rows under k-means++ (one trial)."""
    D = ((X[:, None, :].astype(np.float64) - X[None, :, :]) ** 2).sum(axis=2)
    law = {}
    for seq in itertools.permutations(range(X.shape[0]), k):
        p = w[seq[0]] / w.sum()
        for c in range(1, k):
            mass = w * D[:, list(seq[:c])].min(axis=1)
            p *= mass[seq[c]] / mass.sum()
        if p > 0:
            law[seq] = p
    return law


@pytest.mark.parametrize("weighted", [False, True])
def test_the_law_is_k_means_plus_plus(weighted):
    """Chi-square over every ordered triple of 6 rows: rejection draws k-means++'s law."""
    X = np.array([[0, 0], [1, 0], [0, 1], [5, 5], [6, 5], [10, 0]], dtype=np.float32)
    w = np.array([1, 2, 1, 1, 3, 1], dtype=np.float64) if weighted else np.ones(6)
    law = _exact_law(X, w, 3)
    runs = 6000
    counts = dict.fromkeys(law, 0)
    rng = np.random.default_rng(11)
    for _ in range(runs):
        seq = tuple(kmeans_plusplus_rejection(X, 3, rng, weights=w if weighted else None))
        counts[seq] += 1  # a KeyError here: a sequence of probability 0
    expected = np.array([runs * law[s] for s in law])
    observed = np.array([counts[s] for s in law])
    keep = expected >= 5  # the chi-square's rule; the rest pooled
    chi2 = float((((observed[keep] - expected[keep]) ** 2) / expected[keep]).sum())
    rest_o, rest_e = observed[~keep].sum(), expected[~keep].sum()
    if rest_e > 0:
        chi2 += (rest_o - rest_e) ** 2 / rest_e
    dof = int(keep.sum()) + (1 if rest_e > 0 else 0) - 1
    # Upper 0.1% point of chi-square (Wilson-Hilferty): fails one run in a thousand.
    z = 3.09
    bound = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < bound, (chi2, bound, dof)


def test_auto_runs_it_where_it_takes_one_trial():
    X = blobs(5000, 200, 30, seed=12)
    rng_a, rng_b = np.random.default_rng(13), np.random.default_rng(13)
    m, trials = auto_plan(X.shape[0], 1000, 200)
    assert (m, trials) == (4000, 1)
    got = kmeans_plusplus_auto(X, 1000, rng_a)
    rows = np.sort(rng_b.choice(X.shape[0], size=m, replace=False))
    assert np.array_equal(got, rows[kmeans_plusplus_rejection(X[rows], 1000, rng_b)])
