"""``POST /sweep`` (issue 36, item 4), against a real redis-server.

The default model (unprefixed) and a named one answer through the same use case: each k
fitted on a uniform sample of the retained samples read from Redis, the recommended k
that of the engine's rule; the bounds are settings, refused with a problem naming them;
one sweep at a time per process.
"""

from __future__ import annotations

import numpy as np
from service_helpers import post_npy

from nmbatch.engine.sweep import ELBOW_RULE
from nmbatch.service.main import create_app
from nmbatch.service.usecases import choosing
from tests.testkit import SettingsFactory, TestClient, assert_problem, blobs, blobs_around

KS = [2, 3, 4, 5, 6, 8, 10]


def test_the_sweep_on_blobs_with_a_known_k_recommends_it(
    make_settings: SettingsFactory,
) -> None:
    # Five blobs at least 12 apart (sigma 1, d = 4): their number is not in doubt.
    X, _ = blobs_around(11, 12.0 * np.vstack([np.eye(4), np.zeros((1, 4))]), per_blob=600)
    with TestClient(create_app(make_settings(sweep_max_rows=2000))) as client:
        assert post_npy(client, X).status_code == 202
        assert client.get("/dashboard/data").json()["sweep"] is None
        response = client.post("/sweep", json={"ks": KS[::-1]})
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["recommended_k"] == 5 and doc["rule"] == ELBOW_RULE
        assert [p["k"] for p in doc["points"]] == KS
        assert doc["n_retained"] == 3000  # every sample read, 2,000 of them used
        assert (doc["n_train"], doc["n_heldout"], doc["n_silhouette"]) == (1600, 400, 400)
        energies = [p["heldout_energy"] for p in doc["points"]]
        assert energies[0] > energies[-1]
        # The dashboard draws the last sweep of the model (this process's).
        assert client.get("/dashboard/data").json()["sweep"] == doc
        # A named model: the same use case under the prefix.
        spec = {"k": 3, "dim": 4, "batch_size": 32, "seed": 2}
        assert client.put("/models/swept", json=spec).status_code == 201
        assert post_npy(client, X[:1500], "/models/swept/samples").status_code == 202
        named = client.post("/models/swept/sweep", json={"ks": KS}).json()
        assert named["model"] == "swept" and named["recommended_k"] == 5
        assert named["n_retained"] == 1500 and named["n_train"] == 1200


def test_the_sweep_bounds_are_settings_and_refusals_name_them(
    make_settings: SettingsFactory,
) -> None:
    with TestClient(create_app(make_settings(sweep_max_ks=3, sweep_max_k=50))) as client:
        problem = assert_problem(client.post("/sweep", json={"ks": [2]}), 422, "k-refused")
        assert problem["setting"] == "ks"  # no samples yet
        assert post_npy(client, np.array([[0.0, 1.0], [2.0, 3.0]], np.float32)).status_code == 202
        problem = assert_problem(client.post("/sweep", json={"ks": [1]}), 422, "k-refused")
        assert problem["setting"] == "ks"  # two samples: none to hold out
        assert post_npy(client, blobs(38, 2, 2)).status_code == 202  # 40 in all
        problem = assert_problem(client.post("/sweep", json={"ks": [2, 3, 4, 5]}), 422,
                                 "k-refused")  # fmt: skip
        assert problem["setting"] == "NMBATCH_SWEEP_MAX_KS"
        problem = assert_problem(client.post("/sweep", json={"ks": [51]}), 422, "k-refused")
        assert problem["setting"] == "NMBATCH_SWEEP_MAX_K"
        problem = assert_problem(client.post("/sweep", json={"ks": [33]}), 422, "k-refused")
        assert problem["setting"] == "ks" and "than the 32 a fit gets" in problem["detail"]
        assert client.post("/sweep", json={"ks": []}).status_code == 422
        assert client.post("/sweep", json={"ks": [2], "extra": 1}).status_code == 422
        assert client.post("/sweep", json={"ks": [0]}).status_code == 422
        assert client.post("/sweep", json={"ks": [2, 3]}).status_code == 200
        # One sweep at a time in a process.
        assert choosing._RUNNING.acquire(blocking=False)
        try:
            busy = assert_problem(client.post("/sweep", json={"ks": [2]}), 503, "sweep-busy")
            assert busy and client.post("/sweep", json={"ks": [2]}).headers["retry-after"]
        finally:
            choosing._RUNNING.release()
        assert_problem(client.post("/models/nobody/sweep", json={"ks": [2]}), 404,
                       "unknown-model")  # fmt: skip


def test_the_sweep_reads_the_base_of_a_compacted_model(make_settings: SettingsFactory) -> None:
    """Under a reservoir the retained samples are a base plus the log after it: the sweep
    reads both (and at least the reservoir's size)."""
    settings = make_settings(retention="reservoir", max_samples=500, snapshot_seconds=0.1)
    rng = np.random.default_rng(0)
    with TestClient(create_app(settings)) as client:
        for _ in range(12):
            assert post_npy(client, blobs(200, 3, 4, seed=int(rng.integers(99)))).status_code == 202
        doc = client.post("/sweep", json={"ks": [2, 4, 8]}).json()
        assert 500 <= doc["n_retained"] <= 2400
