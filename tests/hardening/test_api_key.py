"""The optional API key: writes (and reads when asked) need ``Authorization: Bearer``,
health stays open, refusals are 401 problems with ``WWW-Authenticate``, and the key is
never logged, echoed or shown in the settings."""

from __future__ import annotations

import logging

import pytest
import redis
from hardening_helpers import live_server, raw_exchange
from pydantic import ValidationError

from nmbatch.service.config import Settings
from nmbatch.service.main import create_app
from nmbatch.service.security import key_matches
from tests.testkit import SettingsFactory, TestClient, assert_problem, log_state

KEY = "s3cret-Key-0123456789-abcdef"
GOOD = {"Authorization": f"Bearer {KEY}"}
VECTORS = {"vectors": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]}

READS = [
    ("GET", "/centroids", {}),
    ("GET", "/assign?vector=1,2", {}),
    ("POST", "/assign", {"json": {"vectors": [[1.0, 2.0]]}}),
    ("GET", "/stats", {}),
    ("GET", "/metrics", {}),
]

BAD_CREDENTIALS = {
    "none": {},
    "wrong key": {"Authorization": "Bearer not-the-key-0123456789"},
    "key prefix": {"Authorization": f"Bearer {KEY[:-1]}"},
    "key plus a char": {"Authorization": f"Bearer {KEY}x"},
    "basic scheme": {"Authorization": f"Basic {KEY}"},
    "no token": {"Authorization": "Bearer"},
    "raw key": {"Authorization": KEY},
    "latin-1 bytes": {"Authorization": b"Bearer \xff\xfe"},
}


@pytest.mark.parametrize("headers", BAD_CREDENTIALS.values(), ids=BAD_CREDENTIALS.keys())
def test_writes_without_the_key_are_401_and_store_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str, headers: dict
) -> None:
    with TestClient(create_app(make_settings(api_key=KEY))) as client:
        response = client.post("/samples", json=VECTORS, headers=headers)
        assert_problem(response, 401, "unauthorized")
        challenge = response.headers["www-authenticate"]
        assert challenge.startswith("Bearer")
        assert ('error="invalid_token"' in challenge) == ("Bearer " in str(headers))
        assert KEY not in response.text
        assert log_state(redis_client, model_name) == (0, 0, None)
        assert client.post("/samples", json=VECTORS, headers=GOOD).status_code == 202
        # Reads stay open unless NMBATCH_API_KEY_READS is set.
        for method, path, kwargs in READS:
            assert client.request(method, path, **kwargs).status_code != 401, path


def test_the_key_is_checked_before_the_body_is_read(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(api_key=KEY, max_body_bytes=1024)
    with TestClient(create_app(settings)) as client:
        big = {"vectors": [[1.0, 2.0]] * 1000}  # over the limit: 413 only with the key
        assert_problem(client.post("/samples", json=big), 401, "unauthorized")
        assert_problem(client.post("/samples", json=big, headers=GOOD), 413, "body-too-large")
    assert log_state(redis_client, model_name) == (0, 0, None)


def test_reads_need_the_key_when_configured_and_health_stays_open(
    make_settings: SettingsFactory,
) -> None:
    with TestClient(create_app(make_settings(api_key=KEY, api_key_reads=True))) as client:
        assert client.post("/samples", json=VECTORS, headers=GOOD).status_code == 202
        for method, path, kwargs in READS:
            response = client.request(method, path, **kwargs)
            assert_problem(response, 401, "unauthorized")
            assert response.headers["www-authenticate"].startswith("Bearer")
            wrong = client.request(method, path, headers=BAD_CREDENTIALS["wrong key"], **kwargs)
            assert wrong.status_code == 401
            allowed = client.request(method, path, headers=GOOD, **kwargs)
            assert allowed.status_code != 401, (path, allowed.text)
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        assert client.get("/openapi.json").status_code == 200


def test_a_non_ascii_key_matches_its_utf8_bytes_on_the_wire(
    make_settings: SettingsFactory,
) -> None:
    key = "clé-secrète-0123456789"
    body = b'{"vectors": [[1, 2]]}'

    def post(token: bytes) -> int:
        request = (
            b"POST /samples HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + token + b"\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
        )
        return raw_exchange(server, request)[0]

    with live_server(make_settings(api_key=key)) as server:
        assert post(key.encode("utf-8")) == 202
        assert post(key.encode("latin-1")) == 401
        assert post(b"\xff\xfe\x80") == 401


def test_key_matches_only_the_exact_key() -> None:
    assert key_matches(KEY, KEY)
    for other in ("", KEY[:-1], KEY + " ", KEY.upper(), "x" * len(KEY)):
        assert not key_matches(other, KEY)


def test_the_key_is_never_logged_nor_shown(
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    settings = make_settings(api_key=KEY, api_key_reads=True)
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert KEY not in text and "**********" in text
    with TestClient(create_app(settings)) as client:
        answers = [
            client.post("/samples", json=VECTORS, headers=GOOD),
            client.post("/samples", json=VECTORS, headers={"Authorization": f"Bearer {KEY}!"}),
            client.post("/samples", json=VECTORS),
            client.get("/stats", headers={"Authorization": f"Basic {KEY}"}),
            client.get("/metrics", headers=GOOD),
            client.get("/openapi.json"),
        ]
    assert [a.status_code for a in answers] == [202, 401, 401, 401, 200, 200]
    assert all(KEY not in a.text for a in answers)
    assert caplog.records, "nothing was logged: the check below would prove nothing"
    assert KEY not in caplog.text
    assert all(KEY not in repr(r.args) for r in caplog.records)
    # A refused key is not echoed by the settings error either (it reaches stderr).
    with pytest.raises(ValidationError) as info:
        Settings(api_key="short-secret-x")
    assert "short-secret-x" not in str(info.value) and "api_key" in str(info.value)


def test_the_redis_password_is_not_in_the_settings_repr() -> None:
    settings = Settings(redis_url="redis://:hunter2-password@127.0.0.1:6379/0")
    assert "hunter2-password" not in repr(settings)
    assert settings.redis_url is not None and "hunter2-password" in settings.redis_url
