"""Measure Redis's ``used_memory`` per vector of the sample log, for a few dimensions.

For each dimension ``d``: start a private ``redis-server`` on a free port (the service's
:class:`~nmbatch.service.embedded_redis.EmbeddedRedis`, append-only file in a temporary
folder), append ``--n`` random ``float32`` vectors through the real append path
(:meth:`~nmbatch.service.storage.AsyncSampleLog.append`, plain path) in batches of
``--batch`` rows, and compare ``used_memory`` of ``INFO memory`` before and after (the
appending client closed, so no connection buffer is counted). Prints one table row per
``d``: bytes per vector, its ratio to the payload ``4 d``, entry sizes, and the estimate
of :func:`~nmbatch.service.storage.capacity.redis_bytes_per_vector`.

With ``--base`` the vectors are written instead as the base of a compaction
(:meth:`~nmbatch.service.storage.RetainedLog.compact`: each row with its ``int64`` id,
payload ``4 d + 8``), which is what a ``reservoir`` keeps in Redis.

Usage (from a checkout)::

    python -m benchmarks.redis_bytes                       # d = 16, 128, 784; 200,000 vectors
    python -m benchmarks.redis_bytes --dims 128 --batch 1000
    python -m benchmarks.redis_bytes --chunk-bytes 1048576 # entries of the old size, to compare
    python -m benchmarks.redis_bytes --base                # a compaction's base instead of the log

``--chunk-bytes`` replaces :data:`~nmbatch.service.storage.codec.CHUNK_BYTES` for this
run only (the estimate column still uses the committed constants).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import redis
import redis.asyncio

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage import AsyncSampleLog, ModelKeys, RetainedLog, codec
from nmbatch.service.storage.capacity import redis_bytes_per_vector

MODEL = "redis-bytes"


@dataclass(frozen=True)
class Measurement:
    """``used_memory`` growth of one run: ``n`` vectors of dimension ``d`` appended to the
    log (``what = "log"``) or written as a compaction's base (``"base"``)."""

    what: str
    d: int
    n: int
    batch: int
    entries: int
    used_before: int
    used_after: int
    redis_version: str
    allocator: str

    @property
    def per_vector(self) -> float:
        return (self.used_after - self.used_before) / self.n

    @property
    def payload(self) -> int:
        """Bytes of one vector's data: ``4 d``, and its id (8) in a base."""
        return 4 * self.d + (8 if self.what == "base" else 0)

    @property
    def factor(self) -> float:
        """Bytes per vector over the payload."""
        return self.per_vector / self.payload

    @property
    def rows_per_entry(self) -> int:
        return min(self.batch, max(1, codec.CHUNK_BYTES // self.payload))


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


async def _append_all(url: str, d: int, n: int, batch: int, seed: int) -> None:
    """Append ``n`` standard normal rows of dimension ``d`` in batches of ``batch``."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        log = AsyncSampleLog(client, MODEL)
        await log.fix_dim(d)
        rng = np.random.default_rng(seed)
        for start in range(0, n, batch):
            X = rng.standard_normal((min(batch, n - start), d), dtype=np.float32)
            await log.append(X, dim=d)
    finally:
        await client.aclose()


def _write_base(url: str, d: int, n: int, seed: int) -> None:
    """Write ``n`` standard normal rows of dimension ``d`` as a compaction's base."""
    client = redis.Redis.from_url(url)
    try:
        X = np.random.default_rng(seed).standard_normal((n, d), dtype=np.float32)
        RetainedLog(client, ModelKeys(MODEL)).compact(
            np.arange(n, dtype=np.int64), X, last_id="0-1", policy={}
        )
    finally:
        client.close()


def measure(d: int, n: int, batch: int, seed: int = 0, base: bool = False) -> Measurement:
    """Start a ``redis-server``, append ``n`` vectors of dimension ``d`` (or write them as
    a base), measure, stop."""
    with (
        tempfile.TemporaryDirectory(prefix="redis-bytes-") as folder,
        EmbeddedRedis(folder, port=0) as server,
    ):
        client = redis.Redis.from_url(server.url)
        try:
            client.hset(f"nmbatch:{MODEL}:meta", mapping={"k": 1, "dim": d})
            time.sleep(0.2)
            before = _used_memory(client)
            if base:
                _write_base(server.url, d, n, seed)
                batch = n
            else:
                asyncio.run(_append_all(server.url, d, n, batch, seed))
            time.sleep(0.5)  # let the server free what the closed connection held
            after = _used_memory(client)
            key = ModelKeys(MODEL).base(1) if base else ModelKeys(MODEL).log
            entries = int(client.xlen(key))
            version = str(client.info("server")["redis_version"])
            allocator = str(client.info("memory").get("mem_allocator", "?"))
        finally:
            client.close()
    what = "base" if base else "log"
    return Measurement(what, d, n, batch, entries, before, after, version, allocator)


def table(rows: list[Measurement]) -> str:
    """The measurements as a markdown table."""
    lines = [
        "| key | d | vectors | batch | entries | rows/entry | entry bytes | bytes/vector | "
        "/ payload | estimate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in rows:
        estimate = f"{redis_bytes_per_vector(m.d):,}" if m.what == "log" else "-"
        lines.append(
            f"| {m.what} | {m.d} | {m.n:,} | {m.batch:,} | {m.entries:,} | "
            f"{m.rows_per_entry:,} | {m.payload * m.rows_per_entry:,} | "
            f"{m.per_vector:,.1f} | {m.factor:.3f} | {estimate} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.redis_bytes", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 128, 784])
    parser.add_argument("--n", type=int, default=200_000, help="vectors per dimension")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per append")
    parser.add_argument(
        "--chunk-bytes", type=int, default=None, help="override CHUNK_BYTES for this run"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--base", action="store_true", help="write a compaction's base instead of the log"
    )
    args = parser.parse_args(argv)
    if args.chunk_bytes is not None:
        codec.CHUNK_BYTES = args.chunk_bytes  # encode_chunks reads the module's value
    rows = [measure(d, args.n, args.batch, args.seed, args.base) for d in args.dims]
    first = rows[0]
    print(
        f"redis-server {first.redis_version} ({first.allocator}), CHUNK_BYTES = "
        f"{codec.CHUNK_BYTES:,}; used_memory growth per appended vector:\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
