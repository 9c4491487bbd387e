"""Named models (``/models``): create, conflict, list, delete, isolation, limits, restart.

Real parts: the session's redis-server, the app with its lifespan (each named model's
worker and engine process), a second app on the same Redis for the shared registry.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import numpy as np
import pytest
import redis

from nmbatch.service.main import create_app
from nmbatch.service.models import REGISTRY_KEY
from nmbatch.service.models.manager import SYNC_SECONDS
from nmbatch.service.storage import ModelKeys
from nmbatch.service.usecases import reads, serving
from tests.service.service_helpers import post_npy
from tests.testkit import (
    SettingsFactory,
    TestClient,
    assert_problem,
    blobs,
    metric,
    wait_until,
)

SPEC_A: dict[str, Any] = {"k": 3, "dim": 2, "rho": 100, "batch_size": 32, "seed": 1}
SPEC_B: dict[str, Any] = {"k": 2, "dim": 3, "rho": 100, "batch_size": 32, "seed": 2}


def converged(client: TestClient, prefix: str, n_samples: int) -> dict[str, Any]:
    """The centroids of the model at ``prefix`` once converged on ``n_samples``."""

    def ready() -> dict[str, Any] | None:
        response = client.get(f"{prefix}/centroids")
        if response.status_code != 200:
            return None
        doc = response.json()
        return doc if doc["converged"] and doc["n_samples"] == n_samples else None

    return wait_until(ready, 60, f"{prefix} converged on {n_samples} samples")


def model_keys(redis_client: redis.Redis, name: str) -> list[bytes]:
    return sorted(redis_client.scan_iter(match=ModelKeys(name).prefix + "*"))


def test_put_creates_then_the_same_settings_are_200_and_others_409(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    with TestClient(create_app(make_settings())) as client:
        created = client.put("/models/tenant-a", json=SPEC_A)
        assert created.status_code == 201, created.text
        doc = created.json()
        assert doc["name"] == "tenant-a" and doc["default"] is False
        assert doc["settings"]["k"] == 3 and doc["settings"]["dim"] == 2
        assert doc["status"]["version"] is None

        again = client.put("/models/tenant-a", json=SPEC_A)
        assert again.status_code == 200 and again.json()["settings"] == doc["settings"]

        other = client.put("/models/tenant-a", json=SPEC_A | {"k": 4})
        problem = assert_problem(other, 409, "model-conflict")
        assert problem["current"]["k"] == 3

        listed = client.get("/models").json()["models"]
        assert [m["name"] for m in listed] == [model_name, "tenant-a"]
        assert listed[0]["default"] is True and listed[0]["settings"]["k"] == 3
        assert client.get("/models/tenant-a").json()["settings"] == doc["settings"]
        assert_problem(client.get("/models/nobody"), 404, "unknown-model")
        assert_problem(client.get("/models/nobody/centroids"), 404, "unknown-model")

        # The default model answers under its name too; other settings for it are a 409.
        default = make_settings()
        same = {"k": default.k, "dim": 2, "rho": default.rho, "batch_size": default.batch_size,
                "seed": default.seed}  # fmt: skip
        assert_problem(client.put(f"/models/{model_name}", json=same), 409, "model-conflict")
    assert redis_client.hexists(REGISTRY_KEY, "tenant-a")


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/models/-lead", SPEC_A, "path.name"),
        ("/models/" + "x" * 65, SPEC_A, "path.name"),
        ("/models/ok", SPEC_A | {"k": 5, "retention": "window", "max_samples": 3}, "max_samples"),
        ("/models/ok", SPEC_A | {"retention": "age"}, "max_age_seconds"),
        ("/models/ok", SPEC_A | {"max_age_seconds": 5}, "max_age_seconds"),
        ("/models/ok", SPEC_A | {"colour": "red"}, "colour"),
        ("/models/ok", {"k": 3}, "dim"),
        ("/models/ok", SPEC_A | {"k": 0}, "k"),
        ("/models/ok", SPEC_A | {"init": "random"}, "init"),
        ("/models/ok", SPEC_A | {"seed": -1}, "seed"),
    ],
)
def test_bad_names_and_settings_are_422_and_store_nothing(
    make_settings: SettingsFactory,
    redis_client: redis.Redis,
    path: str,
    body: dict[str, Any],
    needle: str,
) -> None:
    with TestClient(create_app(make_settings())) as client:
        problem = assert_problem(client.put(path, json=body), 422, "invalid-request")
        assert needle in problem["detail"], problem["detail"]
        assert client.get("/models").json()["models"][1:] == []
    assert not redis_client.exists(REGISTRY_KEY)
    assert model_keys(redis_client, "ok") == []


def test_each_model_has_its_own_samples_centroids_assign_and_stats(
    make_settings: SettingsFactory, model_name: str
) -> None:
    X_default = blobs(300, 2, 3, seed=0)
    X_a = blobs(400, 2, 3, seed=1, separation=100.0)
    X_b = blobs(200, 3, 2, seed=2)
    with TestClient(create_app(make_settings())) as client:
        assert client.put("/models/a", json=SPEC_A).status_code == 201
        assert client.put("/models/b", json=SPEC_B).status_code == 201
        assert post_npy(client, X_default).json()["n_samples"] == 300
        assert post_npy(client, X_a, "/models/a/samples").json()["n_samples"] == 400
        assert post_npy(client, X_b, "/models/b/samples").json()["n_samples"] == 200

        default = converged(client, "", 300)
        a = converged(client, "/models/a", 400)
        b = converged(client, "/models/b", 200)
        assert (default["k"], default["dim"]) == (3, 2)
        assert (a["k"], a["dim"], b["k"], b["dim"]) == (3, 2, 2, 3)
        assert sum(a["counts"]) == 400 and sum(b["counts"]) == 200
        # a's centroids are its own data's: far out, unlike the default model's.
        assert np.abs(np.asarray(a["centroids"])).max() > 3 * np.abs(X_default).max()
        # The default model under its name is the same model.
        named_default = client.get(f"/models/{model_name}/centroids").json()
        assert named_default["version"] == default["version"]

        assigned = client.post("/models/b/assign", json={"vectors": X_b[:5].tolist()}).json()
        assert len(assigned["clusters"]) == 5 and assigned["version"] == b["version"]
        one = client.get("/models/a/assign", params={"vector": "1,2"}).json()
        assert one["version"] == a["version"]
        assert client.get("/models/b/stats").json()["n_samples"] == 200
        assert client.get("/models/a/stats").json()["n_logged"] == 400
        assert client.get("/stats").json()["n_logged"] == 300

        # Vectors of another model's dimension: refused, nothing stored.
        assert_problem(post_npy(client, X_b[:4], "/models/a/samples"), 422, "wrong-dimension")
        assert_problem(
            client.post("/models/a/assign", json={"vectors": X_b[:2].tolist()}),
            422,
            "wrong-dimension",
        )
        assert client.get("/models/a/stats").json()["n_logged"] == 400
        # Each model iterates in an engine process of its own (the OS schedules them).
        state = client.app.state  # type: ignore[attr-defined]
        engines = [state.models.default.worker.engine]
        engines += [state.models.running[name].handle.worker.engine for name in ("a", "b")]
        pids = {engine.pid for engine in engines}
        assert len(pids) == 3 and all(engine.process.is_alive() for engine in engines)
        status = {m["name"]: m["status"] for m in client.get("/models").json()["models"]}
        assert status["a"]["n_samples"] == 400 and status["b"]["converged"] is True
        not_allowed = assert_problem(client.put("/models/a/assign"), 405)
        assert client.put("/models/a/assign").headers["allow"] == "GET, POST"
        assert "PUT" in not_allowed["detail"]
        # Request metrics name the named models' routes apart from the default model's.
        metrics = client.get("/metrics").text
        assert 'method="POST",route="/models/{name}/samples",status="202"} 2.0' in metrics
        assert 'method="POST",route="/samples",status="202"} 1.0' in metrics


def test_a_named_model_has_its_own_dashboard(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    with TestClient(create_app(make_settings())) as client:
        assert client.put("/models/tenant-a", json=SPEC_A).status_code == 201
        X = blobs(90, 2, 3, seed=4)
        assert post_npy(client, X, path="/models/tenant-a/samples").status_code == 202
        centroids = converged(client, "/models/tenant-a", 90)
        page = client.get("/models/tenant-a/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        script = client.get("/models/tenant-a/dashboard/static/dashboard.js")
        assert script.status_code == 200 and script.content == client.get(
            "/dashboard/static/dashboard.js"
        ).content
        doc = client.get("/models/tenant-a/dashboard/data").json()
        assert doc["model"] == "tenant-a" and doc["centroids"] == centroids
        stats = client.get("/models/tenant-a/stats").json()
        assert doc["stats"]["n_samples"] == stats["n_samples"] == 90
        default = client.get("/dashboard/data").json()
        assert default["model"] == model_name and default["centroids"] is None
        assert_problem(client.get("/models/no-such/dashboard/data"), 404, "unknown-model")
        client.delete("/models/tenant-a", params={"confirm": "tenant-a"})


def test_delete_needs_the_confirmation_and_removes_every_key_of_the_model(
    make_settings: SettingsFactory, redis_client: redis.Redis, model_name: str
) -> None:
    with TestClient(create_app(make_settings(snapshot_seconds=0.1))) as client:
        assert client.put("/models/gone", json=SPEC_A).status_code == 201
        assert client.put("/models/kept", json=SPEC_A).status_code == 201
        X = blobs(100, 2, 3, seed=3)
        for name in ("gone", "kept"):
            response = client.post(
                f"/models/{name}/samples",
                json={"vectors": X.tolist()},
                headers={"Idempotency-Key": f"key-{name}"},
            )
            assert response.status_code == 202
            converged(client, f"/models/{name}", 100)
        keys = ModelKeys("gone")
        wait_until(lambda: redis_client.exists(keys.snapshot), 10, "a snapshot of 'gone'")
        held = {k.decode() for k in model_keys(redis_client, "gone")}
        assert {keys.log, keys.meta, keys.snapshot, keys.idempotency("key-gone")} <= held

        problem = assert_problem(client.delete("/models/gone"), 422, "invalid-request")
        assert "confirm" in problem["detail"]
        problem = assert_problem(client.delete("/models/gone?confirm=kept"), 409)
        assert problem["type"].endswith("confirmation-required")
        assert problem["parameter"] == "confirm" and "confirm" in problem["detail"]
        assert model_keys(redis_client, "gone") != []

        deleted = client.delete("/models/gone", params={"confirm": "gone"})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["keys_removed"] >= 4
        assert model_keys(redis_client, "gone") == []
        assert not redis_client.hexists(REGISTRY_KEY, "gone")
        assert_problem(client.get("/models/gone"), 404, "unknown-model")
        assert_problem(client.delete("/models/gone?confirm=gone"), 404, "unknown-model")
        assert_problem(
            client.delete(f"/models/{model_name}", params={"confirm": model_name}),
            409,
            "default-model",
        )
        # The other model is untouched, and the name can be created anew, empty.
        assert client.get("/models/kept/stats").json()["n_logged"] == 100
        assert client.put("/models/gone", json=SPEC_B).status_code == 201
        assert client.get("/models/gone/stats").json()["n_logged"] == 0
    assert model_keys(redis_client, "kept") != []


def test_limits_on_models_and_memory_are_4xx_and_store_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis
) -> None:
    with TestClient(create_app(make_settings(max_models=1, model_max_bytes=1 << 20))) as client:
        # 1 MiB: at d = 2, k = 3 the engine takes 4d + 8 + 4k + 32 = 60 bytes a sample.
        too_big = client.put("/models/big", json=SPEC_A | {"max_samples": 100_000})
        problem = assert_problem(too_big, 422, "model-too-large")
        assert problem["setting"] == "max_samples"
        assert problem["limit_setting"] == "NMBATCH_MODEL_MAX_BYTES"
        fitting = problem["max_samples_fitting"]
        assert 10_000 < fitting < (1 << 20) // 60
        # Not even its k samples and centroids fit (16 k d = 2.56 MB of centroids).
        wide = client.put("/models/wide", json={"k": 4, "dim": 40_000})
        assert assert_problem(wide, 422, "model-too-large")["setting"] == "k"
        # A need past 64 bits (found by schemathesis) is still a 422, its member bounded.
        huge = client.put("/models/huge", json={"k": 58387, "dim": 223, "max_samples": 1 << 57})
        assert assert_problem(huge, 422, "model-too-large")["required_bytes"] == (1 << 63) - 1
        wider = client.put("/models/wide", json={"k": 4, "dim": 100_000})
        assert assert_problem(wider, 422, "dimension-too-large")["setting"] == "NMBATCH_MAX_DIM"
        assert not redis_client.exists(REGISTRY_KEY)

        created = client.put("/models/small", json=SPEC_A | {"max_samples": fitting})
        assert created.status_code == 201 and created.json()["max_samples"] == fitting
        unset = client.put("/models/other", json=SPEC_A)
        problem = assert_problem(unset, 409, "too-many-models")
        assert problem["setting"] == "NMBATCH_MAX_MODELS" and problem["max_models"] == 1
        assert list(redis_client.hkeys(REGISTRY_KEY)) == [b"small"]
        assert model_keys(redis_client, "other") == []
        # The capacity is enforced on its samples like the default model's.
        X = blobs(fitting + 1, 2, 3, seed=4)
        full = assert_problem(post_npy(client, X, "/models/small/samples"), 507, "store-full")
        assert full["setting"] == "max_samples of model 'small'"
        assert full["max_samples"] == fitting and "max_samples of model 'small'" in full["detail"]

    with TestClient(create_app(make_settings(model_max_bytes=1 << 20))) as client:
        # Without max_samples, a model gets what its memory holds.
        doc = client.put("/models/derived", json=SPEC_B).json()
        assert 0 < doc["max_samples"] < (1 << 20) // (4 * 3 + 8 + 4 * 2 + 32)


def test_a_restart_and_a_second_app_bring_the_models_back_with_their_data(
    make_settings: SettingsFactory, redis_client: redis.Redis
) -> None:
    settings = make_settings()
    X = blobs(250, 3, 2, seed=5)
    with TestClient(create_app(settings)) as client:
        assert client.put("/models/kept", json=SPEC_B).status_code == 201
        post_npy(client, X, "/models/kept/samples")
        before = converged(client, "/models/kept", 250)
        # A second process on the same Redis serves the model too (as a standby).
        with TestClient(create_app(settings)) as second:
            assert [m["name"] for m in second.get("/models").json()["models"]][1:] == ["kept"]
            seen = wait_until(
                lambda: second.get("/models/kept/centroids").json().get("n_samples") == 250,
                30,
                "the second app serving the model's snapshot",
            )
            assert seen
            assert second.get("/models/kept").json()["status"]["role"] == "standby"
            # A model created after the second app started: started there when named.
            assert client.put("/models/late", json=SPEC_A).status_code == 201
            post_npy(client, blobs(50, 2, 3, seed=6), "/models/late/samples")
            converged(client, "/models/late", 50)
            assert converged(second, "/models/late", 50)["k"] == 3
            # Deleted by the first app: the second stops it too, and no key is left.
            assert client.delete("/models/late?confirm=late").status_code == 200
            managers = second.app.state.models  # type: ignore[attr-defined]
            wait_until(lambda: "late" not in managers.running, 15, "the second app's sync")
            assert_problem(second.get("/models/late/stats"), 404, "unknown-model")
            # The second app stops its worker, then purges what it wrote meanwhile.
            wait_until(lambda: model_keys(redis_client, "late") == [], 15, "the purge")
    with TestClient(create_app(settings)) as client:
        assert client.get("/models/kept").json()["settings"]["dim"] == 3
        after = converged(client, "/models/kept", 250)
        assert after["version"] >= before["version"]
        np.testing.assert_allclose(after["centroids"], before["centroids"], rtol=1e-5)


def test_a_name_whose_data_in_redis_contradicts_the_settings_is_refused(
    make_settings: SettingsFactory, redis_client: redis.Redis
) -> None:
    # Data left by a service once run with NMBATCH_MODEL=old and k = 5.
    redis_client.hset(ModelKeys("old").meta, mapping={"k": 5, "dim": 2})
    # A registry entry (another process's PUT) that this Redis's data contradicts.
    redis_client.hset(ModelKeys("clash").meta, mapping={"k": 5, "dim": 2})
    redis_client.hset(REGISTRY_KEY, "clash", json.dumps(SPEC_A | {"k": 3}))
    with TestClient(create_app(make_settings())) as client:
        # Data no registered model owns (another service's default model): not adopted,
        # and its settings are not shown.
        problem = assert_problem(client.put("/models/old", json=SPEC_A), 403, "model-not-owned")
        assert "k=5" not in problem["detail"] and "dim" not in problem["detail"]
        assert not redis_client.hexists(REGISTRY_KEY, "old")  # no entry left behind

        listed = {m["name"]: m for m in client.get("/models").json()["models"]}
        assert listed["clash"]["status"]["phase"].startswith("not started")
        assert_problem(client.get("/models/clash"), 409, "model-conflict")
        assert_problem(client.get("/models/clash/centroids"), 409, "model-conflict")


def test_the_default_and_a_named_model_answer_through_the_same_use_cases(
    make_settings: SettingsFactory, model_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One path for every model: ``/samples`` and ``/models/{name}/samples`` reach the
    same ingest use case, ``/centroids``, ``/stats`` and their ``/models/{name}/...``
    twins the same read use cases, each with the handle the one registry holds for the
    model (the default model's under its name too)."""
    calls: list[tuple[str, object]] = []

    def spy(module: Any, name: str) -> None:
        real = getattr(module, name)

        async def recorded(handle: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, handle))
            return await real(handle, *args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    for module, name in ((serving, "ingest"), (serving, "require_model"), (reads, "stats")):
        spy(module, name)
    with TestClient(create_app(make_settings())) as client:
        assert client.put("/models/tenant-a", json=SPEC_A).status_code == 201
        running = client.app.state.models.running  # type: ignore[attr-defined]
        handles = {"": running[model_name].handle, "/models/tenant-a": running["tenant-a"].handle}
        handles[f"/models/{model_name}"] = handles[""]
        for prefix, handle in handles.items():
            calls.clear()
            accepted = client.post(f"{prefix}/samples", json={"vectors": [[1.0, 2.0]]})
            assert accepted.status_code == 202, accepted.text
            # Fewer than k samples: the same problem from the same use case for both.
            assert_problem(client.get(f"{prefix}/centroids"), 409, "not-enough-samples")
            assert client.get(f"{prefix}/stats").status_code == 200
            assert calls == [("ingest", handle), ("require_model", handle), ("stats", handle)]


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_non_finite_settings_are_a_422_and_store_nothing(
    make_settings: SettingsFactory, redis_client: redis.Redis, number: str
) -> None:
    """Issue 34, item 9: PUT /models/{name} with a number JSON parsers read as infinite
    or NaN (and the same settings through the environment) are refused."""
    with TestClient(create_app(make_settings())) as client:
        for field in ("rho", "max_age_seconds"):
            body = f'{{"k": 3, "dim": 2, "retention": "age", "{field}": {number}'
            body += ', "max_age_seconds": 60}' if field == "rho" else "}"
            response = client.put(
                "/models/inf", content=body, headers={"content-type": "application/json"}
            )
            problem = assert_problem(response, 422, "invalid-request")
            assert field in problem["detail"], problem["detail"]
    assert not redis_client.exists(REGISTRY_KEY)
    with pytest.raises(ValueError, match="finite"):
        make_settings(rho=float(number.lower().replace("infinity", "inf")))


def test_a_registry_entry_that_does_not_validate_keeps_its_data_and_shows(
    make_settings: SettingsFactory, redis_client: redis.Redis
) -> None:
    """Issue 34, item 9: an entry written into Redis that no longer validates is never
    taken for a deletion (no purge, in the process running the model or another one), is
    shown in /stats and GET /models, holds its NMBATCH_MAX_MODELS slot visibly, and can
    be deleted."""
    settings = make_settings(max_models=2)
    with TestClient(create_app(settings)) as client:
        assert client.put("/models/kept", json=SPEC_A).status_code == 201
        post_npy(client, blobs(60, 2, 3, seed=7), "/models/kept/samples")
        converged(client, "/models/kept", 60)
        held = model_keys(redis_client, "kept")
        # The entry spoiled by hand (rho beyond a float), a second one with data of its own.
        redis_client.hset(REGISTRY_KEY, "kept", '{"k": 3, "dim": 2, "rho": 1e999}')
        redis_client.hset(REGISTRY_KEY, "odd", json.dumps(SPEC_A | {"colour": "red"}))
        redis_client.hset(ModelKeys("odd").meta, mapping={"k": 3, "dim": 2, "n_samples": 1})
        with TestClient(create_app(settings)) as second:
            time.sleep(2 * SYNC_SECONDS + 1)  # syncs of both apps
            for app in (client, second):
                invalid = app.get("/stats").json()["invalid_models"]
                assert set(invalid) == {"kept", "odd"} and "colour" in invalid["odd"]
                listed = {m["name"]: m for m in app.get("/models").json()["models"]}
                assert "not valid" in listed["odd"]["status"]["phase"]
                assert "not valid" in listed["kept"]["status"]["phase"]
            assert_problem(second.get("/models/odd/stats"), 409, "invalid-model-entry")
        # Nothing purged (a snapshot written since may have kept one more version).
        assert set(held) <= set(model_keys(redis_client, "kept"))
        assert redis_client.xlen(ModelKeys("kept").log) > 0
        assert redis_client.exists(ModelKeys("odd").meta)
        # Both hold their slots, visibly; deleting one frees its slot and its data.
        assert_problem(client.put("/models/third", json=SPEC_B), 409, "too-many-models")
        assert client.delete("/models/odd?confirm=odd").status_code == 200
        assert model_keys(redis_client, "odd") == []
        assert client.put("/models/third", json=SPEC_B).status_code == 201


def _series_models(text: str) -> set[str]:
    """The values of the ``model`` label in a Prometheus text exposition."""
    return set(re.findall(r'\bmodel="([^"]*)"', text))


def test_each_running_model_has_its_own_metric_series_until_it_is_deleted(
    make_settings: SettingsFactory, model_name: str
) -> None:
    with TestClient(create_app(make_settings(max_models=2))) as client:
        for name in ("m-one", "m-two"):
            assert client.put(f"/models/{name}", json=SPEC_A).status_code == 201
        X = blobs(60, 2, 3, seed=4)
        assert client.post("/models/m-one/samples", json={"vectors": X.tolist()}).status_code == 202
        assert client.post("/samples", json={"vectors": X[:10].tolist()}).status_code == 202
        converged(client, "/models/m-one", 60)
        text = client.get("/metrics").text
        assert metric(text, "nmbatch_samples_ingested_total", model="m-one") == 60
        assert metric(text, "nmbatch_samples_ingested_total", model=model_name) == 10
        assert metric(text, "nmbatch_samples_ingested_total", model="m-two") == 0
        assert metric(text, "nmbatch_centroid_version", model="m-one") >= 1
        assert metric(text, "nmbatch_is_worker", model="m-two") == 1
        # The label takes the running models' names, at most NMBATCH_MAX_MODELS + 1.
        assert_problem(client.put("/models/m-three", json=SPEC_A), 409, "too-many-models")
        assert _series_models(client.get("/metrics").text) == {model_name, "m-one", "m-two"}
        # Only the process's own series go without a model.
        process_wide = ("nmbatch_request_seconds", "nmbatch_redis_unavailable",
                        "nmbatch_gc_frozen_objects")  # fmt: skip
        for line in text.splitlines():
            if line.startswith("nmbatch_") and 'model="' not in line:
                assert line.startswith(process_wide), line

        assert client.delete("/models/m-one", params={"confirm": "m-one"}).status_code == 200
        assert _series_models(client.get("/metrics").text) == {model_name, "m-two"}
        # Created again: its series start afresh.
        assert client.put("/models/m-one", json=SPEC_A).status_code == 201
        text = client.get("/metrics").text
        assert metric(text, "nmbatch_samples_ingested_total", model="m-one") == 0
