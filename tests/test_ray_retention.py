"""Retention on the Ray backend: each shard retires its own rows and takes back their votes.

A :class:`StreamCoordinator` on a local Ray (one node, no dashboard, small object store,
started once for the module) fed log entry by log entry under a sliding window (one id
threshold for every shard: global in acceptance order) and under reservoir-like
retirements of single ids. After every round: every retained row is in exactly one
shard and no retired row is in any, ``S / v`` is the mean of each cluster's voted rows,
``v`` sums to ``b``, ``Q`` is the voted rows' squared norms, the voted rows are exactly
those with priority below ``tau``. A shard killed just before a retirement, and one
killed after retirements, are rebuilt with exactly the retained rows; the chunk records
are compacted. :class:`ShardState.retire` is also checked on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from nmbatch.engine.distributed.shard import ShardState

ray = pytest.importorskip("ray")

from nmbatch.engine.distributed import stream  # noqa: E402
from nmbatch.engine.distributed.stream import StreamCoordinator  # noqa: E402


def blobs(n: int, seed: int = 0, d: int = 5, k: int = 4, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 8.0, (k, d)) + shift
    return (means[rng.integers(0, k, n)] + rng.normal(0.0, 1.0, (n, d))).astype(np.float32)


def dense(votes, k: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dS (k, d), dv (k,), dQ (k,))`` of a shard's sparse :data:`Votes`."""
    j, rows, dv_j, dQ_j = votes
    dS, dv, dQ = np.zeros((k, d)), np.zeros(k, np.int64), np.zeros(k)
    dS[j], dv[j], dQ[j] = rows, dv_j, dQ_j
    return dS, dv, dQ


def wait_dead(actor, timeout: float = 30.0) -> None:
    """Until calls to ``actor`` fail (``ray.kill`` returns before the actor is gone)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            ray.get(actor.node_id.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def check(coord: StreamCoordinator, X: np.ndarray, kept: np.ndarray) -> None:
    """Invariants after a round: ``X`` the rows by stream id, ``kept`` the retained ids."""
    parts = ray.get([a.assignments.remote() for a in coord.shards])
    ids = np.concatenate([p[0] for p in parts])
    priority = np.concatenate([p[1] for p in parts])
    labels = np.concatenate([p[2] for p in parts])
    np.testing.assert_array_equal(np.sort(ids), np.sort(kept))  # each kept row in one shard
    assert coord.n_samples == kept.shape[0]
    voted = labels >= 0
    assert voted.sum() == coord.batch_size == coord.v.sum()
    assert (priority[voted] < coord.tau).all() and (priority[~voted] >= coord.tau).all()
    for j in range(coord.n_clusters):
        mine = X[ids[voted][labels[voted] == j]].astype(np.float64)
        assert mine.shape[0] == coord.v[j]
        np.testing.assert_allclose(coord.S[j], mine.sum(axis=0), rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(coord.Q[j], (mine * mine).sum(), rtol=1e-9, atol=1e-6)


def test_a_shard_retires_its_rows_and_takes_back_their_votes_exactly() -> None:
    X = blobs(300, seed=3)
    priority = np.random.default_rng(1).permutation(300).astype(np.int64)
    shard = ShardState(X, np.arange(300), priority, 4, "full")
    C = X[:4].copy()
    dS, dv, dQ = dense(shard.step((C, np.zeros(4)), 200)[0], 4, 5)  # priority < 200 vote
    ids_before, _, labels_before = shard.assignments()
    gone = np.array([45, 117, 250, 299])
    sparse, voted, n_gone, held = shard.retire(gone, 40)
    assert held is None  # unweighted: the integer ledger says which clusters it holds
    dS_r, dv_r, dQ_r = dense(sparse, 4, 5)
    assert n_gone == 40 + 4
    retired = np.isin(ids_before, gone) | (ids_before < 40)
    assert voted == int((retired & (labels_before >= 0)).sum())
    for j in range(4):
        out = X[ids_before[retired & (labels_before == j)]].astype(np.float64)
        np.testing.assert_allclose(dS_r[j], -out.sum(axis=0), atol=1e-9)
        assert dv_r[j] == -out.shape[0]
        np.testing.assert_allclose(dQ_r[j], -(out * out).sum(), rtol=1e-12)
    S_s, v_s, Q_s = shard.ledger()
    np.testing.assert_allclose(S_s, dS + dS_r, atol=1e-9)
    np.testing.assert_array_equal(v_s, dv + dv_r)
    np.testing.assert_allclose(Q_s, dQ + dQ_r, rtol=1e-12)
    ids, pri, labels = shard.assignments()
    assert not np.isin(ids, gone).any() and (ids >= 40).all() and (np.diff(pri) > 0).all()
    keep = ~retired
    np.testing.assert_array_equal(ids, ids_before[keep])  # order kept
    np.testing.assert_array_equal(labels, labels_before[keep])  # labels moved with rows
    assert shard.batch_size == int((labels >= 0).sum())
    # Centroids moved by p: the bounds that moved with the rows must still be sound.
    C2 = (C + np.random.default_rng(2).normal(0.0, 0.5, C.shape)).astype(np.float32)
    p = np.sqrt(((C2.astype(np.float64) - C) ** 2).sum(axis=1)) * (1 + 1e-9)
    shard.step((C2, p), 200)
    _, _, after = shard.assignments()
    D = ((X[ids[after >= 0]].astype(np.float64)[:, None, :] - C2[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(after[after >= 0], D.argmin(axis=1))


def test_a_sliding_window_on_the_cluster_keeps_the_invariants(local_ray) -> None:
    X = np.concatenate([blobs(900, seed=0), blobs(900, seed=1, shift=20.0)])  # drift
    window = 500
    coord = StreamCoordinator(3, 4, X.shape[1], seed=2, batch_size=40)
    try:
        n = 0
        for t, m in enumerate((150, 90, 260, 170, 130, 200, 300, 100, 200, 200)):
            before = max(0, n + m - window)
            if t == 6:  # a shard lost just before a retirement: found by the retirement
                doomed = coord.shards[1]
                ray.kill(doomed)
                wait_dead(doomed)
            coord.retire(None, before)  # retire, then append: as one machine feeds
            coord.append(X[n : n + m], np.arange(n, n + m))
            n += m
            coord.step()
            check(coord, X, np.arange(before, n))
        for _ in range(100):
            if coord.step().converged:
                break
        check(coord, X, np.arange(n - window, n))
        assert coord.converged and coord.batch_size == window and coord.n_lost == 1
        state = coord.state()
        assert state.n_retired == n - window and state.n_ingested == n
        # Chunks wholly out of the window were dropped from the records.
        for chunks, alive in zip(coord.chunks, coord.alive, strict=True):
            assert all(a.any() for a in alive) and len(chunks) == len(alive)
    finally:
        coord.close()


def test_retired_ids_survive_a_lost_shard_and_the_records_are_compacted(
    local_ray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream, "_COMPACT_MIN", 20)
    X = blobs(1200, seed=4)
    rng = np.random.default_rng(5)
    coord = StreamCoordinator(2, 4, X.shape[1], seed=3, batch_size=40)
    kept = np.empty(0, dtype=np.int64)
    try:
        for start in range(0, 1200, 100):
            ids = np.arange(start, start + 100)
            coord.append(X[ids], ids)
            kept = np.concatenate([kept, ids])
            coord.step()
            drop = rng.choice(kept, size=60, replace=False)  # a reservoir's evictions
            coord.retire(drop, 0)
            kept = np.setdiff1d(kept, drop)
            coord.step()
            check(coord, X, kept)
        with pytest.raises(ValueError, match="not stored"):
            coord.retire(np.array([drop[0]]), 0)  # already retired: nothing changes
        check(coord, X, kept)
        for alive in coord.alive:  # compacted: dead rows in the records stay bounded
            dead = sum(int((~a).sum()) for a in alive)
            assert dead <= max(sum(int(a.sum()) for a in alive), 20)
        assert sum(len(c) for c in coord.chunks) < 12  # some records were compacted
        doomed = coord.shards[1]
        ray.kill(doomed)
        wait_dead(doomed)
        for _ in range(200):
            if coord.step().converged:
                break
        assert coord.n_lost == 1
        check(coord, X, kept)  # the replacement holds exactly the retained rows
        assert coord.converged and coord.batch_size == kept.shape[0]
    finally:
        coord.close()
