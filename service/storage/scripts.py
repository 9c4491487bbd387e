"""The Lua scripts (and the transaction's last command) of the sample log's appends.

:mod:`nmbatch.service.storage.log` runs them: :data:`GUARD` ends the MULTI/EXEC of a
plain append, :data:`APPEND_ONCE` stores a request with an ``Idempotency-Key`` or sample
ids (each check and every write in one script), :data:`FIX_DIM` fixes the dimension.
"""

from __future__ import annotations

__all__ = ["APPEND_ONCE", "FIX_DIM", "GUARD"]

GUARD = """
-- Last command of the MULTI/EXEC of a plain append, after the request's XADDs.
-- KEYS[1] sample log (stream), KEYS[2] meta (hash), KEYS[3] generation (string)
-- ARGV[1] capacity (0: none), ARGV[2] rows in the request, ARGV[3] its log entries,
-- ARGV[4] the model's generation ('': not checked).
local function take_back()
  local added = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[3])
  for _, entry in ipairs(added) do
    redis.call('XDEL', KEYS[1], entry[1])
  end
end
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[4] then
  take_back()
  if redis.call('XLEN', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1])
  end
  return {-1, 0}
end
local held = tonumber(redis.call('HGET', KEYS[2], 'n_samples') or '0')
local capacity = tonumber(ARGV[1])
if capacity > 0 and held + tonumber(ARGV[2]) > capacity then
  take_back()
  return {0, held}
end
return {1, redis.call('HINCRBY', KEYS[2], 'n_samples', ARGV[2])}
"""
"""The capacity and generation check of the plain path: counts the request's rows, or
takes its entries (the last ones of the stream: nothing runs between the commands of
one MULTI/EXEC) out again when they pass the capacity or the model was deleted (a log
the request created is deleted again). Returns ``{1, n_samples after}``,
``{0, n_samples held}`` (capacity) or ``{-1, 0}`` (deleted). Sent with ``EVAL`` (a
``NOSCRIPT`` inside the transaction would leave the entries uncounted). The rows go to
``XADD`` directly, not through a script: Lua copies every argument it gets, which makes
Redis's work per sample several times larger."""

APPEND_ONCE = """
-- KEYS[1] idempotency record (hash), KEYS[2] sample log (stream), KEYS[3] meta (hash),
-- KEYS[4] generation (string), KEYS[5] index of the records (sorted set), KEYS[6] the
-- sample ids (hash: id -> '<entry id> <row>')
-- ARGV[1] fingerprint, ARGV[2] expiry in ms, ARGV[3] rows in the request,
-- ARGV[4] capacity (0: none), ARGV[5] generation ('': not checked), ARGV[6] now in ms,
-- ARGV[7] most records kept, ARGV[8] prefix of the records' keys, ARGV[9] this record's
-- member (the key's sha256; '': no Idempotency-Key, no record), ARGV[10] the number c
-- of sample ids sent (0, or one per row), then the c ids,
-- then (n, d, x, w) of every log entry, as service.storage.codec.encode_chunks makes them
-- (w '': no weights, the entry gets no w field).
local keyed = ARGV[9] ~= ''
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then
  return {-2, ARGV[1], 0, 0}
end
if keyed then
  local stored = redis.call('HMGET', KEYS[1], 'fingerprint', 'accepted', 'n_samples',
    'entries')
  if stored[1] then
    return {0, stored[1], stored[2], stored[3], stored[4] or ''}
  end
end
local c = tonumber(ARGV[10])
for i = 11, 10 + c do
  if redis.call('HEXISTS', KEYS[6], ARGV[i]) == 1 then
    return {-3, ARGV[1], ARGV[i], 0}
  end
end
local held = tonumber(redis.call('HGET', KEYS[3], 'n_samples') or '0')
local capacity = tonumber(ARGV[4])
if capacity > 0 and held + tonumber(ARGV[3]) > capacity then
  return {-1, ARGV[1], 0, held}
end
local entries = {}
local row = 0
for i = 11 + c, #ARGV, 4 do
  local id
  if ARGV[i + 3] == '' then
    id = redis.call('XADD', KEYS[2], '*', 'n', ARGV[i], 'd', ARGV[i + 1], 'x', ARGV[i + 2])
  else
    id = redis.call('XADD', KEYS[2], '*', 'n', ARGV[i], 'd', ARGV[i + 1], 'x', ARGV[i + 2],
      'w', ARGV[i + 3])
  end
  entries[#entries + 1] = id
  if c > 0 then
    for r = 0, tonumber(ARGV[i]) - 1 do
      redis.call('HSET', KEYS[6], ARGV[11 + row], id .. ' ' .. r)
      row = row + 1
    end
  end
end
local total = redis.call('HINCRBY', KEYS[3], 'n_samples', ARGV[3])
local joined = table.concat(entries, ' ')
if not keyed then
  return {1, ARGV[1], ARGV[3], total, joined}
end
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'accepted', ARGV[3], 'n_samples', total,
  'entries', joined)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
-- The bound: forget expired members, then the oldest records past the most kept (a
-- lowered bound is reached over a few appends, at most 1,000 records each).
local now = tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[2]))
redis.call('ZADD', KEYS[5], now, ARGV[9])
local excess = redis.call('ZCARD', KEYS[5]) - tonumber(ARGV[7])
if excess > 0 then
  local oldest = redis.call('ZPOPMIN', KEYS[5], math.min(excess, 1000))
  for i = 1, #oldest, 2 do
    redis.call('DEL', ARGV[8] .. oldest[i])
  end
end
redis.call('PEXPIRE', KEYS[5], ARGV[2])
return {1, ARGV[1], ARGV[3], total, joined}
"""
"""Store a request in one script: with an ``Idempotency-Key`` once per key, and with
sample ids each id once per model. Returns ``{1, fingerprint, accepted, n_samples, entry
ids}`` stored (the entry ids space-separated), ``{0, ...}`` the record of an earlier
request under the key (same fields), ``{-1, fingerprint, 0, n_samples held}`` refused
(capacity), ``{-2, ...}`` refused (the model was deleted), ``{-3, fingerprint, id, 0}``
refused (``id`` is already a sample id of the model). Every check runs before the first
write, so a refused request stores nothing. Records are bounded by count (``ARGV[7]``,
oldest first) and each by a fixed size (hashed key, fingerprint, two integers, and the
ids of the request's log entries, one per MiB of its rows), so by bytes too
(:data:`~nmbatch.service.storage.capacity.IDEMPOTENCY_RECORD_BYTES`). The records it
deletes are named from the index's members, not passed as keys: the service runs on one
Redis (no cluster), where a script may touch any key."""

FIX_DIM = """
-- KEYS[1] meta (hash), KEYS[2] generation (string)
-- ARGV[1] dimension, ARGV[2] generation ('': not checked).
if ARGV[2] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[2] then return -1 end
redis.call('HSETNX', KEYS[1], 'dim', ARGV[1])
return tonumber(redis.call('HGET', KEYS[1], 'dim'))
"""
"""Fix the model's dimension unless fixed (and unless the model was deleted: ``-1``);
returns the dimension Redis holds."""
