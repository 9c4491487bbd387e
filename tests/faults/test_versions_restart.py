"""Kept versions and pins across real service processes (issue 36, items 1 and 2).

Two ``python -m nmbatch`` processes share one redis-server: the default model and a
named one keep their versions within the bound; a version pinned through one process is
served by the other within a few seconds while newer versions are published; after
``kill -9`` of both and a restart, the versions are still listed and the pin still
served; after another ``kill -9`` and a restart with a lower bound, the bound holds with
the pinned version kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from fault_helpers import ServiceProcess

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage import ModelKeys
from tests.testkit import npy_bytes, wait_until

pytestmark = pytest.mark.fault

DEFAULT = "versions-default"
NAMED = "versions-named"
SPEC = {"k": 3, "dim": 2, "batch_size": 64, "rho": 100, "seed": 3}
PREFIXES = {DEFAULT: "", NAMED: f"/models/{NAMED}"}


def kept(client: redis.Redis, model: str) -> list[int]:
    """The kept versions in Redis (index and records agreeing)."""
    keys = ModelKeys(model)
    index = sorted(int(v) for v in client.zrange(keys.versions, 0, -1))
    records = sorted(int(k.rsplit(b":", 1)[1]) for k in client.scan_iter(keys.prefix + "version:*"))
    assert index == records
    return index


def publish_more(http: httpx.Client, prefix: str, rng: np.random.Generator, count: int) -> None:
    """``count`` times: post a batch, wait until it is in a kept version."""
    for _ in range(count):
        last = http.get(f"{prefix}/versions").json()["versions"]
        last_version = last[-1]["version"] if last else 0
        X = rng.standard_normal((50, 2)).astype(np.float32) + rng.integers(0, 30, (1, 2))
        response = http.post(
            f"{prefix}/samples", content=npy_bytes(X), headers={"content-type": "application/x-npy"}
        )
        assert response.status_code == 202

        def settled(last_version: int = last_version) -> bool:
            stats = http.get(f"{prefix}/stats").json()
            versions = http.get(f"{prefix}/versions").json()["versions"]
            return bool(
                stats["converged"]
                and stats["n_samples"] == stats["n_logged"]
                and versions
                and versions[-1]["version"] == stats["version"] > last_version
            )

        wait_until(settled, 60, f"a new kept version of {prefix or 'the default model'}")


def test_versions_and_pins_survive_kill_9_and_a_second_process_serves_the_pin(
    start_redis: Callable[..., EmbeddedRedis],
    start_service: Callable[..., ServiceProcess],
) -> None:
    url = start_redis(appendfsync="always").url
    settings: dict[str, Any] = dict(
        redis_url=url, model=DEFAULT, k=3, dim=2, batch_size=64, snapshot_seconds=0.2,
        poll_seconds=0.1, worker_threads=1, worker_lock_seconds=30, keep_versions=3,
    )  # fmt: skip
    first = start_service("first", **settings)
    first.ready()
    with httpx.Client(base_url=first.base, timeout=30) as http:
        assert http.put(f"/models/{NAMED}", json=SPEC).status_code == 201
    peer = start_service("peer", **settings)  # a standby of both models
    peer.ready()
    client = redis.Redis.from_url(url)
    rng = np.random.default_rng(11)
    pins: dict[str, int] = {}
    try:
        with httpx.Client(base_url=first.base, timeout=30) as http, httpx.Client(
            base_url=peer.base, timeout=30
        ) as other:
            for model, prefix in PREFIXES.items():
                publish_more(http, prefix, rng, 4)
                versions = kept(client, model)
                assert len(versions) == 3
                pins[model] = versions[0]
                assert http.post(f"{prefix}/pin", json={"version": versions[0]}).status_code == 200
                publish_more(http, prefix, rng, 3)  # training goes on while pinned
                assert pins[model] in kept(client, model) and len(kept(client, model)) == 3
                assert http.get(f"{prefix}/centroids").json()["version"] == pins[model]
                assert http.get(f"{prefix}/stats").json()["version"] > pins[model]
                # The other process follows the pin (its registry sync, every 2 s).
                wait_until(
                    lambda prefix=prefix, model=model: other.get(f"{prefix}/centroids").json()[
                        "version"
                    ]
                    == pins[model],
                    15,
                    f"the peer serving the pin of {model}",
                )
                assert other.get(f"{prefix}/stats").json()["pinned_version"] == pins[model]
            before = {model: kept(client, model) for model in PREFIXES}
        first.kill()
        peer.kill()

        # Restarted: the versions and the pins are still there. The new worker shows
        # the last snapshot again under a version above every one shown (it is kept as
        # a new version when snapshotted, the oldest unpinned one going).
        second = start_service("second", **settings)
        second.ready()
        with httpx.Client(base_url=second.base, timeout=30) as http:
            for model, prefix in PREFIXES.items():
                wait_until(lambda prefix=prefix: http.get(f"{prefix}/stats").status_code == 200,
                           30, f"{model} started")  # fmt: skip
                listing = http.get(f"{prefix}/versions").json()
                assert listing["pinned"] == pins[model] and listing["bound"] == 3
                listed = [row["version"] for row in listing["versions"]]
                assert pins[model] in listed and before[model][-1] in listed
                assert all(v in before[model] or v > before[model][-1] for v in listed)
                assert len(listed) <= 3
                assert http.get(f"{prefix}/centroids").json()["version"] == pins[model]
                answer = http.get(f"{prefix}/assign", params={"vector": "1,2"}).json()
                assert answer["version"] == pins[model]
                publish_more(http, prefix, rng, 2)
                now = kept(client, model)
                assert len(now) == 3 and pins[model] in now and now[-1] > before[model][-1]
                assert http.get(f"{prefix}/centroids").json()["version"] == pins[model]
        second.kill()

        # Restarted with a lower bound: it holds from the next snapshot on, the pin kept.
        settings["keep_versions"] = 2
        third = start_service("third", **settings)
        third.ready()
        with httpx.Client(base_url=third.base, timeout=30) as http:
            for model, prefix in PREFIXES.items():
                wait_until(lambda prefix=prefix: http.get(f"{prefix}/stats").status_code == 200,
                           30, f"{model} started")  # fmt: skip
                assert http.get(f"{prefix}/versions").json()["bound"] == 2
                publish_more(http, prefix, rng, 1)
                now = kept(client, model)
                assert len(now) == 2 and pins[model] in now
                assert http.get(f"{prefix}/centroids").json()["version"] == pins[model]
                assert http.delete(f"{prefix}/pin").json()["pinned"] is None
                assert http.get(f"{prefix}/centroids").json()["version"] > pins[model]
                assert client.get(ModelKeys(model).pin) is None
    finally:
        client.close()
