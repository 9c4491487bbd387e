"""``kill -9`` of a service whose engine runs on a Ray cluster: the coordinator is lost.

A local Ray cluster of two nodes (``ray.cluster_utils.Cluster``, no dashboard, small
object stores) and a redis-server with persistence; the service runs as a real process
(``python -m nmbatch``) pointed at both, its shards on the cluster reading the log from
Redis. It is killed mid-ingestion; a new process replays the log into new shards from
the snapshot. Nothing acknowledged is lost, the killed run's shard actors go with their
driver, and the new model converges on every logged sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
import redis
from fault_helpers import Ingestor, Ledger, ServiceProcess, check_log_against_ledger, http_post

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage import ModelKeys
from tests.testkit import two_node_ray_cluster, wait_until

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.fault

MODEL = "ray-crash"
STORE = 80 * 2**20


@pytest.fixture
def ray_cluster() -> Iterator[Cluster]:
    """A two-node local Ray cluster this process is not connected to."""
    with two_node_ray_cluster(STORE) as cluster:
        yield cluster


def shard_actors() -> list[tuple[str, str]]:
    """``(name, namespace)`` of the live shard actors of the cluster this process is
    connected to (the service's, in its own job's namespace)."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return sorted((a["name"], a["namespace"]) for a in named
                  if a["name"].startswith("nmbatch-shard-"))  # fmt: skip


def test_kill_9_of_the_coordinator_loses_nothing_and_new_shards_read_the_log(
    start_service: Callable[..., ServiceProcess],
    start_redis: Callable[..., EmbeddedRedis],
    ray_cluster: Cluster,
) -> None:
    url = start_redis().url  # appendonly, fsync every second
    settings = dict(model=MODEL, k=3, batch_size=256, snapshot_seconds=1, poll_seconds=0.1,
                    worker_lock_seconds=30, redis_url=url, ray_address=ray_cluster.address,
                    ray_shards=2)  # fmt: skip
    client = redis.Redis.from_url(url)
    keys = ModelKeys(MODEL)
    first = start_service("first", **settings)
    assert first.ready(60)["role"] == "worker"
    ledger = Ledger()
    ingest = Ingestor(http_post(first.base), ledger, threads=2, sizes=(300, 5_000), pause=0.05)
    with ingest:
        wait_until(
            lambda: len(ledger.acked) >= 10 and client.hget(keys.snapshot, "version"),
            90,
            "acknowledged batches and a snapshot from the cluster's engine",
        )
        first.kill()
    ray.init(address=ray_cluster.address, log_to_driver=False)
    # The killed driver's actors are not detached: Ray ends them with it.
    wait_until(lambda: not shard_actors(), 60, "the killed run's shards to go")

    second = start_service("second", **settings)
    second.ready(60)
    rows = check_log_against_ledger(client, MODEL, ledger)
    assert rows >= ledger.acked_rows() > 0
    with httpx.Client(base_url=second.base, timeout=10) as http:

        def converged() -> dict | None:
            response = http.get("/centroids")
            doc = response.json() if response.status_code == 200 else {}
            return doc if doc.get("converged") and doc.get("n_samples") == rows else None

        doc = wait_until(converged, 120, f"convergence on the {rows} logged samples")
        assert sum(doc["counts"]) == rows
        centroids = np.asarray(doc["centroids"])
        answer = http.post("/assign", json={"vectors": centroids.tolist()}).json()
        assert answer["clusters"] == list(range(3))
    names = shard_actors()
    assert len(names) == 2  # the new run's shards, on the cluster
    parts = ray.get([ray.get_actor(name, namespace).assignments.remote()
                     for name, namespace in names])  # fmt: skip
    assert sum(p[0].shape[0] for p in parts) == rows  # every logged sample in one shard
    client.close()
