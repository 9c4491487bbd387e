"""Rows fed by reference on the Ray backend: the shards read them from a source.

A :class:`StreamCoordinator` on a local Ray (one node, started once for the module) fed
:class:`SourceRows` instead of arrays, with a :class:`RowSource` over arrays held in the
process (pickled into each shard actor, as the service's :class:`RedisRows` is; the
Redis one is tested in ``tests/service/test_shard_entries.py``). Tested: the same run
as one fed arrays, bit for bit; the coordinator's records hold no rows; a replacement
shard reads its partition from the source; records compacted by reference; a rebase
points the records at moved rows (and a wrong one changes nothing). Under
``metric="cosine"`` the shard normalises the rows it reads: the run of arrays normalised
by the driver, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from nmbatch.engine.metric import unit_rows
from nmbatch.engine.rows import SourceRows

ray = pytest.importorskip("ray")

from nmbatch.engine.distributed import stream  # noqa: E402
from nmbatch.engine.distributed.coordinator import MAX_LOSSES_IN_A_ROW  # noqa: E402
from nmbatch.engine.distributed.stream import StreamCoordinator  # noqa: E402
from tests.test_ray_retention import blobs, check, wait_dead  # noqa: E402


def array_source(arrays: dict[str, np.ndarray]) -> Any:
    """A :class:`~nmbatch.engine.rows.RowSource` over named arrays (a class
    made here, so that Ray pickles it by value: the actors cannot import this module)."""

    class ArraySource:
        def __init__(self, arrays: dict[str, np.ndarray]) -> None:
            self.arrays = arrays

        def read(self, refs: Sequence[str]) -> list[np.ndarray]:
            return [self.arrays[ref] for ref in refs]

    return ArraySource(arrays)


def by_reference(X: np.ndarray, size: int) -> tuple[Any, list[tuple[SourceRows, np.ndarray]]]:
    """``X`` cut into entries of ``size`` rows: the source holding them and, per entry,
    the rows named and their stream ids."""
    arrays, fed = {}, []
    for start in range(0, X.shape[0], size):
        ids = np.arange(start, min(start + size, X.shape[0]))
        arrays[f"e{start}"] = X[ids]
        fed.append((SourceRows.whole(f"e{start}", ids.shape[0], X.shape[1]), ids))
    return array_source(arrays), fed


def test_rows_by_reference_give_the_run_of_rows_by_value(local_ray) -> None:
    X = blobs(900, seed=6)
    source, fed = by_reference(X, 75)
    named = StreamCoordinator(3, 4, X.shape[1], seed=8, batch_size=40, source=source)
    valued = StreamCoordinator(3, 4, X.shape[1], seed=8, batch_size=40)
    try:
        for rows, ids in fed:
            keep = np.arange(ids.shape[0]) % 5 != 0  # a subset of the entry, as admitted
            named.append(rows[keep], ids[keep])
            valued.append(X[ids[keep]], ids[keep])
            a, b = named.step(), valued.step()
            assert (a.n_changed, a.n_new, a.batch_size) == (b.n_changed, b.n_new, b.batch_size)
            np.testing.assert_array_equal(named.centroids, valued.centroids)
            np.testing.assert_array_equal(named.S, valued.S)
        kept = np.flatnonzero(np.arange(X.shape[0]) % 75 % 5 != 0)
        check(named, X, kept)
        for chunks in named.chunks:  # the records name rows, they hold none
            assert chunks and all(isinstance(rows, SourceRows) for rows, *_ in chunks)
    finally:
        named.close()
        valued.close()


def test_cosine_rows_by_reference_are_normalised_by_the_shard_that_reads_them(local_ray) -> None:
    X = blobs(600, seed=2)
    X *= np.random.default_rng(2).uniform(0.01, 100.0, (X.shape[0], 1)).astype(np.float32)
    source, fed = by_reference(X, 100)  # the source holds the rows as sent, not unit
    kw = {"seed": 8, "batch_size": 40, "metric": "cosine"}
    named = StreamCoordinator(2, 4, X.shape[1], source=source, **kw)
    valued = StreamCoordinator(2, 4, X.shape[1], **kw)
    try:
        for rows, ids in fed:
            named.append(rows, ids)
            valued.append(X[ids], ids)
            for coord in (named, valued):
                coord.step()
            np.testing.assert_array_equal(named.centroids, valued.centroids)
            np.testing.assert_array_equal(named.S, valued.S)
        np.testing.assert_array_equal(named.rows_of(np.arange(X.shape[0])), unit_rows(X))
    finally:
        named.close()
        valued.close()


def test_a_replacement_reads_its_partition_and_records_compact_by_reference(
    local_ray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream, "_COMPACT_MIN", 20)
    X = blobs(1200, seed=4)
    rng = np.random.default_rng(5)
    source, fed = by_reference(X, 100)
    coord = StreamCoordinator(2, 4, X.shape[1], seed=3, batch_size=40, source=source)
    kept = np.empty(0, dtype=np.int64)
    try:
        for rows, ids in fed:
            coord.append(rows, ids)
            kept = np.concatenate([kept, ids])
            coord.step()
            drop = rng.choice(kept, size=60, replace=False)  # a reservoir's evictions
            coord.retire(drop, 0)
            kept = np.setdiff1d(kept, drop)
            coord.step()
        check(coord, X, kept)
        named = [rows for chunks in coord.chunks for rows, *_ in chunks]
        assert all(isinstance(rows, SourceRows) for rows in named)
        assert sum(len(rows) for rows in named) < 1200 - 20  # compacted: fewer rows named
        for alive in coord.alive:  # compacted by reference: only dead rows since
            assert sum(int((~a).sum()) for a in alive) <= max(sum(int(a.sum()) for a in alive), 20)
        doomed = coord.shards[0]
        ray.kill(doomed)
        wait_dead(doomed)
        for _ in range(200):
            if coord.step().converged:
                break
        assert coord.n_lost == 1
        check(coord, X, kept)  # the replacement read exactly the retained rows
    finally:
        coord.close()


def test_a_rebase_names_the_moved_rows_and_a_replacement_reads_them_there(local_ray) -> None:
    X = blobs(800, seed=2)
    rng = np.random.default_rng(1)
    source, fed = by_reference(X, 80)
    coord = StreamCoordinator(3, 4, X.shape[1], seed=5, batch_size=40, source=source)
    try:
        for rows, ids in fed:
            coord.append(rows, ids)
            coord.step()
        kept = np.sort(rng.choice(800, size=500, replace=False))
        coord.retire(np.setdiff1d(np.arange(800), kept), 0)
        coord.step()
        # The rows move to a "base": new entries of 120 rows, in a shuffled order.
        order = rng.permutation(kept)
        parts = [order[i : i + 120] for i in range(0, order.shape[0], 120)]
        moved = [SourceRows.whole(f"base{e}", p.shape[0], X.shape[1]) for e, p in enumerate(parts)]
        before = [list(c) for c in coord.chunks]
        with pytest.raises(ValueError, match="rows named"):
            coord.rebase(moved[:-1], parts[:-1])  # not every stored row: nothing changes
        twice = [p.copy() for p in parts]
        twice[0][0] = twice[0][1]  # one row named twice, one not at all
        with pytest.raises(ValueError, match="rows named"):
            coord.rebase(moved, twice)
        stranger = [p.copy() for p in parts]
        stranger[-1][-1] = 10_000  # a row that is not stored named instead of one that is
        with pytest.raises(ValueError, match="not every stored row"):
            coord.rebase(moved, stranger)
        assert all(len(a) == len(b) for a, b in zip(coord.chunks, before, strict=True))
        coord.source.arrays = {f"base{e}": X[p] for e, p in enumerate(parts)}  # old ones gone
        coord.rebase(moved, parts)
        for chunks in coord.chunks:
            assert all(rows.ref.startswith("base") for rows, *_ in chunks)
        doomed = coord.shards[2]
        ray.kill(doomed)
        wait_dead(doomed)
        for _ in range(200):
            if coord.step().converged:
                break
        assert coord.n_lost == 1
        check(coord, X, kept)  # read from the base entries, same ids, same priorities
    finally:
        coord.close()


def test_a_shard_that_cannot_start_stops_the_run_instead_of_replacing_it_forever(
    local_ray,
) -> None:
    def refuse() -> None:
        raise RuntimeError("this source cannot be unpickled here")

    class Unreadable:
        def __reduce__(self) -> tuple[Any, tuple]:
            return refuse, ()  # every actor given it dies as it starts

        def read(self, refs: Sequence[str]) -> list[np.ndarray]:
            raise AssertionError("never built")

    coord = StreamCoordinator(2, 4, 5, seed=1, batch_size=40, source=Unreadable())
    try:
        with pytest.raises(RuntimeError, match="lost 6 times in a row"):
            coord.step()
        assert coord.n_lost == 2 * MAX_LOSSES_IN_A_ROW  # each shard replaced 5 times
    finally:
        coord.close()
