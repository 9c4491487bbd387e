"""The worker lease and the writes it fences, on a real Redis."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from nmbatch.engine.state import ModelState
from nmbatch.service.state import PublishedModel
from nmbatch.service.storage import (
    LeaseLostError,
    ModelKeys,
    ModelRepository,
    Snapshot,
    WorkerLease,
)
from tests.testkit import wait_until

pytestmark = pytest.mark.fault


def lease_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, single_connection_client=True)


def snapshot(version: int) -> Snapshot:
    state = ModelState(
        centroids=np.zeros((2, 2), dtype=np.float32),
        counts=np.zeros(2, dtype=np.int64),
        batch_size=2,
        n_samples=2,
        iteration=1,
        converged=False,
        initialized=True,
    )
    return Snapshot(PublishedModel.build(version=version, state=state, updated_at=0.0), "1-0")


def test_one_holder_renewal_and_compare_and_delete_release(redis_url: str, model_name: str) -> None:
    a = WorkerLease(lease_client(redis_url), model_name, 10.0)
    b = WorkerLease(lease_client(redis_url), model_name, 10.0)
    assert a.acquire() and a.held()
    assert not b.acquire() and not b.held()
    assert a.acquire()  # ours already
    key = ModelKeys(model_name).lock
    assert a.client.pttl(key) > 9000
    assert a.holder().startswith(a.token + ":")
    assert a.renew() and not b.renew()
    assert not b.release()  # compare-and-delete: not the holder, nothing deleted
    assert a.held()
    assert a.release() and a.holder() is None
    assert b.acquire() and b.held()
    a.client.close()
    b.client.close()


def test_an_expired_lease_goes_to_the_contender_and_the_old_holder_knows(
    redis_url: str, model_name: str
) -> None:
    a = WorkerLease(lease_client(redis_url), model_name, 0.2)
    b = WorkerLease(lease_client(redis_url), model_name, 10.0)
    assert a.acquire()
    assert not b.acquire()  # a's connection is alive: wait for the expiry
    wait_until(b.acquire, 5, "the lease to expire")
    assert not a.renew() and not a.held()


def test_a_holder_whose_connection_is_gone_is_replaced_at_once(
    redis_url: str, model_name: str
) -> None:
    a = WorkerLease(lease_client(redis_url), model_name, 60.0)
    assert a.acquire()
    a.client.close()  # what the kernel does to a process killed with kill -9
    b = WorkerLease(lease_client(redis_url), model_name, 60.0)
    wait_until(b.acquire, 5, "the takeover")  # Redis notices the closed socket at once
    assert b.held()


def test_a_lease_left_from_before_a_redis_restart_is_replaced_at_once(
    redis_url: str, model_name: str
) -> None:
    b = WorkerLease(lease_client(redis_url), model_name, 60.0)
    a = WorkerLease(lease_client(redis_url), model_name, 60.0)
    assert a.acquire()
    # The same value, but from an earlier run of the server (as reloaded from its
    # append-only file): the client id may well be taken by a new connection now.
    token = a.holder().split(":")[0]
    a.client.set(ModelKeys(model_name).lock, f"{token}:{'0' * 40}:{b.client.client_id()}")
    assert b.acquire() and b.held() and not a.held()


def test_fenced_writes_need_the_lease(redis_url: str, model_name: str) -> None:
    repository = ModelRepository(redis.Redis.from_url(redis_url), model_name)
    a = WorkerLease(lease_client(redis_url), model_name, 10.0)
    b = WorkerLease(lease_client(redis_url), model_name, 10.0)
    assert a.acquire()
    assert repository.reserve_versions(a.token, 1000) == 1000
    assert repository.reserve_versions(a.token, 10) == 1000  # never lowered
    assert repository.write_snapshot(snapshot(5), a.token)
    with pytest.raises(LeaseLostError):
        repository.write_snapshot(snapshot(6), b.token)
    with pytest.raises(LeaseLostError):
        repository.reserve_versions(b.token, 5000)
    assert repository.snapshot_version() == 5 and repository.reserved_versions() == 1000
    assert a.release(reserved=5)  # a clean stop: everything shown is in the snapshot
    assert repository.reserved_versions() == 5


def test_an_expired_lease_is_taken_again_only_if_nobody_worked_meanwhile(
    redis_url: str, model_name: str
) -> None:
    repository = ModelRepository(redis.Redis.from_url(redis_url), model_name)
    a = WorkerLease(lease_client(redis_url), model_name, 0.1)
    assert a.acquire()
    repository.reserve_versions(a.token, 1000)
    wait_until(lambda: a.holder() is None, 5, "the expiry")  # Redis frozen, say
    assert a.renew() and a.held()  # taken again: nobody reserved versions meanwhile

    b = WorkerLease(lease_client(redis_url), model_name, 10.0)
    wait_until(b.acquire, 5, "the expiry")
    repository.reserve_versions(b.token, 2000)  # b worked
    assert b.release()
    assert not a.renew()  # free again, but a must not resume: b reserved versions since
