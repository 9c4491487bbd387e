"""Fixtures of the fault tests: real redis-servers and service processes, always cleaned up."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_helpers import ServiceProcess

from nmbatch.service.embedded_redis import EmbeddedRedis


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[Callable[..., EmbeddedRedis]]:
    """Start a redis-server (appendonly yes) in a tmp folder; all are stopped at the end.

    ``start_redis(name="redis", port=0, appendfsync="everysec")``: the same name and port
    restart a server on the same data folder.
    """
    servers: list[EmbeddedRedis] = []

    def start(name: str = "redis", port: int = 0, appendfsync: str = "everysec") -> EmbeddedRedis:
        server = EmbeddedRedis(tmp_path / name, port=port, appendfsync=appendfsync)
        server.start()
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            if server.process is not None and server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)  # in case a test froze it
            server.stop()


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start ``python -m nmbatch`` processes; every one is stopped (or killed) at the end."""
    procs: list[ServiceProcess] = []

    def start(name: str, **settings: Any) -> ServiceProcess:
        proc = ServiceProcess(tmp_path, name, **settings).start()
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            proc.close()
