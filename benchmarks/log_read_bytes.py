"""Measure what reading the sample log costs Redis: by value (the single-machine worker),
by reference (the worker of a Ray engine: entry heads only) and the shards' reads.

Starts a private ``redis-server`` on a free port (the service's
:class:`~nmbatch.service.embedded_redis.EmbeddedRedis`, append-only file in a temporary
folder), appends ``--n`` random ``float32`` vectors of dimension ``--dim`` as log entries
(the log's own encoding, entries just under 1 MiB), then reads the whole log three ways
and reports, for each, the bytes Redis sent (``total_net_output_bytes`` of ``INFO
stats``, the only client connected) and the seconds:

- ``read_log``: :meth:`~nmbatch.service.storage.ModelRepository.read_log`, pages of 32
  (no rows handed over in memory here: every entry comes from Redis);
- ``read_log_heads``: :meth:`~nmbatch.service.storage.ModelRepository.read_log_heads`,
  the same reads, the rows dropped;
- a Lua script returning the heads alone (``_HEADS``; rejected: see
  :mod:`nmbatch.service.storage.entries`), pages of 32;
- ``RedisRows.read``: :class:`~nmbatch.service.storage.entries.RedisRows` reading every
  entry the heads named (what the shards do between them), checked against the rows.

Also reported: Redis's own time in the commands (``usec`` of ``INFO commandstats``),
during which it serves no other client.

Usage (from a checkout)::

    python -m benchmarks.log_read_bytes                  # 400,000 x 128
    python -m benchmarks.log_read_bytes --n 100000 --dim 784
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import redis

from nmbatch.service.embedded_redis import EmbeddedRedis
from nmbatch.service.storage import ModelKeys, ModelRepository
from nmbatch.service.storage.codec import encode_chunks
from nmbatch.service.storage.entries import RedisRows

_PAGE = 32  # the worker's page of log entries

_HEADS = """
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
local out = {}
for i, entry in ipairs(entries) do
  local f = entry[2]
  local n, d = false, false
  for j = 1, #f, 2 do
    if f[j] == 'n' then n = f[j + 1] elseif f[j] == 'd' then d = f[j + 1] end
  end
  out[i] = {entry[1], n, d}
end
return out
"""


def _redis_usec(client: redis.Redis) -> int:
    return sum(int(v["usec"]) for v in client.info("commandstats").values())


def _sent(client: redis.Redis, fn: Callable[[], Any]) -> tuple[Any, int, float, float]:
    """``fn()``, the bytes Redis sent meanwhile, the seconds it took and Redis's own
    seconds in its commands."""
    before = int(client.info("stats")["total_net_output_bytes"])
    usec = _redis_usec(client)
    started = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - started
    busy = (_redis_usec(client) - usec) / 1e6
    return out, int(client.info("stats")["total_net_output_bytes"]) - before, seconds, busy


def _script_heads(client: redis.Redis, key: str) -> list:
    script = client.register_script(_HEADS)
    heads, start = [], "-"
    while page := script(keys=[key], args=[start, _PAGE]):
        heads += page
        start = "(" + page[-1][0].decode()
    return heads


def _read_all(read: Callable[[str, int], list]) -> list:
    chunks, last = [], "0-0"
    while page := read(last, _PAGE):
        chunks += page
        last = page[-1].entry_id
    return chunks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.log_read_bytes", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--n", type=int, default=400_000, help="vectors in the log")
    parser.add_argument("--dim", type=int, default=128, help="their dimension")
    args = parser.parse_args(argv)
    X = np.random.default_rng(0).normal(size=(args.n, args.dim)).astype(np.float32)
    with tempfile.TemporaryDirectory() as folder:
        server = EmbeddedRedis(Path(folder))
        url = server.start()
        try:
            client = redis.Redis.from_url(url)
            key = ModelKeys("bytes").log
            for fields in encode_chunks(X):
                client.xadd(key, fields)
            repository = ModelRepository(client, "bytes")
            by_value, *value = _sent(client, lambda: _read_all(repository.read_log))
            heads, *head = _sent(client, lambda: _read_all(repository.read_log_heads))
            scripted, *script = _sent(client, lambda: _script_heads(client, key))
            source = RedisRows(url)
            rows, *read = _sent(client, lambda: source.read([h.X.ref for h in heads]))
            assert np.array_equal(np.concatenate([c.X for c in by_value]), X)
            assert [int(n) for _, n, _ in scripted] == [len(h.X) for h in heads]
            assert np.array_equal(np.concatenate(rows), X)
            client.close()
        finally:
            server.stop()
    print(f"{len(heads)} log entries, {X.nbytes / 1e6:.1f} MB of rows "
          f"({args.n:,} x {args.dim} float32)\n")  # fmt: skip
    print("| read | MB sent by Redis | bytes per entry | seconds | Redis busy, ms per entry |")
    print("|---|---:|---:|---:|---:|")
    for name, (sent, seconds, busy) in (
        ("worker, `read_log` (by value)", value),
        ("worker, `read_log_heads` (the rows dropped)", head),
        ("a Lua script returning heads only (rejected)", script),
        ("shards, `RedisRows.read` of every entry", read),
    ):
        print(f"| {name} | {sent / 1e6:.3f} | {sent / len(heads):,.0f} | {seconds:.3f} "
              f"| {busy * 1e3 / len(heads):.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
