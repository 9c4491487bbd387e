"""The worker: the background thread that turns the sample log into published models.

One :class:`Worker` per app, started and stopped by the app's lifespan. Several service
processes may serve one model (same Redis, same ``NMBATCH_MODEL``); one of them is its
**worker**, the others are **standbys**, decided by a lease in Redis
(:class:`~nmbatch.service.worker.lease.LeaseKeeper`). The roles and phases, and the
transitions between them, are in :mod:`nmbatch.service.worker.roles`.

Worker role:

1. reserve centroid versions above anything shown so far and publish the latest snapshot
   (renumbered above them if the last worker died after the snapshot);
2. wait until the model's dimension is known (setting, Redis meta, or the first batch);
3. build the engine's ``NestedBatchStore`` and ``make_algorithm("nmbatch", ...)`` (in a
   child process unless ``NMBATCH_WORKER_PROCESS=false``: :mod:`nmbatch.engine.hosting`),
   replay the whole sample log into the store and, if a snapshot exists, call
   ``restore(centroids, b, iteration)`` (one exact assignment pass over the first ``b``
   samples);
4. loop: read new log entries (when the ingest route signals, and every
   ``poll_seconds`` for entries written by other processes), ``step()`` while there is
   work, publish each new model (:class:`~nmbatch.service.worker.publisher.Publisher`),
   write a snapshot every ``snapshot_seconds``; sleep while converged with no new samples;
5. on stop, write a last snapshot and release the lease.

Standby role: every ``poll_seconds`` try to take the lease, else publish the snapshot in
Redis if it is newer than the one served (so ``/centroids`` and ``/assign`` follow the
worker). A standby that takes the lease goes through the worker role from step 1; a
worker that finds the lease taken by another process (it was frozen or cut off longer
than the lease's expiry) drops its store and becomes a standby. Snapshot writes and
version reservations check the lease inside Redis, so a worker that lost it can never
overwrite its successor's work.

Redis outages: the worker keeps iterating on the samples it holds and keeps publishing
(within the versions it reserved), skips log reads and snapshots while Redis is away,
retrying with exponential backoff (:class:`~nmbatch.service.worker.backoff.RedisBackoff`);
when Redis answers again it catches up by itself. BLAS and numba run on
``worker_threads`` threads (threadpoolctl, ``numba.set_num_threads``) so the HTTP side
keeps a core. If the engine's process dies, the worker starts a new one (log replay,
restore from the centroids served last). Any other error than Redis being unavailable
ends the thread and ``/readyz`` reports it.

Modules:

- :mod:`~nmbatch.service.worker.loop`: :class:`Worker`, the thread's loop and the
  transitions between roles and phases;
- :mod:`~nmbatch.service.worker.roles`: the roles and phases (``StrEnum``);
- :mod:`~nmbatch.service.worker.lease`: :class:`LeaseKeeper`, the lease in Redis and the
  centroid versions reserved under it;
- :mod:`~nmbatch.service.worker.backoff`: :class:`RedisBackoff`, Redis calls retried with
  backoff while Redis is away;
- :mod:`~nmbatch.service.worker.publisher`: :class:`Publisher`, version numbers, the
  model board, ``/stats`` and the metrics;
- :mod:`~nmbatch.service.worker.publication`: the worker's part that publishes each
  model and its statistics, writes the snapshots and, as a standby, follows them.
"""

from nmbatch.service.worker.lease import VERSION_BLOCK
from nmbatch.service.worker.loop import Worker
from nmbatch.service.worker.roles import Phase, Role

__all__ = ["VERSION_BLOCK", "Phase", "Role", "Worker"]
