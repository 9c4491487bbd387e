"""Secrets never leave the process (issue 34, item 11): every credential form of a Redis
URL is masked where a URL is logged, and no answer to an HTTP client carries a host, a
port, a URL or Redis's own message."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from nmbatch.service.bootstrap import _unusable, safe_url
from nmbatch.service.config import Settings
from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.main import create_app
from tests.testkit import TestClient

SECRET = "Zq8-secret-Pw"

URLS = {
    "user and password": f"redis://alice:{SECRET}@db.example:6379/0",
    "password only": f"redis://:{SECRET}@db.example:6379/0",
    "name only": f"redis://{SECRET}@db.example:6379/0",
    "tls": f"rediss://:{SECRET}@db.example:6380/0?ssl_cert_reqs=required",
    "password parameter": f"redis://db.example:6379/0?password={SECRET}",
    "username parameter": f"redis://db.example:6379/0?username={SECRET}&password={SECRET}",
    "keyfile password": f"rediss://db.example/0?ssl_password={SECRET}",
    "unix socket": f"unix://alice:{SECRET}@/run/redis.sock?db=0",
    "unix socket parameter": f"unix:///run/redis.sock?db=0&password={SECRET}",
    "percent-encoded": f"redis://:{SECRET.replace('-', '%2D')}@db.example:6379/0",
    "sentinel": f"redis+sentinel://:{SECRET}@s1:26379,s2:26379/mymaster/0",
    "bad port": f"redis://:{SECRET}@db.example:notaport/0",
}


@pytest.mark.parametrize("url", URLS.values(), ids=URLS.keys())
def test_safe_url_masks_every_credential_form(url: str) -> None:
    shown = safe_url(url)
    assert SECRET not in shown and SECRET.replace("-", "%2D") not in shown
    assert "***" in shown


def test_safe_url_keeps_what_is_no_secret() -> None:
    url = "rediss://db.example:6380/2?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.crt"
    assert safe_url(url) == url
    assert safe_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_a_start_up_failure_tells_the_client_no_internals() -> None:
    url = f"redis://nmbatch:{SECRET}@10.1.2.3:6390/0"
    exc = redis.ConnectionError(f"Error 111 connecting to 10.1.2.3:6390 (AUTH {SECRET}).")
    error = _unusable(url, exc)
    assert SECRET not in str(error) and "10.1.2.3" in str(error)  # the operator's message
    for hidden in (SECRET, "10.1.2.3", "6390", "redis://"):
        assert hidden not in error.public


def test_readyz_tells_no_host_port_or_message_when_redis_is_gone(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    port = str(server.port)
    try:
        settings = Settings(redis_url=url, k=3, poll_seconds=0.05, worker_threads=1)
        with TestClient(create_app(settings)) as client:
            server.stop()
            response = client.get("/readyz")
            assert response.status_code == 503
            body = response.text
            assert response.json()["redis"].startswith("unavailable")
            for hidden in ("127.0.0.1", port, "connecting", "Error "):
                assert hidden not in body, (hidden, body)
    finally:
        server.stop()
