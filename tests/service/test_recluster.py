"""Re-clustering with another k (issue 36, item 3), against a real redis-server.

``POST /models/{name}/recluster {"k": K}`` (and ``POST /recluster`` for the default
model) restarts the model with K clusters on its retained samples: nothing is deleted,
the kept versions stay readable, the version numbers go on increasing, the new versions
have K centroids and count every sample. A restart keeps the new k (the default model's
``NMBATCH_K`` no longer applies).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import redis
from service_helpers import post_npy
from test_seeded_models import GIVEN, SPEC, centroids_of

from nmbatch.service.main import create_app
from nmbatch.service.storage import ModelKeys
from tests.testkit import SettingsFactory, TestClient, assert_problem, blobs, wait_until


def settled(client: TestClient, prefix: str, k: int, n: int) -> dict[str, Any]:
    """The /stats document once the model has ``k`` centroids on ``n`` samples, converged,
    and its newest version kept."""

    def ready() -> dict[str, Any] | None:
        stats = client.get(f"{prefix}/stats").json()
        kept = client.get(f"{prefix}/versions").json()["versions"]
        centroids = client.get(f"{prefix}/centroids")
        done = (
            stats["converged"] and stats["n_samples"] == n and kept
            and kept[-1]["version"] == stats["version"] and centroids.status_code == 200
            and len(centroids.json()["centroids"]) == k
        )  # fmt: skip
        return stats if done else None

    return wait_until(ready, 60, f"k = {k} on {n} samples, settled and kept")


def test_recluster_with_a_new_k_leaves_the_old_versions_readable(
    client: TestClient, redis_client: redis.Redis
) -> None:
    prefix = "/models/re"
    assert client.put(prefix, json=SPEC | {"init": GIVEN.tolist()}).status_code == 201
    X = blobs(900, 2, 5, seed=7, separation=20.0)
    assert post_npy(client, X, f"{prefix}/samples").status_code == 202
    settled(client, prefix, 3, 900)
    before = client.get(f"{prefix}/versions").json()["versions"]
    old = {row["version"]: centroids_of(client, prefix, row["version"]) for row in before}

    pinned = before[-1]["version"]  # pinned: reads keep serving it through the restart
    assert client.post(f"{prefix}/pin", json={"version": pinned}).status_code == 200
    response = client.post(f"{prefix}/recluster", json={"k": 5})
    assert response.status_code == 200, response.text
    assert response.json()["settings"]["k"] == 5
    assert response.json()["settings"]["init"] == "k-means++"  # the seed had k = 3
    served = client.get(f"{prefix}/centroids").json()
    assert (served["version"], served["k"]) == (pinned, 3)
    assert client.delete(f"{prefix}/pin").status_code == 200
    assert not redis_client.exists(ModelKeys("re").seed)
    stats = settled(client, prefix, 5, 900)
    assert stats["n_samples"] == stats["n_logged"] == 900  # every sample still counted
    after = client.get(f"{prefix}/versions").json()["versions"]
    # The old versions are all still kept, and read as they were; the new ones come after.
    assert [row["version"] for row in after[: len(before)]] == [r["version"] for r in before]
    for version, centroids in old.items():
        np.testing.assert_array_equal(centroids_of(client, prefix, version), centroids)
    new = after[len(before):]
    assert new and all(row["k"] == 5 for row in new)
    assert new[0]["version"] > before[-1]["version"]
    assert new[0]["changed"].startswith("re-clustered: k 3 -> 5")
    assert centroids_of(client, prefix).shape == (5, 2)
    # Samples posted after the re-clustering go to the new model.
    assert post_npy(client, X[:100], f"{prefix}/samples").status_code == 202
    settled(client, prefix, 5, 1000)
    # The registry holds the new spec: PUT with the old one is a conflict.
    assert_problem(client.put(prefix, json=SPEC | {"init": GIVEN.tolist()}), 409, "model-conflict")


def test_recluster_refuses_a_k_its_settings_cannot_hold_and_changes_nothing(
    client: TestClient,
) -> None:
    prefix = "/models/window"
    spec = SPEC | {"retention": "window", "max_samples": 50}
    assert client.put(prefix, json=spec).status_code == 201
    problem = assert_problem(client.post(f"{prefix}/recluster", json={"k": 60}), 422, "k-refused")
    assert problem["setting"] == "k"
    assert client.get(prefix).json()["settings"]["k"] == 3
    assert client.post(f"{prefix}/recluster", json={"k": 0}).status_code == 422
    assert_problem(client.post("/models/nobody/recluster", json={"k": 2}), 404, "unknown-model")


def test_the_default_model_is_reclustered_at_the_unprefixed_path_and_keeps_its_new_k(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings()
    X = blobs(600, 2, 4, seed=8, separation=20.0)
    with TestClient(create_app(settings)) as client:
        assert post_npy(client, X).status_code == 202
        settled(client, "", 3, 600)
        last = client.get("/versions").json()["versions"][-1]["version"]
        response = client.post("/recluster", json={"k": 4})
        assert response.status_code == 200, response.text
        settled(client, "", 4, 600)
        assert client.get("/models").json()["models"][0]["settings"]["k"] == 4
        assert centroids_of(client, "", last).shape == (3, 2)
    # A restart with the same NMBATCH_K = 3: the model is the re-clustered one, k = 4.
    with TestClient(create_app(settings)) as client:
        assert centroids_of(client, "").shape == (4, 2)
        assert client.get("/centroids").json()["version"] > last


def test_a_second_process_follows_a_recluster_at_its_next_sync(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings()
    X = blobs(600, 2, 4, seed=9, separation=20.0)
    with TestClient(create_app(settings)) as client, TestClient(create_app(settings)) as second:
        assert client.put("/models/shared", json=SPEC).status_code == 201
        assert post_npy(client, X, "/models/shared/samples").status_code == 202
        settled(client, "/models/shared", 3, 600)
        wait_until(lambda: second.get("/models/shared/centroids").json().get("k") == 3, 30,
                   "the second app serving the model")  # fmt: skip
        assert client.post("/models/shared/recluster", json={"k": 4}).status_code == 200
        settled(client, "/models/shared", 4, 600)
        # The second app restarts its copy with the new spec (a standby of the worker):
        # it serves the snapshots of k = 4, and its own settings say so.
        wait_until(lambda: second.get("/models/shared").json()["settings"]["k"] == 4, 30,
                   "the second app's sync")  # fmt: skip
        wait_until(lambda: second.get("/models/shared/centroids").json().get("k") == 4, 30,
                   "the second app serving k = 4")  # fmt: skip


def test_a_second_process_follows_a_recluster_of_the_default_model(
    make_settings: SettingsFactory,
) -> None:
    settings = make_settings(dim=2, k=3, seed=1, batch_size=64)
    X = blobs(600, 2, 4, seed=9, separation=20.0)
    with TestClient(create_app(settings)) as client, TestClient(create_app(settings)) as second:
        assert post_npy(client, X, "/samples").status_code == 202
        settled(client, "", 3, 600)
        wait_until(lambda: second.get("/centroids").json().get("k") == 3, 30,
                   "the second app serving the default model")  # fmt: skip
        assert client.post("/recluster", json={"k": 4}).status_code == 200
        settled(client, "", 4, 600)
        # The second app restarts its default model with the meta's k at its next sync:
        # it serves the snapshots of k = 4, and its own settings say so.
        name = settings.model
        wait_until(lambda: second.get(f"/models/{name}").json()["settings"]["k"] == 4, 30,
                   "the second app's sync")  # fmt: skip
        wait_until(lambda: second.get("/centroids").json().get("k") == 4, 30,
                   "the second app serving k = 4")  # fmt: skip
