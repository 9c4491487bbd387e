"""Streaming appends on the Ray backend (issue 14, phase 2: the service's engine).

A :class:`StreamCoordinator` on a local Ray (one node, no dashboard, small object store,
started once for the module) fed log entry by log entry between rounds: after every
round the prefix is the set of the ``b`` lowest priorities of the whole store, each new
priority was drawn at or above the ``tau`` in force, every row is in exactly one shard,
``S / v`` is the mean of each cluster's voted rows and ``v`` sums to ``b``; a restore
rebuilds the same sums from the centroids; repeated priorities are made distinct.
Under ``metric="cosine"`` the Ray host (:class:`RayEngine`) fed rows of any length ends
where the local engine ends from the same start (given centroids normalised by both):
unit rows on the shards, unit centroids, each the normalised sum of its members; a zero
row is refused at ``feed``, naming it, and nothing is appended; a deletion and a restore
keep the centroids unit.
"""

from __future__ import annotations

import numpy as np
import pytest

from nmbatch.engine.distributed.priorities import distinct, respread
from nmbatch.engine.hosting import EngineConfig, LocalEngine
from nmbatch.engine.metric import unit_rows

ray = pytest.importorskip("ray")

from nmbatch.engine.distributed.stream import StreamCoordinator  # noqa: E402
from nmbatch.engine.hosting.ray import RayEngine  # noqa: E402


def entries(seed: int = 0, n: int = 1800, d: int = 5, k: int = 4) -> list[np.ndarray]:
    """Blobs cut into log entries of uneven sizes, ``(m, d)`` float32 each."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 8.0, (k, d))
    X = (means[rng.integers(0, k, n)] + rng.normal(0.0, 1.0, (n, d))).astype(np.float32)
    return np.split(X, np.sort(rng.choice(np.arange(1, n), 11, replace=False)))


def check(coord: StreamCoordinator, X: np.ndarray) -> None:
    """The invariants of the store and the sums after a round (``X``: rows by stream id)."""
    parts = ray.get([a.assignments.remote() for a in coord.shards])
    ids = np.concatenate([p[0] for p in parts])
    priority = np.concatenate([p[1] for p in parts])
    labels = np.concatenate([p[2] for p in parts])
    np.testing.assert_array_equal(np.sort(ids), np.arange(X.shape[0]))  # each in one shard
    waiting = priority[priority >= coord.tau]  # distinct (prefix rows may tie: respread)
    assert np.unique(waiting).shape[0] == waiting.shape[0]
    voted = labels >= 0  # the prefix: the b lowest priorities, every one below tau
    assert voted.sum() == coord.batch_size
    assert (priority[voted] < coord.tau).all() and (priority[~voted] >= coord.tau).all()
    assert coord.v.sum() == coord.batch_size
    for j in range(coord.n_clusters):
        mine = X[ids[voted][labels[voted] == j]].astype(np.float64)
        assert mine.shape[0] == coord.v[j]
        np.testing.assert_allclose(coord.S[j], mine.sum(axis=0), rtol=1e-9, atol=1e-6)


def test_appends_between_rounds_keep_the_prefix_the_lowest_priorities(local_ray) -> None:
    chunks = entries()
    coord = StreamCoordinator(3, 4, chunks[0].shape[1], seed=1, batch_size=40)
    try:
        n = 0
        for chunk in chunks:
            tau = coord.tau
            coord.append(chunk, np.arange(n, n + chunk.shape[0]))
            n += chunk.shape[0]
            s = (coord._next_shard - 1) % 3
            assert (coord.chunks[s][-1][2] >= tau).all()  # drawn at or above tau
            assert (coord.chunks[s][-1][2] % 3 == s).all()  # the shard's residue class
            if n >= 4:
                coord.step()
                check(coord, np.concatenate(chunks)[:n])
        for _ in range(100):
            if coord.step().converged:
                break
        X = np.concatenate(chunks)
        check(coord, X)
        assert coord.tau < 1 << 61  # respread: the room for new rows is whole again
        assert coord.converged and coord.batch_size == X.shape[0]

        S, v, C = coord.S.copy(), coord.v.copy(), coord.centroids.copy()
        coord.restore(C, coord.batch_size, coord.iteration)
        check(coord, X)
        np.testing.assert_array_equal(coord.v, v)
        np.testing.assert_allclose(coord.S, S, rtol=1e-12)
        np.testing.assert_array_equal(coord.rows_of(np.array([5, 0, 1799])), X[[5, 0, 1799]])
    finally:
        coord.close()


def test_repeated_priorities_are_raised_in_their_residue_class() -> None:
    priority = np.array([7, 4, 7, 10, 7, 13], dtype=np.int64)
    out = distinct(priority, 3)
    assert np.unique(out).shape[0] == out.shape[0]
    assert out[0] == 7 and out[1] == 4  # rows before any repeat keep their value
    assert ((out - priority) % 3 == 0).all() and (out >= priority).all()


def test_respread_keeps_the_order_the_residues_and_the_prefix() -> None:
    rng = np.random.default_rng(0)
    P, tau, levels = 3, (1 << 62) - 1000, 1 << 40
    priority = np.sort(rng.integers(0, 1 << 62, 500)) // P * P + 2
    out = respread(priority, tau, 2 * levels * P, levels, P)
    assert (np.diff(out) >= 0).all() and (out % P == 2).all()
    assert ((out < 2 * levels * P) == (priority < tau)).all()


def test_the_ray_host_clusters_directions_where_the_local_engine_does(local_ray) -> None:
    rng = np.random.default_rng(4)
    k, d, n = 3, 5, 900
    which = rng.integers(k, size=n)
    axes = np.eye(d)[:k] + 0.2  # about 70 degrees apart
    X = (axes[which] + 0.1 * rng.normal(size=(n, d))) * rng.uniform(0.01, 100.0, (n, 1))
    X = X.astype(np.float32)
    U = unit_rows(X)
    init = 5.0 * X[[int(np.flatnonzero(which == j)[0]) for j in range(k)]]  # not unit
    config = EngineConfig(dim=d, k=k, init=init, rho=100.0, batch_size=30, seed=1,
                          metric="cosine")  # fmt: skip
    local, on_ray = LocalEngine(config), RayEngine(config, "local", 2)
    try:
        for host in (local, on_ray):
            for start in range(0, n, 100):
                ids = np.arange(start, start + 100)
                host.feed(X[ids], ids, n_after=start + 100)
        bad = X[:4].copy()
        bad[2] = 0.0
        records = [len(c) for c in on_ray.coordinator.chunks]
        for host in (local, on_ray):
            with pytest.raises(ValueError, match="row 2 is a zero vector"):
                host.feed(bad, np.arange(n, n + 4), n_after=n + 4)
        assert on_ray.store.n_samples == n
        assert [len(c) for c in on_ray.coordinator.chunks] == records
        np.testing.assert_array_equal(on_ray.rows_of(np.arange(n)), U)  # unit on the shards
        for host in (local, on_ray):
            for _ in range(60):
                if host.step().converged:
                    break
            assert host.state.converged
        C = on_ray.state.centroids
        np.testing.assert_allclose(C, local.state.centroids, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(on_ray.state.counts, local.state.counts)
        assert on_ray.state.energy == pytest.approx(local.state.energy, rel=1e-6)
        C64 = C.astype(np.float64)
        assert np.all(np.abs((C64 * C64).sum(axis=1) - 1.0) <= 2.0**-21)
        labels = np.argmax(U.astype(np.float64) @ C64.T, axis=1)
        for j in range(k):
            total = U[labels == j].astype(np.float64).sum(axis=0)
            np.testing.assert_allclose(C64[j], total / np.linalg.norm(total), rtol=0, atol=1e-6)

        gone = np.flatnonzero(labels == 1)[:40]  # the cluster's sums and centroid move
        for host in (local, on_ray):
            assert host.forget(gone).all()
        np.testing.assert_allclose(on_ray.state.centroids, local.state.centroids,
                                   rtol=0, atol=1e-6)  # fmt: skip
        moved = on_ray.state.centroids[1].astype(np.float64)
        assert abs(moved @ moved - 1.0) <= 2.0**-21 and not np.array_equal(moved, C64[1])
        restored = on_ray.restore(3.0 * C, n - 40, 7)  # given centroids are normalised
        np.testing.assert_allclose(restored.centroids, C, rtol=0, atol=1e-6)
        norms2 = (restored.centroids.astype(np.float64) ** 2).sum(axis=1)
        assert np.all(np.abs(norms2 - 1.0) <= 2.0**-21)
    finally:
        on_ray.close()
