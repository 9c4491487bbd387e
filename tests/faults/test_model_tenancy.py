"""Services sharing one Redis: who may create and delete what, and a delete racing a POST.

Issue 34, items 7 and 8. Real parts: one redis-server, two ``python -m nmbatch``
processes with different ``NMBATCH_MODEL`` (two services), raw HTTP on a socket for the
request held half-sent.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import httpx
import pytest
import redis
from fault_helpers import ServiceProcess

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage import ModelKeys
from tests.hardening.hardening_helpers import read_response
from tests.testkit import assert_problem, wait_until

pytestmark = pytest.mark.fault

SPEC = {"k": 2, "dim": 2, "rho": 100, "batch_size": 16, "seed": 1}
KEY = "tenancy-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


def model_keys(client: redis.Redis, name: str) -> list[bytes]:
    return sorted(client.scan_iter(match=ModelKeys(name).prefix + "*"))


def service(start_service: Callable[..., ServiceProcess], url: str, name: str) -> ServiceProcess:
    proc = start_service(
        name, redis_url=url, model=name, k=2, batch_size=16, api_key=KEY, worker_threads=1
    )
    proc.ready(60)
    return proc


def test_a_service_deletes_and_recreates_only_the_models_it_created(
    start_redis: Callable[..., EmbeddedRedis], start_service: Callable[..., ServiceProcess]
) -> None:
    server = start_redis()
    client = redis.Redis.from_url(server.url)
    a = service(start_service, server.url, "svc-a")
    b = service(start_service, server.url, "svc-b")
    with httpx.Client(base_url=a.base, headers=AUTH, timeout=20) as http_a, httpx.Client(
        base_url=b.base, headers=AUTH, timeout=20
    ) as http_b:
        # A's default model holds data; A creates a named model and fills it.
        assert http_a.post("/samples", json={"vectors": [[0.0, 1.0]] * 5}).status_code == 202
        assert http_a.put("/models/shared", json=SPEC).status_code == 201
        posted = http_a.post("/models/shared/samples", json={"vectors": [[1.0, 2.0]] * 7})
        assert posted.status_code == 202
        a_default, shared = model_keys(client, "svc-a"), model_keys(client, "shared")
        assert a_default and shared

        # B can neither delete nor re-create A's model, and learns nothing of its settings.
        for spec in (SPEC, SPEC | {"k": 3, "dim": 5}):
            refused = http_b.put("/models/shared", json=spec)
            problem = assert_problem(refused, 403, "model-not-owned")
            assert "k=" not in problem["detail"] and "current" not in problem
        assert_problem(http_b.delete("/models/shared?confirm=shared"), 403, "model-not-owned")
        # Nor A's default model: not adopted with its own k and dim, nor deleted.
        a_spec = {"k": 2, "dim": 2, "batch_size": 16}
        assert_problem(http_b.put("/models/svc-a", json=a_spec), 403, "model-not-owned")
        assert_problem(http_b.delete("/models/svc-a?confirm=svc-a"), 403, "model-not-owned")
        time.sleep(2.5)  # a sync of each process
        # Nothing of A's default model is gone (its worker may have added a snapshot).
        assert set(a_default) <= set(model_keys(client, "svc-a"))
        assert {b"nmbatch:shared:log", b"nmbatch:shared:meta"} <= set(model_keys(client, "shared"))
        assert http_a.get("/models/shared/stats").json()["n_logged"] == 7
        assert http_a.get("/stats").json()["n_logged"] == 5

        # B reads and writes A's model (both serve every registered model), but only A
        # deletes it.
        assert http_b.get("/models/shared").status_code == 200
        assert http_a.delete("/models/shared?confirm=shared").status_code == 200
        wait_until(lambda: model_keys(client, "shared") == [], 20, "the purge of 'shared'")
        # Gone, the name is free: B may create it (and then A may not delete it).
        assert http_b.put("/models/shared", json=SPEC).status_code == 201
        assert_problem(http_a.delete("/models/shared?confirm=shared"), 403, "model-not-owned")
        assert http_b.get("/models/shared/stats").json()["n_logged"] == 0


def test_a_post_in_flight_when_its_model_is_deleted_stores_nothing(
    start_redis: Callable[..., EmbeddedRedis], start_service: Callable[..., ServiceProcess]
) -> None:
    server = start_redis()
    client = redis.Redis.from_url(server.url)
    a = service(start_service, server.url, "svc-a")
    body = json.dumps({"vectors": [[1.0, 2.0]] * 50}).encode()
    with httpx.Client(base_url=a.base, headers=AUTH, timeout=20) as http:
        for keyed in (False, True):  # the plain append, and the Idempotency-Key one
            assert http.put("/models/tenant", json=SPEC).status_code == 201
            assert http.post("/models/tenant/samples", json={"vectors": [[0.0, 0.0]]}).is_success
            head = (
                f"POST /models/tenant/samples HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n"
                + ("Idempotency-Key: held-1\r\n" if keyed else "")
                + "\r\n"
            ).encode()
            with socket.create_connection(("127.0.0.1", a.port), timeout=30) as sock:
                # Headers and half the body: the route has picked the model and waits.
                sock.sendall(head + body[: len(body) // 2])
                time.sleep(0.5)
                deleted = http.delete("/models/tenant?confirm=tenant")
                assert deleted.status_code == 200, deleted.text
                assert model_keys(client, "tenant") == []
                sock.sendall(body[len(body) // 2 :])
                status, _, answer = read_response(sock)
            assert status == 409 and b"model-deleted" in answer, answer[:600]
            time.sleep(0.5)
            assert model_keys(client, "tenant") == []  # nothing came back
            # The same name created again is empty: nothing of the deleted model returns.
            assert http.put("/models/tenant", json=SPEC).status_code == 201
            assert http.get("/models/tenant/stats").json()["n_logged"] == 0
            assert client.xlen(ModelKeys("tenant").log) == 0
            assert http.delete("/models/tenant?confirm=tenant").status_code == 200
