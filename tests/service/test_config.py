"""Settings from NMBATCH_* variables, and start-up refusing settings that contradict Redis."""

from __future__ import annotations

import math
import os
from pathlib import Path
from unittest.mock import ANY

import pytest
from pydantic import ValidationError

from nmbatch.service.cgroups import cpu_quota
from nmbatch.service.config import Settings, default_worker_threads
from nmbatch.service.main import StartupError, create_app
from tests.testkit import SettingsFactory, TestClient


def test_settings_come_from_nmbatch_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("NMBATCH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NMBATCH_K", "7")
    monkeypatch.setenv("NMBATCH_RHO", "50.5")
    monkeypatch.setenv("NMBATCH_MODEL", "images")
    monkeypatch.setenv("NMBATCH_APPENDFSYNC", "always")
    monkeypatch.setenv("NMBATCH_REDIS_URL", "")  # empty counts as unset: embedded Redis
    settings = Settings()
    assert (settings.k, settings.rho, settings.model) == (7, 50.5, "images")
    assert settings.appendfsync == "always"
    assert settings.redis_url is None and settings.dim is None
    assert settings.key_prefix == "nmbatch:images:"


def test_worker_threads_default_to_all_cores_but_one() -> None:
    cores = len(os.sched_getaffinity(0))
    quota = cpu_quota()
    if quota is not None:
        cores = min(cores, math.ceil(quota[0]))
    assert default_worker_threads() == max(1, cores - 1)
    assert Settings().worker_threads == default_worker_threads()


def _cgroup_root(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    """A fake ``/`` whose /proc/self/cgroup is ``cgroup`` and with ``files`` under
    /sys/fs/cgroup."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_cpu_quota_of_cgroup_v2_takes_the_smallest_of_the_group_and_its_ancestors(
    tmp_path: Path,
) -> None:
    root = _cgroup_root(tmp_path, "0::/kubepods/pod1/app\n", {
        "kubepods/pod1/app/cpu.max": "max 100000\n",
        "kubepods/pod1/cpu.max": "250000 100000\n",  # the pod's limits.cpu: 2.5
        "kubepods/cpu.max": "max 100000\n",
    })  # fmt: skip
    assert cpu_quota(root) == (2.5, "cgroup /kubepods/pod1 cpu.max")
    cores = len(os.sched_getaffinity(0))
    assert default_worker_threads(root) == max(1, min(cores, 3) - 1)
    (root / "sys/fs/cgroup/kubepods/pod1/app/cpu.max").write_text("50000 100000\n")
    assert cpu_quota(root) == (0.5, "cgroup /kubepods/pod1/app cpu.max")
    assert default_worker_threads(root) == 1


def test_cpu_quota_of_cgroup_v1_in_a_container_reads_the_top_group(tmp_path: Path) -> None:
    # Docker on cgroup v1: /proc/self/cgroup gives the host's path, the container sees
    # its own group at the top of the hierarchy (mounted as cpu,cpuacct).
    root = _cgroup_root(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })  # fmt: skip
    assert cpu_quota(root) == (1.5, "cgroup / cpu.cfs_quota_us")
    assert default_worker_threads(root) == max(1, min(len(os.sched_getaffinity(0)), 2) - 1)
    (root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert cpu_quota(root) is None
    assert default_worker_threads(root) == max(1, len(os.sched_getaffinity(0)) - 1)


def test_no_cgroup_files_no_quota(tmp_path: Path) -> None:
    assert cpu_quota(tmp_path) is None
    root = _cgroup_root(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cpu_quota(root) is None
    (root / "sys/fs/cgroup/cpu.max").write_text("100000 0\n")  # a malformed period
    assert cpu_quota(root) is None


@pytest.mark.parametrize(
    ("name", "value"),
    [("NMBATCH_K", "0"), ("NMBATCH_MODEL", "a b"), ("NMBATCH_APPENDFSYNC", "no"),
     ("NMBATCH_WORKER_THREADS", "0"), ("NMBATCH_DIM", "-1"), ("NMBATCH_SEED", "-1"),
     ("NMBATCH_SEED", str(2**63))],
)  # fmt: skip
def test_invalid_setting_is_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("NMBATCH_").lower()):
        Settings()


def test_another_k_than_redis_holds_stops_start_up(make_settings: SettingsFactory) -> None:
    with TestClient(create_app(make_settings(k=3))) as client:
        client.post("/samples", json={"vectors": [[1.0, 2.0]]})
    with pytest.raises(StartupError, match=r"NMBATCH_K=4 but .* created with k=3"):  # noqa: SIM117
        with TestClient(create_app(make_settings(k=4))):
            pass


def test_another_dimension_than_redis_holds_stops_start_up(make_settings: SettingsFactory) -> None:
    with TestClient(create_app(make_settings())) as client:
        client.post("/samples", json={"vectors": [[1.0, 2.0]]})
    with pytest.raises(StartupError, match=r"NMBATCH_DIM=5 but .* dimension 2"):  # noqa: SIM117
        with TestClient(create_app(make_settings(dim=5))):
            pass
    with TestClient(create_app(make_settings(dim=2))) as client:
        assert client.post("/samples", json={"vectors": [[3.0, 4.0]]}).status_code == 202


def test_a_configured_dimension_is_enforced_from_the_first_request(
    make_settings: SettingsFactory,
) -> None:
    with TestClient(create_app(make_settings(dim=3))) as client:
        response = client.post("/samples", json={"vectors": [[1.0, 2.0]]})
        assert response.status_code == 422 and response.json()["expected_dim"] == 3
        octet = client.post(
            "/samples",
            content=b"\0" * 24,
            headers={"content-type": "application/octet-stream"},
        )
        assert octet.json() == {"accepted": 2, "n_samples": 2, "ids": ANY}


def test_models_with_different_prefixes_share_one_redis(make_settings: SettingsFactory) -> None:
    a = create_app(make_settings(model="model-a", k=2))
    b = create_app(make_settings(model="model-b", k=5))
    with TestClient(a) as client_a, TestClient(b) as client_b:
        client_a.post("/samples", json={"vectors": [[1.0, 2.0]] * 3})
        client_b.post("/samples", json={"vectors": [[1.0, 2.0, 3.0]]})
        assert client_a.get("/stats").json()["n_logged"] == 3
        assert client_b.get("/stats").json()["n_logged"] == 1
