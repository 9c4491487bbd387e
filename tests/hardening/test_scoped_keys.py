"""Scoped API keys (issue 34, item 10): each key allows ``read``, ``write`` or ``admin``,
optionally on model-name patterns; 401 without a known key, 403 without the scope, both
in the OpenAPI document; keys from a file; no open service on a non-loopback address."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from nmbatch.service.config import Settings
from nmbatch.service.keys import KeyRing, KeyRingError, load_keys, parse_entries
from nmbatch.service.main import create_app
from tests.testkit import SettingsFactory, TestClient, assert_problem, log_state

READ = "read-key-0123456789abcdef"
WRITE = "write-key-0123456789abcdef"
ADMIN = "admin-key-0123456789abcdef"
TENANT = "tenant-key-0123456789abcdef"
KEYS = f"{READ} read; {WRITE} write\n{ADMIN} admin; {TENANT} admin tenant-* other-?"
SPEC: dict[str, Any] = {"k": 3, "dim": 2, "rho": 100, "batch_size": 32, "seed": 1}
VECTORS = {"vectors": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_each_scope_allows_its_routes_and_no_more(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    settings = make_settings(api_keys=KEYS, api_key_reads=True, dim=2)
    with TestClient(create_app(settings)) as client:
        # read: reads only
        assert client.get("/centroids", headers=bearer(READ)).status_code not in (401, 403)
        assert client.get("/stats", headers=bearer(READ)).status_code == 200
        assert client.get("/models", headers=bearer(READ)).status_code == 200
        refused = assert_problem(
            client.post("/samples", json=VECTORS, headers=bearer(READ)), 403, "forbidden"
        )
        assert refused["scope"] == "write"
        assert (
            'error="insufficient_scope"'
            in client.post("/samples", json=VECTORS, headers=bearer(READ)).headers[
                "www-authenticate"
            ]
        )
        assert log_state(redis_client, model_name)[:2] == (0, 0)  # nothing stored
        # write: samples, not models
        assert client.post("/samples", json=VECTORS, headers=bearer(WRITE)).status_code == 202
        assert client.post("/assign", json=VECTORS, headers=bearer(WRITE)).status_code != 403
        assert_problem(client.put("/models/m1", json=SPEC, headers=bearer(WRITE)), 403)
        # admin: models too
        assert client.put("/models/m1", json=SPEC, headers=bearer(ADMIN)).status_code == 201
        assert_problem(
            client.delete("/models/m1?confirm=m1", headers=bearer(WRITE)), 403, "forbidden"
        )
        assert client.delete("/models/m1?confirm=m1", headers=bearer(ADMIN)).status_code == 200
        # no key, unknown key: 401 everywhere, before the scope
        for headers in ({}, bearer("unknown-key-0123456789abc")):
            assert_problem(client.get("/stats", headers=headers), 401, "unauthorized")
            assert_problem(client.put("/models/m2", json=SPEC, headers=headers), 401)
        # health stays open
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200


def test_a_key_with_patterns_reaches_only_its_models(
    make_settings: SettingsFactory, model_name: str
) -> None:
    settings = make_settings(api_keys=KEYS, api_key_reads=True)
    with TestClient(create_app(settings)) as client:
        assert client.put("/models/tenant-a", json=SPEC, headers=bearer(TENANT)).status_code == 201
        assert client.put("/models/other-b", json=SPEC, headers=bearer(TENANT)).status_code == 201
        assert_problem(client.put("/models/else", json=SPEC, headers=bearer(TENANT)), 403)
        assert_problem(client.put("/models/other-bb", json=SPEC, headers=bearer(TENANT)), 403)
        posted = client.post("/models/tenant-a/samples", json=VECTORS, headers=bearer(TENANT))
        assert posted.status_code == 202
        assert client.get("/models/tenant-a/stats", headers=bearer(TENANT)).status_code == 200
        # the default model (routes without the prefix) is not tenant-*
        assert_problem(client.post("/samples", json=VECTORS, headers=bearer(TENANT)), 403)
        assert_problem(client.get("/stats", headers=bearer(TENANT)), 403)
        assert_problem(client.get(f"/models/{model_name}/stats", headers=bearer(TENANT)), 403)
        # routes over every model need a key without patterns
        assert_problem(client.get("/models", headers=bearer(TENANT)), 403)
        assert_problem(client.get("/metrics", headers=bearer(TENANT)), 403)
        assert client.get("/metrics", headers=bearer(READ)).status_code == 200
        for name in ("tenant-a", "other-b"):
            deleted = client.delete(f"/models/{name}?confirm={name}", headers=bearer(TENANT))
            assert deleted.status_code == 200


def test_keys_from_a_file(make_settings: SettingsFactory, tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# the operator's keys\n{ADMIN}\n{READ} read  # dashboards\n")
    path.chmod(0o600)
    settings = make_settings(api_key_file=path)
    with TestClient(create_app(settings)) as client:
        assert_problem(client.post("/samples", json=VECTORS, headers=bearer(READ)), 403)
        assert client.post("/samples", json=VECTORS, headers=bearer(ADMIN)).status_code == 202
        assert client.get("/stats").status_code == 200  # reads open by default


@pytest.mark.parametrize(
    "entries",
    [
        "short read",
        f"{READ} reader",
        f"{READ} read; {READ} write",
        f"{READ}",
        "k\u00e9y-0123456789abcdef read",
    ],
)
def test_an_unusable_entry_is_refused_without_quoting_the_key(
    make_settings: SettingsFactory, entries: str
) -> None:
    with pytest.raises(KeyRingError) as info:
        load_keys(make_settings(api_keys=entries))
    assert READ not in str(info.value) and "short" not in str(info.value)


def test_find_compares_with_every_key() -> None:
    ring = KeyRing(parse_entries(KEYS, "test"))
    assert ring.find(READ) is not None and ring.find(READ).scope == "read"  # type: ignore[union-attr]
    assert ring.find(TENANT).patterns == ("tenant-*", "other-?")  # type: ignore[union-attr]
    assert ring.find(READ + "x") is None and ring.find("") is None


def test_the_schema_documents_401_and_403_on_every_keyed_operation(
    make_settings: SettingsFactory,
) -> None:
    with TestClient(create_app(make_settings(api_keys=KEYS))) as client:
        document = client.get("/openapi.json").json()
    keyed = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if any("apiKey" in r for r in operation.get("security", [])):
                keyed += 1
                for status in ("401", "403"):
                    answer = operation["responses"].get(status)
                    assert answer is not None, (method, path, status)
                    assert "application/problem+json" in answer["content"]
    assert keyed >= 15


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "example.org"])
def test_no_key_on_a_non_loopback_address_is_refused(host: str) -> None:
    with pytest.raises(ValidationError, match="NMBATCH_ALLOW_ANONYMOUS"):
        Settings(host=host)
    Settings(host=host, allow_anonymous=True)
    Settings(host=host, api_key=ADMIN)
    Settings(host=host, api_keys=f"{READ} read")
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        Settings(host=loopback)


def test_the_server_process_refuses_to_start_open_on_the_network(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
    env.update(NMBATCH_HOST="0.0.0.0", NMBATCH_PORT="0", NMBATCH_DATA_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "nmbatch"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "NMBATCH_ALLOW_ANONYMOUS" in done.stderr
    assert not (tmp_path / "redis.pid").exists()  # refused before anything started
