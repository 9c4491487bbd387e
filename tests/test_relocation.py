"""Empty clusters relocated onto the farthest samples (``relocate_empty``): the vote moves
exactly (against a plain numpy version of the rule), bounds stay sound, runs stay
reproducible, and the model no longer keeps dead clusters."""

from __future__ import annotations

import numpy as np
import pytest

from nmbatch.engine import NestedBatchStore, make_algorithm
from nmbatch.engine.algorithms.relocation import farthest_first, relocate_empty
from nmbatch.engine.hosting import feed
from nmbatch.engine.retention import WindowRetention
from tests.engine_helpers import check_step_invariants, filled_store, snapshot
from tests.testkit import blobs


def _reference(X, labels, C, C_prev, v):
    """The rule in plain numpy: each empty cluster, in index order, takes the row
    farthest from every centroid and every row relocated before it (ties: lowest row)
    whose cluster keeps another sample."""
    labels = labels.copy()
    v = v.copy()
    X64 = X.astype(np.float64)
    d2 = ((X64 - C.astype(np.float64)[labels]) ** 2).sum(1)
    empty = [j for j in range(len(v)) if v[j] == 0]
    taken = []
    for j in empty:
        ok = [i for i in range(len(X)) if d2[i] > 0 and v[labels[i]] >= 2]
        if not ok:
            break
        i = min(ok, key=lambda r: (-d2[r], r))
        v[labels[i]] -= 1
        v[j] += 1
        labels[i] = j
        taken.append(i)
        d2 = np.minimum(d2, ((X64 - X64[i]) ** 2).sum(1))
        d2[i] = 0.0
    return labels, v, taken


@pytest.mark.parametrize("seed", range(6))
def test_relocation_moves_votes_exactly_as_the_numpy_rule(seed):
    rng = np.random.default_rng(seed)
    k, d, b = 7, 3, 60
    X = rng.normal(size=(b, d)).astype(np.float32)
    labels = rng.integers(0, 3, size=b).astype(np.int32)  # clusters 3..6 empty
    labels[:2] = 3 if seed % 2 else 0  # sometimes a cluster of few samples
    v = np.bincount(labels, minlength=k).astype(np.int64)
    S = np.zeros((k, d))
    np.add.at(S, labels, X.astype(np.float64))
    norms = (X.astype(np.float64) ** 2).sum(1)
    Q = np.bincount(labels, weights=norms, minlength=k)
    C_prev = rng.normal(size=(k, d)).astype(np.float32)
    C = C_prev.copy()
    C[v > 0] = (S[v > 0] / v[v > 0, None]).astype(np.float32)
    p = np.zeros(k)
    sse = np.zeros(k)
    upper = np.zeros(b)
    want_labels, want_v, taken = _reference(X, labels, C, C_prev, v)

    moved = relocate_empty(X, b, labels=labels, norms=norms, S=S, v=v, Q=Q, sse=sse, C=C,
                           C_prev=C_prev, p=p, upper=upper)  # fmt: skip
    assert moved == len(taken) == int((want_v > 0).sum() - (np.bincount(
        want_labels, minlength=k) > 0).sum() + len(taken))  # fmt: skip
    np.testing.assert_array_equal(labels, want_labels)
    np.testing.assert_array_equal(v, want_v)
    # Sums, norms and centroids of the new labels, from scratch.
    S_ref = np.zeros((k, d))
    np.add.at(S_ref, labels, X.astype(np.float64))
    np.testing.assert_allclose(S, S_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(Q, np.bincount(labels, weights=norms, minlength=k), rtol=1e-12)
    nz = v > 0
    np.testing.assert_array_equal(C[nz], (S[nz] / v[nz, None]).astype(np.float32))
    for i in taken:  # a relocated centroid is its sample
        np.testing.assert_array_equal(C[labels[i]], X[i])
        assert upper[i] >= np.linalg.norm(X[i].astype(np.float64) - C_prev[labels[i]])
    moved_clusters = np.flatnonzero(p > 0)
    dist = np.linalg.norm(C.astype(np.float64) - C_prev.astype(np.float64), axis=1)
    assert (p[moved_clusters] >= dist[moved_clusters]).all()
    for j in moved_clusters:  # sse from the sums under the previous centroids
        rows = X[labels == j].astype(np.float64)
        np.testing.assert_allclose(
            sse[j], ((rows - C_prev[j].astype(np.float64)) ** 2).sum(), rtol=1e-9, atol=1e-9
        )


def test_farthest_first_sorts_by_distance_then_row():
    dist2 = np.array([1.0, 5.0, 5.0, 0.0, 3.0, 5.0])
    assert farthest_first(dist2, 6).tolist() == [1, 2, 5, 4, 0, 3]
    big = np.random.default_rng(0).random(10_000)
    top = farthest_first(big, 3)
    assert top[:3].tolist() == np.argsort(-big)[:3].tolist()


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("name", ["nmbatch", "nmbatch.deact", "elkan", "lloyd"])
def test_many_clusters_few_samples_relocate_and_keep_every_invariant(name, metric):
    X = blobs(3_000, 4, 12, seed=3)
    # Half the starting centroids far from every sample: they win none (cosine: all on
    # one direction, beside one another).
    init = np.concatenate([X[:48], X[:48] + np.float32(500.0)])
    algo = make_algorithm(name, filled_store(X, metric=metric), 96, init=init,
                          batch_size=150, rho=20.0, random_state=1, metric=metric)  # fmt: skip
    relocated = 0
    for _ in range(40):  # invariants after every step, relocations allowed
        before = snapshot(algo)
        relocated += algo.step().n_relocated
        check_step_invariants(algo, before)
    assert relocated > 0 and int((algo.v == 0).sum()) == 0


def test_relocation_reaches_a_lower_energy_and_is_reproducible():
    X = blobs(20_000, 8, 64, seed=5, spread=1.0)

    def run(relocate: bool) -> tuple[float, np.ndarray]:
        store = NestedBatchStore(8, seed=2)
        store.append(X)
        algo = make_algorithm("nmbatch", store, 256, batch_size=1_000, random_state=4,
                              relocate_empty=relocate, swap=False)  # fmt: skip
        for _ in range(300):
            if algo.step().converged:
                break
        C = algo.centroids.astype(np.float64)
        energy = float(((X[:, None, :] - C[None]) ** 2).sum(-1).min(1).mean())
        return energy, algo.centroids.copy()

    kept, _ = run(False)
    relocated, C1 = run(True)
    _, C2 = run(True)
    assert relocated < kept
    np.testing.assert_array_equal(C1, C2)


def test_a_window_after_an_abrupt_change_keeps_no_dead_cluster():
    """The clusters move at once; once the window holds only the new ones, every
    centroid has samples (before relocation half of them were left on the old places)."""
    old = blobs(20_000, 4, 8, seed=6)
    new = blobs(20_000, 4, 8, seed=7) + np.float32(60.0)
    store = NestedBatchStore(4, seed=1)
    algo = make_algorithm("nmbatch", store, 8, batch_size=500, random_state=0)
    policy = WindowRetention(5_000)
    for X in (old, new):
        for start in range(0, 20_000, 500):
            feed(policy, algo, X[start : start + 500])
            algo.step()
    assert int((algo.v == 0).sum()) == 0
    assert (algo.centroids > 30.0).all()  # every centroid among the new clusters


def test_past_the_work_cap_the_farthest_samples_are_taken_in_one_order(monkeypatch):
    """Beyond ``MAXIMIN_WORK`` the distances are not updated between choices: the
    samples farthest from their own centroids, each of a cluster that can spare it."""
    from nmbatch.engine.algorithms import relocation

    monkeypatch.setattr(relocation, "MAXIMIN_WORK", 0)
    rng = np.random.default_rng(9)
    k, d, b = 6, 2, 40
    X = rng.normal(size=(b, d)).astype(np.float32)
    labels = (np.arange(b) % 2).astype(np.int32)  # clusters 2..5 empty
    v = np.bincount(labels, minlength=k).astype(np.int64)
    S = np.zeros((k, d))
    np.add.at(S, labels, X.astype(np.float64))
    Q = np.zeros(k)
    C = np.zeros((k, d), np.float32)
    C[:2] = (S[:2] / v[:2, None]).astype(np.float32)
    d2 = ((X.astype(np.float64) - C.astype(np.float64)[labels]) ** 2).sum(1)
    want = np.argsort(-d2, kind="stable")[:4]
    moved = relocate_empty(X, b, labels=labels, norms=None, S=S, v=v, Q=Q, sse=None, C=C,
                           C_prev=C.copy(), p=np.zeros(k))  # fmt: skip
    assert moved == 4
    assert labels[want].tolist() == [2, 3, 4, 5]
    S_ref = np.zeros((k, d))
    np.add.at(S_ref, labels, X.astype(np.float64))
    np.testing.assert_allclose(S, S_ref, atol=1e-12)
