"""Hosting a model: in a child process the same numbers as in the thread, and the child's
life (priority, death, its parent's death); the heap trimmer of the child."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nmbatch.engine.hosting import (
    EngineConfig,
    EngineProcess,
    EngineProcessError,
    LocalEngine,
    heap,
)
from nmbatch.engine.metric import metric_rows
from nmbatch.engine.state import ModelState
from tests.testkit import blobs, wait_until

REPO = Path(__file__).resolve().parents[1]
CONFIG = EngineConfig(
    dim=6, k=4, init="k-means++", rho=100.0, batch_size=50, seed=3, nice=5, idle=True
)


def _state(engine: LocalEngine | EngineProcess) -> tuple:
    s = engine.state
    assert isinstance(s, ModelState)
    return (
        s.centroids.tobytes(),
        s.counts.tolist(),
        s.batch_size,
        s.n_samples,
        s.iteration,
        s.converged,
        s.initialized,
        s.energy,
        engine.ready(),
        engine.store.n_samples,
    )


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_process_and_thread_engines_agree_bit_for_bit(metric: str) -> None:
    """Same appends (also between steps), steps and restore: identical state after each call
    (cosine: unit rows and centroids, in the child as in the thread)."""
    config = dataclasses.replace(CONFIG, metric=metric)
    X = blobs(3000, CONFIG.dim, 4, seed=1)
    local, remote = LocalEngine(config), EngineProcess(config)
    try:
        for engine in (local, remote):
            assert not engine.ready()
            engine.store.append(X[:2])  # fewer rows than k: not ready yet
            assert not engine.ready()
            engine.store.append(X[2:1000])
        assert _state(local) == _state(remote)
        for i in range(25):
            states = local.step(), remote.step()
            assert states[0] is local.state and states[1] is remote.state
            stats = states[0].stats, states[1].stats
            assert stats[0] is not None and stats[1] is not None
            assert stats[0] == stats[1] or (
                {**vars(stats[0]), "seconds": 0} == {**vars(stats[1]), "seconds": 0}
            )
            assert _state(local) == _state(remote), f"step {i}"
            assert local.state.energy is not None
            if i == 5:
                for engine in (local, remote):
                    engine.store.append(X[1000:])
        C = local.state.centroids + np.float32(0.25)
        b = local.state.batch_size
        for engine in (local, remote):
            assert engine.restore(C, b, 99).stats is None
        assert _state(local) == _state(remote)
        assert (local.state.batch_size, local.state.iteration) == (b, 99)
        assert np.array_equal(local.state.centroids, metric_rows(C, metric))
        local.step(), remote.step()
        assert _state(local) == _state(remote)
    finally:
        remote.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_child_is_named_and_runs_at_the_lower_priority() -> None:
    engine = EngineProcess(CONFIG)
    try:
        pid = engine.pid
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "nmbatch-engine"
        nice = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        assert nice == os.getpriority(os.PRIO_PROCESS, 0) + CONFIG.nice
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the server's side unchanged
    finally:
        engine.close()
    assert not engine.process.is_alive()
    engine.close()  # twice: nothing happens


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_lower_priority_sets_the_class_and_openmp_waits_without_spinning(given, seen) -> None:
    """In a real process: SCHED_IDLE, and OpenMP's wait policy passive unless set."""
    code = textwrap.dedent(
        """
        import os
        from nmbatch.engine.hosting import EngineConfig, lower_priority
        lower_priority(EngineConfig(2, 2, "random", 1.0, 10, 0, idle=True))
        print(os.sched_getscheduler(0) == os.SCHED_IDLE, os.environ["OMP_WAIT_POLICY"])
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", seen]


def test_a_dead_child_is_an_error_at_the_next_call_not_a_hang() -> None:
    engine = EngineProcess(CONFIG)
    try:
        engine.store.append(blobs(200, CONFIG.dim, 4, seed=2))
        engine.step()
        os.kill(engine.pid, signal.SIGKILL)
        engine.process.join(10)
        with pytest.raises(EngineProcessError, match=r"gone|exited"):
            for _ in range(3):  # the first append may still fit in the pipe
                engine.store.append(blobs(10, CONFIG.dim, 4, seed=3))
                engine.step()
    finally:
        engine.close()


def test_bad_rows_are_refused_in_the_parent() -> None:
    engine = LocalEngine(CONFIG)
    remote = EngineProcess(CONFIG)
    try:
        with pytest.raises(ValueError):
            remote.store.append(np.zeros((3, CONFIG.dim + 1), dtype=np.float32))
        assert remote.store.n_samples == 0
        remote.store.append(blobs(100, CONFIG.dim, 4, seed=4))
        engine.store.append(blobs(100, CONFIG.dim, 4, seed=4))
        assert _state(engine) == _state(remote)
    finally:
        remote.close()


_ORPHAN = textwrap.dedent(
    """
    import sys, time
    from nmbatch.engine.hosting import EngineConfig, EngineProcess
    engine = EngineProcess(EngineConfig(dim=3, k=2, init="first", rho=100.0, batch_size=10,
                                        seed=0))
    print(engine.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_the_child_dies_with_a_killed_server() -> None:
    """``kill -9`` of the process that owns the engine leaves no engine process behind."""
    owner = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        os.kill(child, 0)  # running
    finally:
        owner.kill()
        owner.wait()

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        # A zombie until its new parent reaps it: dead all the same.
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z"

    wait_until(gone, timeout=10, what="the engine process to exit")


def test_feed_retires_and_appends_the_same_in_both_hosts() -> None:
    """A policy's admissions (window and reservoir) carried out through ``feed``: the
    thread and the child agree bit for bit, and ``rows_of`` returns the rows by id."""
    from nmbatch.engine.retention import ReservoirRetention, WindowRetention

    X = blobs(4000, CONFIG.dim, 4, seed=2)
    for policy_of in (lambda: WindowRetention(700), lambda: ReservoirRetention(600, seed=1)):
        local, remote = LocalEngine(CONFIG), EngineProcess(CONFIG)
        try:
            policies = policy_of(), policy_of()
            for start in range(0, 4000, 250):
                chunk = X[start : start + 250]
                for engine, policy in zip((local, remote), policies, strict=True):
                    adm = policy.admit(chunk.shape[0])
                    engine.feed(
                        chunk[adm.keep], adm.ids, n_after=policy.retained,
                        retire_ids=adm.retire_ids, retire_before=adm.retire_before,
                    )  # fmt: skip
                    if engine.ready():
                        engine.step()
                assert _state(local) == _state(remote)
            ids = local._algo.store.ids()
            assert ids.shape[0] == policies[0].retained == remote.store.n_samples
            if isinstance(policies[0], WindowRetention):
                assert sorted(ids.tolist()) == list(range(4000 - 700, 4000))
            else:
                assert sorted(ids.tolist()) == sorted(policies[0].slots.tolist())
            pick = np.sort(ids)[::-7][:50]
            assert np.array_equal(remote.rows_of(pick), X[pick])
            assert np.array_equal(local.rows_of(pick), X[pick])
        finally:
            remote.close()


def test_weighted_feeds_are_the_same_in_both_hosts() -> None:
    """Weights through ``feed`` (window and reservoir admissions, weight 0 included, some
    chunks unweighted): the thread and the child agree bit for bit after every step, and
    ``weights_of`` answers each stored row's weight by id; bad weights are refused in
    the parent, nothing sent."""
    from nmbatch.engine.retention import ReservoirRetention, WindowRetention

    X = blobs(3000, CONFIG.dim, 4, seed=5)
    w = np.random.default_rng(6).integers(0, 9, size=3000) / 4.0
    for policy_of in (lambda: WindowRetention(700), lambda: ReservoirRetention(600, seed=1)):
        local, remote = LocalEngine(CONFIG), EngineProcess(CONFIG)
        try:
            policies = policy_of(), policy_of()
            for start in range(0, 3000, 250):
                chunk, weights = X[start : start + 250], w[start : start + 250]
                if start == 500:  # an unweighted chunk: its rows weigh 1
                    weights = np.ones(250)
                for engine, policy in zip((local, remote), policies, strict=True):
                    adm = policy.admit(chunk.shape[0])
                    engine.feed(
                        chunk[adm.keep], adm.ids, n_after=policy.retained,
                        retire_ids=adm.retire_ids, retire_before=adm.retire_before,
                        weights=None if start == 500 else weights[adm.keep],
                    )  # fmt: skip
                    if engine.ready():
                        engine.step()
                assert _state(local) == _state(remote)
            assert local.state.counts.dtype == np.float64  # sums of weights
            ids = np.sort(local._algo.store.ids())
            expected = w[ids].copy()
            expected[(ids >= 500) & (ids < 750)] = 1.0
            assert np.array_equal(remote.weights_of(ids[::-1]), expected[::-1])
            assert np.array_equal(local.weights_of(ids), expected)
            with pytest.raises(ValueError, match="weights"):
                remote.feed(X[:2], np.array([9000, 9001]), n_after=0, weights=[1.0, -1.0])
            remote.step()  # the child is still there, unchanged
        finally:
            remote.close()


def test_feed_in_any_order_restores_a_retained_set() -> None:
    """Rows given with ids in any order (a reservoir's base, slot order) are stored under
    them, and later appends continue above the largest."""
    X = blobs(300, CONFIG.dim, 4, seed=4)
    ids = np.random.default_rng(0).permutation(1000)[:300].astype(np.int64)
    remote = EngineProcess(CONFIG)
    try:
        remote.feed(X, ids, n_after=300, any_order=True)
        assert np.array_equal(remote.rows_of(ids[::-1]), X[::-1])
        state = remote.step()
        assert state.n_samples == 300 and state.n_ingested == int(ids.max()) + 1
        with pytest.raises(EngineProcessError, match="ids must be >="):
            remote.feed(X[:1], np.array([5]), n_after=301)  # below the next id: refused
            remote.step()
    finally:
        remote.close()


def test_the_heap_trimmer_trims_at_most_once_per_period(monkeypatch) -> None:
    calls: list[int] = []
    clock = [100.0]
    monkeypatch.setattr(heap.time, "monotonic", lambda: clock[0])
    trimmer = heap.HeapTrimmer(every=1.0)
    if trimmer._trim is None:
        pytest.skip("no glibc malloc_trim here")
    real = trimmer._trim
    trimmer._trim = calls.append
    trimmer.maybe()  # less than a period since it was made
    clock[0] += 0.5
    trimmer.maybe()
    assert calls == []
    clock[0] += 0.6
    trimmer.maybe()
    trimmer.maybe()
    assert calls == [0]
    clock[0] += 1.0
    trimmer.maybe()
    assert calls == [0, 0]
    assert real(0) in (0, 1)  # glibc's own: 1 if it gave memory back, else 0
