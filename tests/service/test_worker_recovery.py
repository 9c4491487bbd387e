"""An unexpected error of the worker (a fault injected into its engine's step): the
service says so on ``/readyz``, waits, rebuilds the engine from the log and goes on,
with nothing acknowledged lost. Real ``redis-server``, the real app, the engine in the
worker thread (``worker_process=False``); and an engine process killed: the worker
rebuilds it the same way."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from service_helpers import post_npy, wait_converged

from nmbatch.engine.hosting import LocalEngine
from nmbatch.service.main import create_app
from nmbatch.service.worker import recovery
from tests.testkit import SettingsFactory, TestClient, blobs, metric, wait_until

POLL_SLACK = 0.1  # seconds: wait_until's poll interval, with room to spare


def test_an_unexpected_worker_error_is_shown_then_recovered_from_with_nothing_lost(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = {"n": 0, "failed": 0}
    step = LocalEngine.step

    def step_failing_twice(self: LocalEngine):  # the 3rd and 4th steps fail
        steps["n"] += 1
        if steps["n"] in (3, 4):
            steps["failed"] += 1
            raise RuntimeError("injected fault")
        return step(self)

    monkeypatch.setattr(LocalEngine, "step", step_failing_twice)
    X, Y = blobs(600, 4, 3, seed=1), blobs(300, 4, 3, seed=2)
    with TestClient(create_app(make_settings(worker_process=False))) as client:
        worker = client.app.state.models.default.worker
        assert post_npy(client, X).status_code == 202
        started = time.monotonic()
        ready = wait_until(
            lambda: (r := client.get("/readyz")).status_code == 503 and r.json(),
            10,
            "readiness to show the failure",
        )
        # The open /readyz says that the worker failed, not why (the log does).
        assert ready["worker"].startswith("failed") and "injected fault" not in ready["worker"]
        assert post_npy(client, Y).status_code == 202  # the log still takes samples
        # The second failure comes right after the first rebuild: its wait doubles.
        wait_until(lambda: steps["failed"] == 2, 10, "the second failure")
        second = time.monotonic()
        assert second - started >= 1.0
        doc = wait_converged(client, X.shape[0] + Y.shape[0], timeout=30)
        # The 2 s wait starts at the failure, which this test sees up to one poll later.
        assert time.monotonic() - second >= 2.0 - POLL_SLACK
        assert worker.error is None and client.get("/readyz").status_code == 200
        assert sum(doc["counts"]) == X.shape[0] + Y.shape[0]
        metrics = client.get("/metrics").text
        assert re.search(r"^nmbatch_worker_failures_total(\{[^}]*\})? 2\.0$", metrics, re.M)


def test_the_wait_grows_to_a_cap_and_starts_again_after_a_quiet_spell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """:meth:`EngineRecovery._recover`'s waits: 1, 2, 4, ... s, at most the cap; back to
    1 s once the previous failure is older than the memory."""
    waits: list[float] = []
    clock = {"now": 1000.0}
    monkeypatch.setattr(recovery.time, "monotonic", lambda: clock["now"])

    class Stopping:
        def wait(self, seconds: float) -> bool:
            waits.append(seconds)
            return False

    class Counter:
        def inc(self) -> None:
            pass

    class Metrics:
        worker_failures = Counter()

    class Board:
        model = None

    class Fake(recovery.EngineRecovery):
        def _publish_stats(self) -> None:
            pass

    worker = Fake()
    worker.engine, worker.board, worker.metrics = None, Board(), Metrics()
    worker._stopping, worker._failures, worker._failed_at = Stopping(), 0, float("-inf")
    for _ in range(9):
        worker._recover(RuntimeError("x"))
        clock["now"] += 1.0
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert worker.phase == "failed" and isinstance(worker.error, RuntimeError)
    clock["now"] += recovery.FAILURE_MEMORY_SECONDS + 1
    worker._recover(RuntimeError("y"))
    assert waits[-1] == 1


def test_the_worker_rebuilds_a_killed_engine_and_goes_on(make_settings: SettingsFactory) -> None:
    """SIGKILL of the engine process: the service keeps serving, the worker replays the
    log into a new process, restores the served centroids, versions go on increasing."""
    settings = make_settings(worker_process=True)
    with TestClient(create_app(settings)) as client:
        X = blobs(600, 6, 4, seed=5)[:, :3]
        assert client.post("/samples", json={"vectors": X[:300].tolist()}).status_code == 202
        before = wait_converged(client, 300)
        worker = client.app.state.models.default.worker
        old_pid = worker.engine.pid
        os.kill(old_pid, signal.SIGKILL)
        # Served from memory meanwhile.
        assert client.get("/centroids").json()["version"] >= before["version"]
        assert client.post("/samples", json={"vectors": X[300:].tolist()}).status_code == 202
        after = wait_converged(client, 600)
        assert after["version"] > before["version"]
        assert worker.engine.pid != old_pid and worker.alive()
        assert client.get("/readyz").json()["ready"] is True
        assert metric(client.get("/metrics").text, "nmbatch_engine_restarts_total") == 1.0
