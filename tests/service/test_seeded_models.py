"""Seeding a model with given centroids (issue 36, item 3), against a real redis-server.

``PUT /models/{name}`` takes ``init`` as a list of lists in its JSON spec, or the
centroids as an npy body (the spec's other fields as query parameters); the default model
takes ``NMBATCH_INIT_FILE``. The given centroids are checked (shape, values, a zero row
under cosine: a 422 naming the fault, nothing created), kept in Redis with the spec, and
published exactly as the model's first version (kept: ``?version=1`` reads them).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from service_helpers import post_npy

from nmbatch.service.main import create_app
from nmbatch.service.models.manager import StartupError
from nmbatch.service.storage import ModelKeys
from nmbatch.service.storage.seed import decode_seed
from tests.testkit import SettingsFactory, TestClient, assert_problem, blobs, npy_bytes, wait_until

SPEC: dict[str, Any] = {"k": 3, "dim": 2, "rho": 100, "batch_size": 32, "seed": 1}
NPY = {"content-type": "application/x-npy"}
GIVEN = np.array([[-5.0, 0.25], [0.5, 5.0], [5.0, -0.75]], dtype=np.float32)


def centroids_of(client: TestClient, prefix: str, version: int | None = None) -> np.ndarray:
    """The centroids ``prefix`` serves (``version``: a kept one), as exact float32."""
    query = f"?version={version}" if version is not None else ""
    response = client.get(f"{prefix}/centroids{query}", headers={"accept": "application/x-npy"})
    assert response.status_code == 200, response.text[:300]
    return np.load(io.BytesIO(response.content), allow_pickle=False)


def first_version(client: TestClient, prefix: str) -> dict[str, Any]:
    """The oldest kept version, once one is kept and a newer one published after it."""

    def ready() -> dict[str, Any] | None:
        kept = client.get(f"{prefix}/versions").json()
        versions = kept["versions"]
        return versions[0] if versions and kept["newest"] > versions[0]["version"] else None

    return wait_until(ready, 30, "a kept version and a newer one")


def test_seeding_reproduces_the_given_centroids_as_version_1(
    client: TestClient, redis_client: redis.Redis
) -> None:
    name = "seeded"
    response = client.put(f"/models/{name}", json=SPEC | {"init": GIVEN.tolist()})
    assert response.status_code == 201, response.text
    assert response.json()["settings"]["init"] == "given"
    # The same spec and centroids find it; other centroids are a conflict.
    assert client.put(f"/models/{name}", json=SPEC | {"init": GIVEN.tolist()}).status_code == 200
    assert_problem(
        client.put(f"/models/{name}", json=SPEC | {"init": (GIVEN + 1).tolist()}),
        409, "model-conflict",
    )  # fmt: skip
    kept = decode_seed(redis_client.hgetall(ModelKeys(name).seed))
    np.testing.assert_array_equal(kept, GIVEN)
    X = blobs(600, 2, 3, seed=3)
    assert post_npy(client, X, f"/models/{name}/samples").status_code == 202
    first = first_version(client, f"/models/{name}")
    # Version 1 is the given centroids exactly (iteration 0: nothing moved them yet),
    # with the counts of the first batch under them; later versions move them.
    assert (first["version"], first["iteration"], first["k"]) == (1, 0, 3)
    np.testing.assert_array_equal(centroids_of(client, f"/models/{name}", 1), GIVEN)
    wait_until(lambda: client.get(f"/models/{name}/stats").json()["converged"], 30, "converged")
    assert not np.array_equal(centroids_of(client, f"/models/{name}"), GIVEN)


def test_an_npy_body_seeds_a_cosine_model_with_its_unit_rows(client: TestClient) -> None:
    name = "seeded-npy"
    response = client.put(
        f"/models/{name}?metric=cosine&batch_size=32&seed=2", content=npy_bytes(GIVEN),
        headers=NPY,
    )  # fmt: skip
    assert response.status_code == 201, response.text
    settings = response.json()["settings"]
    assert (settings["k"], settings["dim"], settings["metric"]) == (3, 2, "cosine")
    X = blobs(400, 2, 3, seed=4) + 20.0
    assert post_npy(client, X, f"/models/{name}/samples").status_code == 202
    first_version(client, f"/models/{name}")
    unit = GIVEN / np.linalg.norm(GIVEN.astype(np.float64), axis=1, keepdims=True)
    np.testing.assert_allclose(centroids_of(client, f"/models/{name}", 1), unit, rtol=1e-6)


@pytest.mark.parametrize(
    ("body", "fault", "row"),
    [
        (SPEC | {"init": GIVEN[:2].tolist()}, "shape", None),
        (SPEC | {"init": [[1.0, 2.0, 3.0]] * 3}, "shape", None),
        (SPEC | {"init": "given"}, "missing", None),
        (SPEC | {"init": [[1e39, 0.0], [0.0, 1.0], [1.0, 0.0]]}, "values", None),  # > float32
        (SPEC | {"metric": "cosine", "init": [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]}, "zero-row", 1),
    ],
)
def test_centroids_that_cannot_seed_are_refused_and_nothing_is_created(
    client: TestClient, redis_client: redis.Redis, body: dict[str, Any], fault: str,
    row: int | None,
) -> None:  # fmt: skip
    problem = assert_problem(client.put("/models/refused", json=body), 422, "invalid-init")
    assert (problem["fault"], problem.get("row")) == (fault, row)
    assert_problem(client.get("/models/refused"), 404, "unknown-model")
    assert not redis_client.exists(ModelKeys("refused").seed)


def test_an_npy_body_with_bad_values_or_settings_is_refused(client: TestClient) -> None:
    bad = GIVEN.copy()
    bad[1, 0] = np.nan
    assert client.put("/models/refused", content=npy_bytes(bad), headers=NPY).status_code == 422
    problem = assert_problem(
        client.put("/models/refused?k=4", content=npy_bytes(GIVEN), headers=NPY), 422,
        "invalid-init",
    )  # fmt: skip
    assert problem["fault"] == "shape"
    assert client.put("/models/refused?colour=red", content=npy_bytes(GIVEN),
                      headers=NPY).status_code == 422  # fmt: skip
    assert_problem(client.get("/models/refused"), 404, "unknown-model")


def test_the_default_model_seeds_from_its_init_file_and_keeps_it(
    make_settings: SettingsFactory, tmp_path: Path, redis_client: redis.Redis, model_name: str
) -> None:
    path = tmp_path / "centroids.npy"
    np.save(path, GIVEN)
    settings = make_settings(init_file=path)
    assert settings.init == "given"
    with TestClient(create_app(settings)) as client:
        # The seed fixed the dimension, as a first batch would.
        assert redis_client.hget(ModelKeys(model_name).meta, "dim") == b"2"
        assert post_npy(client, blobs(300, 2, 3, seed=5)).status_code == 202
        first = first_version(client, "")
        np.testing.assert_array_equal(centroids_of(client, "", first["version"]), GIVEN)
    np.testing.assert_array_equal(
        decode_seed(redis_client.hgetall(ModelKeys(model_name).seed)), GIVEN
    )
    np.save(path, GIVEN + 1)  # other centroids than the model was seeded with
    with pytest.raises(StartupError, match="other centroids"), TestClient(create_app(settings)):
        pass
    np.save(path, GIVEN[:2])  # and a file of the wrong shape, for a new model
    other = make_settings(init_file=path, model=model_name + "-b")
    with pytest.raises(StartupError, match="shape"), TestClient(create_app(other)):
        pass
