"""Stable cluster identities (issue 36, item 5): the engine's facts, their composition,
the kept record, and a forced relocation through the service (real Redis).

The engine says which clusters each step relocated and swapped
(``IterationStats.relocated``, ``.swaps``); :class:`~nmbatch.service.identities.Lineage`
composes them between kept versions; ``GET /versions`` shows them and
:func:`nmbatch_client.follow_cluster` follows a cluster across versions.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import redis
from service_helpers import post_npy

from nmbatch.engine.algorithms import make_algorithm
from nmbatch.engine.state import IterationStats, ModelState
from nmbatch.engine.store import NestedBatchStore
from nmbatch.service.identities import KEPT, RELOCATED, SWAPPED, Lineage
from nmbatch.service.main import create_app
from nmbatch.service.state import PublishedModel
from nmbatch.service.storage import ModelKeys, ModelRepository, Snapshot
from nmbatch_client import follow_cluster
from tests.testkit import SettingsFactory, TestClient, blobs, wait_until


def _stats(relocated: tuple[int, ...] = (), swaps: tuple[tuple[int, int, int], ...] = ()):
    return IterationStats(
        iteration=1, batch_size=1, next_batch_size=1, n_samples=1, n_changed=0, n_new=0,
        doubled=False, converged=False, n_distances=0, n_skipped=0, seconds=0.0,
        n_relocated=len(relocated), relocated=relocated, swaps=swaps,
    )  # fmt: skip


def _by_samples(k: int, steps: list[IterationStats]) -> tuple[list[int | None], list[int]]:
    """The reference: one token per base cluster, moved as the engine moves samples (a
    relocated cluster had none: its token, if any, is gone; a merged cluster's tokens
    join ``into``), and the origin of each index, the later fact winning."""
    where: dict[int, int | None] = {i: i for i in range(k)}  # base cluster -> index now
    origin = [KEPT] * k
    for stats in steps:
        for j in stats.relocated:
            for base, at in where.items():
                if at == j:
                    where[base] = None
            origin[j] = RELOCATED
        for merged, into, _ in stats.swaps:
            for base, at in where.items():
                if at == merged:
                    where[base] = into
            origin[merged] = SWAPPED
    return [where[i] for i in range(k)], origin


@pytest.mark.parametrize("seed", range(20))
def test_the_lineage_composes_steps_as_the_samples_move(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = 8
    steps = []
    for _ in range(int(rng.integers(1, 6))):
        order = rng.permutation(k).tolist()
        n_rel, n_swap = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        relocated = tuple(order[:n_rel])
        rest = order[n_rel:]
        swaps = tuple(tuple(rest[3 * i : 3 * i + 3]) for i in range(n_swap))  # distinct
        steps.append(_stats(relocated, swaps))
    lineage = Lineage.start(7, k)
    for stats in steps:
        lineage = lineage.after(stats)
    matching, origin = _by_samples(k, steps)
    assert [None if m < 0 else int(m) for m in lineage.matching] == matching
    assert lineage.origin.tolist() == origin
    assert lineage.since == 7
    doc = lineage.document()
    assert doc["ended"] == [i for i in range(k) if matching[i] is None]
    assert doc["matching"] == [[i, matching[i]] for i in range(k) if matching[i] != i]
    back = Lineage.from_fields({f.encode(): v if isinstance(v, bytes) else v.encode()
                                for f, v in lineage.to_fields().items()})  # fmt: skip
    assert back is not None and back.document() == doc


def test_a_step_without_facts_or_a_restore_keeps_the_lineage() -> None:
    lineage = Lineage.start(None, 3)
    assert lineage.after(None) is lineage and lineage.after(_stats()) is lineage
    assert Lineage.from_fields({b"version": b"1"}) is None  # a record from before
    assert lineage.document() == {
        "since": None, "relocated": [], "swapped": [], "ended": [], "matching": []
    }


@pytest.mark.parametrize("name", ["nmbatch", "lloyd"])
def test_the_engine_names_the_clusters_it_relocated_and_swapped(name: str) -> None:
    """Half the starting centroids far from every sample (as tests/test_relocation.py):
    they empty and are relocated; each named one was empty before the step's relocation
    and holds samples after, and the swaps are the algorithm's own."""
    X = blobs(3_000, 4, 12, seed=3)
    init = np.concatenate([X[:48], X[:48] + np.float32(500.0)])
    store = NestedBatchStore(4, seed=0)
    store.append(X)
    extra = {"swap": True} if name == "nmbatch" else {}
    algo = make_algorithm(name, store, 96, init=init, batch_size=150, rho=20.0,
                          random_state=1, **extra)  # fmt: skip
    seen_relocated = seen_swaps = 0
    for _ in range(40):
        far = np.flatnonzero((algo.centroids > 250.0).all(axis=1)) if algo.initialized else None
        stats = algo.step()
        assert len(stats.relocated) == stats.n_relocated == len(set(stats.relocated))
        assert all(algo.v[j] > 0 for j in stats.relocated)
        if far is not None:  # a far centroid wins nothing: relocated, or still empty
            assert set(far) <= set(stats.relocated) | set(np.flatnonzero(algo.v == 0))
        if name == "nmbatch":
            assert stats.swaps == tuple((s.merged, s.into, s.split) for s in algo.last_swaps)
            assert not set(stats.relocated) & {c for s in stats.swaps for c in s}
        seen_relocated += stats.n_relocated
        seen_swaps += len(stats.swaps)
    assert seen_relocated > 0
    assert algo.state().stats is None  # a state without a step says nothing


def test_a_kept_version_holds_its_lineage(redis_client: redis.Redis, model_name: str) -> None:
    C = np.zeros((3, 2), dtype=np.float32)
    s = ModelState(C, np.ones(3, dtype=np.int64), 3, 3, 1, False, True, energy=1.0)
    lineage = Lineage.start(4, 3).after(_stats((1,), ()))
    model = PublishedModel.build(version=5, state=s, lineage=lineage)
    ModelRepository(redis_client, model_name).write_snapshot(Snapshot(model, "1-0"), keep=3)
    stored = Snapshot.from_fields(redis_client.hgetall(ModelKeys(model_name).version(5)))
    assert stored.model.lineage is not None
    assert stored.model.lineage.document() == lineage.document()


# -- through the service: a forced relocation -------------------------------------------------
def _versions(client: TestClient) -> list[dict[str, Any]]:
    return client.get("/versions").json()["versions"]


@pytest.mark.parametrize("worker_process", [False, True], ids=["thread", "process"])
def test_identities_across_a_forced_relocation(
    make_settings: SettingsFactory, worker_process: bool
) -> None:
    """A window whose samples all move far away: clusters empty and are relocated. The
    kept versions say which, in a chain (each against the one before it); clusters
    untouched in the stationary phase stay themselves, and follow_cluster follows them."""
    W = 400
    settings = make_settings(
        k=4, retention="window", max_samples=W, batch_size=64, worker_process=worker_process,
        keep_versions=1000,
    )  # fmt: skip
    old = blobs(W, 2, 4, seed=3, separation=10.0)
    new = blobs(W, 2, 2, seed=4, separation=10.0) + np.float32(200.0)
    with TestClient(create_app(settings)) as client:
        assert post_npy(client, old).status_code == 202

        def settled() -> bool:
            stats = client.get("/stats").json()
            kept = _versions(client)
            return bool(stats["converged"] and kept and kept[-1]["version"] == stats["version"])

        wait_until(settled, 60, "the first window settled and kept")
        before = _versions(client)[-1]["version"]
        for start in range(0, W, 50):  # the whole window replaced, batch by batch
            assert post_npy(client, new[start : start + 50]).status_code == 202

        def moved() -> bool:
            centroids = np.array(client.get("/centroids").json()["centroids"])
            return bool((centroids > 100.0).all() and settled())

        wait_until(moved, 60, "every centroid on the second window, settled and kept")
        kept = _versions(client)
    after = [row for row in kept if row["version"] > before]
    relocated = sorted({j for row in after for j in row["identities"]["relocated"]})
    assert relocated, [(r["version"], r["identities"], r["changed"]) for r in after]
    for prev, row in itertools.pairwise(kept):  # a chain of kept versions
        ids = row["identities"]
        assert ids["since"] == prev["version"]
        assert all(0 <= old < 4 for old, _ in ids["matching"])
        # an index with a new meaning is not its old cluster any more
        renamed = set(ids["relocated"]) | set(ids["swapped"])
        assert not renamed & {old for old, new in ids["matching"] if new == old}
        for old in ids["ended"]:
            assert [old, None] in ids["matching"]
    # Following a cluster of the first window's last version through the shift: a
    # cluster whose index was relocated ended (None), the others keep an index.
    followed = {c: follow_cluster(kept, c, before) for c in range(4)}
    last = kept[-1]["version"]
    assert all(last in path for path in followed.values())
    ended = {c for c, path in followed.items() if path[last] is None}
    assert ended, "every relocated index had lost its old cluster"
