"""The engine's share of the CPU (issue 34, item 12): a niceness below the HTTP side, not
Linux's ``SCHED_IDLE`` (which gets no CPU at all on a machine saturated by other
programs, and the model stops), unless ``NMBATCH_ENGINE_SCHED_IDLE`` asks for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from nmbatch.service.main import create_app
from tests.testkit import SettingsFactory, TestClient, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def engine_children() -> list[int]:
    """Pids of this process's children named ``nmbatch-engine``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if comm == "nmbatch-engine" and int(ppid) == os.getpid() and state != "Z":
            found.append(int(entry.name))
    return found


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.parametrize(
    ("overrides", "policy", "nice"),
    [
        ({}, os.SCHED_OTHER, 10),
        ({"engine_nice": 5}, os.SCHED_OTHER, 5),
        ({"engine_sched_idle": True}, os.SCHED_IDLE, 10),
    ],
    ids=["default", "nice-5", "sched-idle"],
)
def test_the_engine_process_runs_with_the_configured_share(
    make_settings: SettingsFactory, overrides: dict, policy: int, nice: int
) -> None:
    settings = make_settings(dim=2, worker_process=True, **overrides)
    earlier = set(engine_children())  # an engine of an earlier test may still be exiting
    with TestClient(create_app(settings)) as client:
        client.post("/samples", json={"vectors": [[1.0, 2.0]] * 40})
        (pid,) = wait_until(
            lambda: [p for p in engine_children() if p not in earlier], 60, "the engine process"
        )
        assert os.sched_getscheduler(pid) == policy
        assert niceness(pid) == os.getpriority(os.PRIO_PROCESS, 0) + nice
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the HTTP side unchanged
