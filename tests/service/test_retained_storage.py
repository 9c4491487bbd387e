"""The retained samples in Redis (``service.storage.retained``): log trimming, compaction
into a base, crash safety under ``kill -9`` at every stage (real child processes, a real
``redis-server``), the lease fence, conflicting writers, and a commit at ``maxmemory``."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis

from nmbatch.service.storage import (
    Base,
    BaseChangedError,
    LeaseLostError,
    ModelKeys,
    RetainedLog,
    WorkerLease,
    next_id,
)
from nmbatch.service.storage.retained_base import decode_base_entry

D = 8
ROWS_PER_LOG_ENTRY = 40
LOG_ENTRIES = 12
ENTRY_BYTES = 256  # 256 // (4 * 8 + 8) = 6 rows per base entry
PIPELINE_ENTRIES = 3


# -- a model with a log, a first base, and the next compaction's input -------------------
@dataclass
class Scenario:
    """A model whose base is generation 1; ``new_*`` is the input of compaction 2.

    The samples of the log are rows ``0 .. 479`` (ids = row numbers, 40 per entry). Base 1
    holds 60 of rows 0..159 (entries 0..3); compaction 2 keeps 100 of base 1 and rows
    160..319 (entries 4..7), in a random order.
    """

    keys: ModelKeys
    retained: RetainedLog
    X: np.ndarray  # every sample ever logged, (480, D) float32
    entry_ids: list[str]
    old: tuple[np.ndarray, np.ndarray, np.ndarray]  # base ids, base rows, later log rows
    new_ids: np.ndarray
    new_rows: np.ndarray
    new_last_id: str
    new_policy: dict

    @property
    def new(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        later = self.X[8 * ROWS_PER_LOG_ENTRY :]
        return self.new_ids, self.new_rows, later


def make_retained(client: redis.Redis, model: str) -> RetainedLog:
    retained = RetainedLog(client, ModelKeys(model))
    retained.entry_bytes = ENTRY_BYTES
    retained.pipeline_entries = PIPELINE_ENTRIES
    return retained


def fill_log(client: redis.Redis, keys: ModelKeys, X: np.ndarray) -> list[str]:
    """Append ``X`` to the log, :data:`ROWS_PER_LOG_ENTRY` rows per entry; their ids."""
    ids = []
    for start in range(0, X.shape[0], ROWS_PER_LOG_ENTRY):
        part = X[start : start + ROWS_PER_LOG_ENTRY]
        fields = {"n": part.shape[0], "d": D, "x": part.tobytes()}
        ids.append(client.xadd(keys.log, fields).decode())
    return ids


def make_scenario(client: redis.Redis, model: str, seed: int = 0) -> Scenario:
    rng = np.random.default_rng(seed)
    keys = ModelKeys(model)
    X = rng.standard_normal((LOG_ENTRIES * ROWS_PER_LOG_ENTRY, D)).astype(np.float32)
    entry_ids = fill_log(client, keys, X)
    retained = make_retained(client, model)
    ids1 = rng.choice(4 * ROWS_PER_LOG_ENTRY, size=60, replace=False).astype(np.int64)
    retained.compact(ids1, X[ids1], last_id=entry_ids[3], policy={"seen": 160})
    pool = np.concatenate([ids1, np.arange(160, 320)])
    ids2 = rng.choice(pool, size=100, replace=False).astype(np.int64)
    old = (ids1, X[ids1], X[4 * ROWS_PER_LOG_ENTRY :])
    return Scenario(keys, retained, X, entry_ids, old, ids2, X[ids2], entry_ids[7],
                    {"seen": 320, "rng": [1, 2]})  # fmt: skip


def retained_state(retained: RetainedLog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a restart reads: (base ids, base rows, rows of the log after the base)."""
    base = retained.read_base()
    ids, rows = np.empty(0, np.int64), np.empty((0, D), np.float32)
    start = "-"
    if base is not None:
        parts = list(retained.base_rows(base, page=2))
        if parts:
            ids = np.concatenate([p[0] for p in parts])
            rows = np.concatenate([p[1] for p in parts])
        start = "(" + base.last_id
    entries = retained.client.xrange(retained.keys.log, start, "+")
    later = [np.frombuffer(f[b"x"], np.float32).reshape(-1, D) for _, f in entries]
    return ids, rows, np.concatenate(later) if later else np.empty((0, D), np.float32)


def same(state, expected) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(state, expected, strict=True))


def base_keys(client: redis.Redis, keys: ModelKeys) -> set[str]:
    return {k.decode() for k in client.scan_iter(match=keys.prefix + "base:*")}


def dump_keys(client: redis.Redis, keys: ModelKeys) -> dict[bytes, bytes]:
    """Every key of the model with its ``DUMP`` (the serialized value)."""
    return {k: client.dump(k) for k in client.scan_iter(match=keys.prefix + "*")}


# -- a compaction in a child process, killed at a stage ----------------------------------
CHILD = r"""
import json, sys, time
import numpy as np, redis
from nmbatch.service.storage import ModelKeys, RetainedLog

url, model, data, last_id, policy, stop_at, nap = sys.argv[1:8]
arrays = np.load(data)
retained = RetainedLog(redis.Redis.from_url(url), ModelKeys(model))
retained.entry_bytes, retained.pipeline_entries = int(sys.argv[8]), int(sys.argv[9])

def pause(stage):
    print(stage, flush=True)
    if stage == stop_at:
        time.sleep(600)  # the parent kills us here
    elif stage.startswith("chunks"):
        time.sleep(float(nap))

retained.compact(arrays["ids"], arrays["X"], last_id=last_id, policy=json.loads(policy),
                 pause=pause)
print("returned", flush=True)
"""


def start_child(
    url: str, model: str, s: Scenario, tmp_path: Path, stop_at: str, nap: float = 0.0
) -> subprocess.Popen:
    data = tmp_path / f"{model}.npz"
    np.savez(data, ids=s.new_ids, X=s.new_rows)
    args = [url, model, str(data), s.new_last_id, json.dumps(s.new_policy), stop_at, str(nap),
            str(ENTRY_BYTES), str(PIPELINE_ENTRIES)]  # fmt: skip
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, bufsize=0)


def read_stage(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """The next stage the child reports (``""`` when it exited)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the child reported nothing in time"
    return proc.stdout.readline().decode().strip()


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    proc.stdout.close()


def entries_of(n_rows: int) -> int:
    return -(-n_rows // (ENTRY_BYTES // (4 * D + 8)))


M = entries_of(100)  # 17 entries, written 3 per round trip
STAGES = ["begin", "discarded", f"chunks 3/{M}", f"chunks 9/{M}", f"chunks {M}/{M}",
          "written", "committed"]  # fmt: skip


def check_next_compaction(client: redis.Redis, s: Scenario) -> None:
    """After a crash: the next compaction works, and only its base key is left."""
    ids, _, _ = retained_state(s.retained)
    pool = np.concatenate([ids, np.arange(8 * ROWS_PER_LOG_ENTRY, 10 * ROWS_PER_LOG_ENTRY)])
    keep = np.random.default_rng(5).choice(pool, size=50, replace=False)
    before = s.retained.read_base()
    base = s.retained.compact(keep, s.X[keep], last_id=s.entry_ids[9], policy={"seen": 400})
    assert base == Base(before.generation + 1, s.entry_ids[9], 50, {"seen": 400})
    assert s.retained.read_base() == base
    assert same(retained_state(s.retained), (keep, s.X[keep], s.X[10 * ROWS_PER_LOG_ENTRY :]))
    assert base_keys(client, s.keys) == {s.keys.base(base.generation)}
    assert client.xrange(s.keys.log)[0][0].decode() == s.entry_ids[10]


@pytest.mark.fault
@pytest.mark.parametrize("stage", STAGES)
def test_kill_9_at_any_stage_leaves_the_old_or_the_new_retained_set(
    redis_url: str, redis_client: redis.Redis, model_name: str, tmp_path: Path, stage: str
) -> None:
    s = make_scenario(redis_client, model_name)
    assert same(retained_state(s.retained), s.old)
    proc = start_child(redis_url, model_name, s, tmp_path, stop_at=stage)
    seen = []
    while not seen or seen[-1] != stage:
        seen.append(read_stage(proc))
        assert seen[-1], f"the child exited before stage {stage!r}: {seen}"
    kill(proc)
    state = retained_state(s.retained)
    if stage == "committed":
        assert same(state, s.new)
        assert s.retained.read_base() == Base(2, s.new_last_id, 100, s.new_policy)
        assert base_keys(redis_client, s.keys) == {s.keys.base(2)}
    else:
        assert same(state, s.old)
        assert s.retained.read_base() == Base(1, s.entry_ids[3], 60, {"seen": 160})
        written = stage.startswith("chunks") or stage == "written"
        leftover = {s.keys.base(2)} if written else set()
        assert base_keys(redis_client, s.keys) == {s.keys.base(1)} | leftover
        if written:
            assert redis_client.xlen(s.keys.base(2)) == (
                M if stage == "written" else int(stage.split()[1].split("/")[0])
            )
    check_next_compaction(redis_client, s)


@pytest.mark.fault
def test_kill_9_at_random_moments_of_the_writes(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    outcomes = []
    for trial in range(5):
        model = f"random-kill-{trial}"
        s = make_scenario(redis_client, model, seed=trial)
        proc = start_child(redis_url, model, s, tmp_path, stop_at="never", nap=0.01)
        assert read_stage(proc) == "begin"
        time.sleep(random.Random(trial).uniform(0.0, 0.09))  # six round trips of 10 ms
        kill(proc)
        state = retained_state(s.retained)
        assert same(state, s.old) or same(state, s.new)
        outcomes.append("new" if same(state, s.new) else "old")
        check_next_compaction(redis_client, s)
    print("outcomes:", outcomes)


# -- compaction in this process ----------------------------------------------------------
def test_compaction_replaces_the_base_and_trims_the_log(
    redis_client: redis.Redis, model_name: str
) -> None:
    s = make_scenario(redis_client, model_name)
    assert redis_client.xlen(s.keys.log) == LOG_ENTRIES - 4
    stages = []
    base = s.retained.compact(
        s.new_ids, s.new_rows, last_id=s.new_last_id, policy=s.new_policy, pause=stages.append
    )
    assert base == s.retained.read_base() == Base(2, s.new_last_id, 100, s.new_policy)
    assert stages == ["begin", "discarded", *[f"chunks {i}/{M}" for i in (3, 6, 9, 12, 15, M)],
                      "written", "committed"]  # fmt: skip
    assert same(retained_state(s.retained), s.new)
    assert base_keys(redis_client, s.keys) == {s.keys.base(2)}
    entries = redis_client.xrange(s.keys.base(2))
    assert len(entries) == M
    nonce = entries[0][0].decode().split("-")[0]
    assert [e[0].decode() for e in entries] == [f"{nonce}-{i}" for i in range(1, M + 1)]
    ids, rows = decode_base_entry(entries[0][1])
    assert ids.dtype == np.dtype("<i8") and rows.shape == (6, D)
    # Pages of any size give the same rows; a page is one tuple.
    for page in (1, 5, 100):
        parts = list(s.retained.base_rows(base, page=page))
        assert len(parts) == -(-M // page)
        assert np.array_equal(np.concatenate([p[0] for p in parts]), s.new_ids)
        assert np.array_equal(np.concatenate([p[1] for p in parts]), s.new_rows)


def test_rows_given_by_a_function_are_asked_a_trip_at_a_time_and_make_the_same_base(
    redis_client: redis.Redis, model_name: str
) -> None:
    """A reservoir's rows come from the engine page by page (``rows_of``): the base is the
    one the whole array makes, and no call asks for more than one pipeline trip."""
    s = make_scenario(redis_client, model_name)
    by_id = dict(zip(s.new_ids.tolist(), s.new_rows, strict=True))
    asked: list[int] = []

    def rows_of(ids: np.ndarray) -> np.ndarray:
        asked.append(len(ids))
        return np.stack([by_id[i] for i in ids.tolist()]).astype(np.float32)

    base = s.retained.compact(s.new_ids, rows_of, last_id=s.new_last_id, policy=s.new_policy, dim=D)
    assert base == s.retained.read_base() == Base(2, s.new_last_id, 100, s.new_policy)
    assert same(retained_state(s.retained), s.new)
    per_trip = s.retained.pipeline_entries * (ENTRY_BYTES // (4 * D + 8))
    assert sum(asked) == 100 and max(asked) <= per_trip and len(asked) == -(-100 // per_trip)
    with pytest.raises(ValueError, match="dimension"):
        s.retained.compact(s.new_ids, rows_of, last_id=s.new_last_id, policy={})


def test_an_empty_compaction_and_a_base_read_after_its_replacement(
    redis_client: redis.Redis, model_name: str
) -> None:
    s = make_scenario(redis_client, model_name)
    old = s.retained.read_base()
    empty = s.retained.compact(np.empty(0, np.int64), np.empty((0, D), np.float32),
                               last_id=s.entry_ids[5], policy={})  # fmt: skip
    assert empty == Base(2, s.entry_ids[5], 0, {})
    assert list(s.retained.base_rows(empty)) == []
    assert base_keys(redis_client, s.keys) == set()
    assert redis_client.xlen(s.keys.log) == LOG_ENTRIES - 6
    with pytest.raises(BaseChangedError, match="replaced"):
        list(s.retained.base_rows(old))
    with pytest.raises(ValueError, match="before the base"):
        s.retained.compact(s.new_ids, s.new_rows, last_id=s.entry_ids[4], policy={})
    with pytest.raises(ValueError, match="do not match"):
        s.retained.compact(s.new_ids[:3], s.new_rows, last_id=s.entry_ids[7], policy={})


def test_a_compaction_without_the_lease_changes_nothing(
    redis_client: redis.Redis, model_name: str
) -> None:
    s = make_scenario(redis_client, model_name)
    lease = WorkerLease(redis_client, model_name, seconds=30)
    assert lease.acquire()
    held = redis_client.get(s.keys.lock)
    redis_client.set(s.keys.lock, "intruder:run:1")
    before = dump_keys(redis_client, s.keys)
    with pytest.raises(LeaseLostError):
        s.retained.compact(s.new_ids, s.new_rows, last_id=s.new_last_id, policy={},
                           lease_token=lease.token)  # fmt: skip
    assert dump_keys(redis_client, s.keys) == before

    # Lost while writing: no commit; what was written is left for the next compaction.
    redis_client.set(s.keys.lock, held)
    committed = [s.keys.meta, s.keys.log, s.keys.base(1)]
    before = {k: redis_client.dump(k) for k in committed}

    def lose(stage: str) -> None:
        if stage == "written":
            redis_client.set(s.keys.lock, "intruder:run:1")

    with pytest.raises(LeaseLostError):
        s.retained.compact(s.new_ids, s.new_rows, last_id=s.new_last_id, policy={},
                           lease_token=lease.token, pause=lose)  # fmt: skip
    assert {k: redis_client.dump(k) for k in committed} == before
    assert redis_client.xlen(s.keys.base(2)) == M
    assert same(retained_state(s.retained), s.old)
    # The holder again: its compaction deletes the leftover first.
    redis_client.set(s.keys.lock, held)
    s.retained.compact(s.new_ids, s.new_rows, last_id=s.new_last_id, policy=s.new_policy,
                       lease_token=lease.token)  # fmt: skip
    assert same(retained_state(s.retained), s.new)
    assert base_keys(redis_client, s.keys) == {s.keys.base(2)}


def test_a_compaction_that_another_one_overtook_commits_nothing(
    redis_client: redis.Redis, model_name: str
) -> None:
    s = make_scenario(redis_client, model_name)
    other = make_retained(redis_client, model_name)
    theirs = s.new_ids[:30]

    def overtaken(stage: str) -> None:
        if stage == "written":
            other.compact(theirs, s.X[theirs], last_id=s.entry_ids[6], policy={"other": 1})

    with pytest.raises(BaseChangedError, match="another compaction"):
        s.retained.compact(s.new_ids, s.new_rows, last_id=s.new_last_id, policy={},
                           pause=overtaken)  # fmt: skip
    assert s.retained.read_base() == Base(2, s.entry_ids[6], 30, {"other": 1})
    assert same(retained_state(s.retained), (theirs, s.X[theirs], s.X[7 * ROWS_PER_LOG_ENTRY :]))
    assert base_keys(redis_client, s.keys) == {s.keys.base(2)}


@pytest.mark.parametrize("intrusion", ["recreated", "appended"])
def test_a_base_another_writer_touched_is_not_committed(
    redis_client: redis.Redis, model_name: str, intrusion: str
) -> None:
    s = make_scenario(redis_client, model_name)
    before = {k: redis_client.dump(k) for k in (s.keys.meta, s.keys.log, s.keys.base(1))}
    foreign = {"n": 1, "d": D, "x": s.X[0].tobytes(), "ids": np.int64(0).tobytes()}
    key = s.keys.base(2)

    def intrude(stage: str) -> None:
        if intrusion == "recreated" and stage == "chunks 3/17":
            # A stale writer restarted the base with as many entries as were written: the
            # entry count at the commit matches, the ids do not.
            redis_client.unlink(key)
            for i in range(1, 4):
                redis_client.xadd(key, foreign, id=f"1-{i}")
        if intrusion == "appended" and stage == "written":
            redis_client.xadd(key, foreign)

    with pytest.raises(BaseChangedError, match="another writer"):
        s.retained.compact(s.new_ids, s.new_rows, last_id=s.new_last_id, policy={},
                           pause=intrude)  # fmt: skip
    assert {k: redis_client.dump(k) for k in before} == before
    assert same(retained_state(s.retained), s.old)
    check_next_compaction(redis_client, s)


def test_the_commit_runs_at_maxmemory(redis_client: redis.Redis, model_name: str) -> None:
    s = make_scenario(redis_client, model_name)

    def full(stage: str) -> None:
        if stage == "written":
            redis_client.config_set("maxmemory", 1)  # every XADD or HSET alone is refused

    try:
        s.retained.compact(s.new_ids, s.new_rows, last_id=s.new_last_id, policy=s.new_policy,
                           pause=full)  # fmt: skip
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            redis_client.xadd(s.keys.log, {"n": 0})
    finally:
        redis_client.config_set("maxmemory", 0)
    assert same(retained_state(s.retained), s.new)


def test_a_failed_write_deletes_its_partial_base(
    redis_client: redis.Redis, model_name: str
) -> None:
    s = make_scenario(redis_client, model_name)

    def fail(stage: str) -> None:
        if stage == "chunks 6/17":
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        s.retained.compact(s.new_ids, s.new_rows, last_id=s.new_last_id, policy={}, pause=fail)
    assert base_keys(redis_client, s.keys) == {s.keys.base(1)}
    assert same(retained_state(s.retained), s.old)


def test_discard_partial_deletes_only_the_next_generation(
    redis_client: redis.Redis, model_name: str
) -> None:
    s = make_scenario(redis_client, model_name)
    redis_client.xadd(s.keys.base(2), {"n": 0, "d": D, "x": b"", "ids": b""})
    s.retained.discard_partial()
    assert base_keys(redis_client, s.keys) == {s.keys.base(1)}
    s.retained.discard_partial()  # nothing left: a no-op
    assert same(retained_state(s.retained), s.old)


# -- trimming, ids, memory ---------------------------------------------------------------
def test_next_id_is_the_first_id_after() -> None:
    assert next_id("5-3") == "5-4"
    assert next_id("5-18446744073709551615") == "6-0"
    assert next_id("0-0") == "0-1"


def test_trim_log_removes_exactly_the_entries_below_min_id(
    redis_client: redis.Redis, model_name: str
) -> None:
    keys = ModelKeys(model_name)
    retained = RetainedLog(redis_client, keys)
    X = np.zeros((5 * ROWS_PER_LOG_ENTRY, D), np.float32)
    ids = [f"{7}-{i}" for i in range(1, 6)]
    for i, entry_id in enumerate(ids):
        part = X[i * ROWS_PER_LOG_ENTRY : (i + 1) * ROWS_PER_LOG_ENTRY]
        redis_client.xadd(keys.log, {"n": 40, "d": D, "x": part.tobytes()}, id=entry_id)
    assert retained.trim_log(next_id(ids[1])) == 2
    assert [e[0].decode() for e in redis_client.xrange(keys.log)] == ids[2:]
    assert retained.trim_log(next_id(ids[1])) == 0
    assert retained.trim_log(ids[3]) == 1  # MINID keeps the entry with that id
    assert retained.trim_log(next_id(ids[4])) == 2
    assert redis_client.xlen(keys.log) == 0


def test_log_bytes_counts_the_log_and_the_current_base(
    redis_client: redis.Redis, model_name: str
) -> None:
    retained = RetainedLog(redis_client, ModelKeys("nothing-here"))
    assert retained.log_bytes() == 0
    s = make_scenario(redis_client, model_name)
    log_only = redis_client.memory_usage(s.keys.log)
    both = s.retained.log_bytes()
    assert both >= log_only + 60 * (4 * D + 8)
    s.retained.compact(s.new_ids, s.new_rows, last_id=s.entry_ids[-1], policy={})
    assert redis_client.xlen(s.keys.log) == 0
    assert s.retained.log_bytes() >= 100 * (4 * D + 8)
