"""The retained samples in Redis: the log trimmed, a reservoir compacted into a base.

With retention ``window`` or ``age`` the log's entries wholly outside the retained set
are trimmed (:meth:`RetainedLog.trim_log`, ``XTRIM MINID``). With ``reservoir`` the
retained rows are scattered over all of history, so they are written anew into a
*base* and the log up to that point is dropped (:meth:`RetainedLog.compact`).

The retained set of a model is the rows of its base (``nmbatch:{model}:base:{g}``,
:meth:`RetainedLog.base_rows`) followed by the log's entries after ``base_last_id``
(:meth:`ModelRepository.read_log`); the meta hash names the base
(:class:`~nmbatch.service.storage.retained_base.Base`, :mod:`service.storage.keys`; the
base's format and its reading: :mod:`~nmbatch.service.storage.retained_base`). A
compaction from generation ``g`` (stage ``"begin"`` first):

1. deletes ``base:{g+1}``, left by a compaction that died (stage ``"discarded"``);
2. writes the rows and their ids into ``base:{g+1}``, a few entries per round trip
   (stages ``"chunks {i}/{m}"`` after each round trip, ``"written"`` at the end); the
   entries get the ids ``{nonce}-1`` ... ``{nonce}-{m}``, the nonce random;
3. commits with one script (:data:`COMMIT`, stage ``"committed"`` after it): if the
   lease is still held by the caller's token, the meta still names generation ``g``, and
   ``base:{g+1}`` holds exactly the ``m`` entries this call wrote (its first and last ids
   are ``{nonce}-1`` and ``{nonce}-{m}``: no other writer added to it or recreated it),
   then it trims the log to the entries after ``last_id``, deletes ``base:{g}`` and
   points the meta at ``g + 1``.

Until the script runs, nothing the retained set is made of has changed (``base:{g+1}``
is not named by the meta); the script runs whole or not at all (Redis runs a script
atomically and writes it to its append-only file as one ``MULTI``/``EXEC``). So a
``kill -9`` of the compacting process at any point leaves the retained set either as it
was or as the compaction made it: nothing lost, nothing twice.

The script's first write is ``XTRIM`` (a command Redis runs also at ``maxmemory``), so a
commit, which frees memory, is not refused when Redis is full. The writes of step 2
(``XADD``) are: a compaction needs room for the old and the new base at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np
import redis

from nmbatch.service.storage.codec import CHUNK_BYTES, id_key, next_id
from nmbatch.service.storage.errors import LeaseLostError
from nmbatch.service.storage.keys import ModelKeys
from nmbatch.service.storage.retained_base import (
    Base,
    BaseChangedError,
    BaseReader,
    encode_base_entries,
)

__all__ = ["COMMIT", "DISCARD", "RetainedLog"]

log = logging.getLogger(__name__)

Pause = Callable[[str], None]
"""Called with the name of each stage of a compaction as it is reached (tests stop or
kill the process there)."""

DISCARD = """
-- KEYS[1] meta, KEYS[2] lock, KEYS[3] base of generation g + 1
-- ARGV[1] "token:" of the lease ('' : no lease check), ARGV[2] g
-- -1: lease not held; -2: the meta names another generation; else keys deleted (0, 1).
if ARGV[1] ~= '' then
  local v = redis.call('GET', KEYS[2])
  if (not v) or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return -1 end
end
if tonumber(redis.call('HGET', KEYS[1], 'base_generation') or '0') ~= tonumber(ARGV[2]) then
  return -2
end
return redis.call('UNLINK', KEYS[3])
"""
"""Delete ``base:{g+1}`` while the meta names generation ``g`` (and the lease is held)."""

COMMIT = """
-- KEYS[1] meta, KEYS[2] lock, KEYS[3] log, KEYS[4] base g, KEYS[5] base g + 1
-- ARGV[1] "token:" of the lease ('' : no lease check), ARGV[2] g, ARGV[3] last_id,
-- ARGV[4] rows, ARGV[5] policy (JSON), ARGV[6] MINID of the log, ARGV[7] entries written,
-- ARGV[8] id of the first entry written, ARGV[9] id of the last one.
-- {1, log entries trimmed}; {-1, 0} lease not held; {-2, g in meta}; {-3, entries found}.
if ARGV[1] ~= '' then
  local v = redis.call('GET', KEYS[2])
  if (not v) or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return {-1, 0} end
end
local g = tonumber(redis.call('HGET', KEYS[1], 'base_generation') or '0')
if g ~= tonumber(ARGV[2]) then return {-2, g} end
local m = tonumber(ARGV[7])
local found = redis.call('XLEN', KEYS[5])
if found ~= m then return {-3, found} end
if m > 0 then
  local first = redis.call('XRANGE', KEYS[5], '-', '+', 'COUNT', 1)[1][1]
  local last = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)[1][1]
  if first ~= ARGV[8] or last ~= ARGV[9] then return {-3, found} end
end
local trimmed = redis.call('XTRIM', KEYS[3], 'MINID', ARGV[6])
redis.call('UNLINK', KEYS[4])
redis.call('HSET', KEYS[1], 'base_generation', ARGV[2] + 1, 'base_last_id', ARGV[3],
  'base_rows', ARGV[4], 'base_policy', ARGV[5])
return {1, trimmed}
"""
"""Step 3 of a compaction, whole or not at all (see the module)."""


class RetainedLog(BaseReader):
    """Trimming and compaction of one model's retained samples (see the module), and
    the reading of its base (:class:`~nmbatch.service.storage.retained_base.BaseReader`).

    Used by one thread at a time (the worker); ``client`` returns bytes
    (``decode_responses=False``).

    Attributes
    ----------
    entry_bytes : int
        Largest payload (rows and ids) of one base entry; default
        :data:`~service.storage.codec.CHUNK_BYTES`.
    pipeline_entries : int
        Base entries sent per round trip while writing (bounds the request and the
        memory of encoded rows at ``pipeline_entries * entry_bytes``).
    """

    def __init__(self, client: redis.Redis, keys: ModelKeys) -> None:
        self.client = client
        self.keys = keys
        self.entry_bytes = CHUNK_BYTES
        self.pipeline_entries = 16
        self._discard = client.register_script(DISCARD)
        self._commit = client.register_script(COMMIT)

    def log_bytes(self) -> int | None:
        """Redis's memory of the log and the current base (``MEMORY USAGE``, which
        samples a few stream nodes: cheap, approximate), in bytes; None where Redis
        refuses the command (an ACL of a managed Redis)."""
        generation = self.client.hget(self.keys.meta, "base_generation")
        keys = [self.keys.log]
        if generation is not None:
            keys.append(self.keys.base(int(generation)))
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.memory_usage(key)
                return sum(int(used or 0) for used in pipe.execute())
        except redis.ResponseError:
            return None

    # -- trimming --------------------------------------------------------------------------
    def trim_log(self, min_id: str) -> int:
        """Delete the log's entries with ids below ``min_id`` (exact ``XTRIM MINID``).

        ``min_id = next_id(x)`` deletes every entry up to and including ``x``. Returns
        the number of entries deleted.
        """
        return int(self.client.xtrim(self.keys.log, minid=min_id, approximate=False))

    def discard_partial(self) -> None:
        """Delete a next-generation base left by a compaction that died, if any."""
        for _ in range(8):
            generation = self._generation()
            if self._discard_next(generation, "") >= 0:
                return
        raise BaseChangedError("the base generation kept changing (concurrent compactions)")

    # -- compaction ------------------------------------------------------------------------
    def compact(
        self,
        ids: np.ndarray,
        X: np.ndarray | Callable[[np.ndarray], np.ndarray],
        *,
        last_id: str,
        policy: dict[str, Any],
        lease_token: str | None = None,
        pause: Pause | None = None,
        dim: int | None = None,
        weights: np.ndarray | Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> Base:
        """Make ``(ids, X)`` the new base, holding the retained samples up to ``last_id``.

        Parameters
        ----------
        ids : ndarray (n,) int64
            Ids of the retained samples (stored as they are, in this order).
        X : ndarray (n, d) float32, or callable
            Their rows (``n`` may be 0); or ``rows_of(ids_page) -> (m, d) float32``,
            called once a pipeline trip (``pipeline_entries * entry_bytes`` of rows), so
            that a large base is never whole in this process (a reservoir's rows come
            from the engine page by page, each copy a short hold of the GIL); then
            ``dim`` is ``d``.
        last_id : str
            A log entry id: the rows are the retained samples of the log up to and
            including it (and of the old base); the log's entries up to it are deleted.
            Not below the current base's ``last_id``.
        policy : dict
            JSON-able state of the retention policy as of ``last_id``.
        lease_token : str or None
            A :attr:`WorkerLease.token`: step 1 and the commit check that this lease
            is still held, else :class:`LeaseLostError` (nothing committed; rows
            written by then stay in ``base:{g+1}`` for the next compaction to delete).
            None: no check.
        pause : callable or None
            Called with each stage's name (see the module).
        weights : ndarray (n,) float64, or callable, or None
            The rows' sample weights (or ``weights_of(ids_page) -> (m,) float64``, called
            with the rows' pages), stored with them (``w``); None: every row weighs 1 and
            the entries are as they were before weights.

        Returns the new :class:`Base`. Raises :class:`LeaseLostError` or
        :class:`BaseChangedError` without committing anything. After a Redis error
        (connection lost while the commit ran) the commit may or may not have happened:
        :meth:`read_base` tells which.
        """
        ids = np.ascontiguousarray(ids, dtype="<i8").reshape(-1)
        n = int(ids.shape[0])
        if callable(X):
            if dim is None:
                raise ValueError("rows given as a function need their dimension (dim)")
            rows_of, d = X, int(dim)
        else:
            X = np.ascontiguousarray(X, dtype="<f4")
            if n == 0 and X.ndim != 2:
                X = X.reshape(0, 0)
            if X.ndim != 2 or X.shape[0] != n:
                raise ValueError(f"ids {ids.shape} and X {X.shape} do not match: (n,) and (n, d)")
            rows_of, d = None, int(X.shape[1])
        policy_json = json.dumps(policy, sort_keys=True, separators=(",", ":"))
        step = pause or _no_pause
        step("begin")
        old = self.read_base()
        g = old.generation if old is not None else 0
        if old is not None and id_key(last_id) < id_key(old.last_id):
            raise ValueError(f"last_id {last_id} is before the base's last id {old.last_id}")
        prefix = "" if lease_token is None else lease_token + ":"
        self._check(self._discard_next(g, prefix), g)
        step("discarded")

        new_key = self.keys.base(g + 1)
        nonce = secrets.randbelow(1 << 47) + 1
        per_row = 4 * max(1, d) + (16 if weights is not None else 8)  # row, id, weight
        rows_per_entry = max(1, self.entry_bytes // per_row)
        m = -(-n // rows_per_entry)  # entries
        try:
            written = 0
            per_trip = max(1, self.pipeline_entries) * rows_per_entry
            for start in range(0, n, per_trip):
                stop = min(n, start + per_trip)
                w = None
                if weights is not None:
                    w = np.asarray(weights(ids[start:stop]) if callable(weights)
                                   else weights[start:stop], dtype=np.float64)  # fmt: skip
                    if w.shape != (stop - start,):
                        raise ValueError(f"weights gave {w.shape}, not {(stop - start,)}")
                if rows_of is None:
                    entries = encode_base_entries(ids[start:stop], X[start:stop], 0,
                                                  stop - start, rows_per_entry, w)  # fmt: skip
                else:
                    page = np.ascontiguousarray(rows_of(ids[start:stop]), dtype="<f4")
                    if page.shape != (stop - start, d):
                        raise ValueError(f"rows_of gave {page.shape}, not {(stop - start, d)}")
                    entries = encode_base_entries(
                        ids[start:stop], page, 0, stop - start, rows_per_entry, w
                    )
                with self.client.pipeline(transaction=False) as pipe:
                    for fields in entries:
                        written += 1
                        pipe.xadd(new_key, fields, id=f"{nonce}-{written}")
                    pipe.execute()
                step(f"chunks {written}/{m}")
            step("written")
            status, value = self._commit(
                keys=[self.keys.meta, self.keys.lock, self.keys.log, self.keys.base(g), new_key],
                args=[prefix, g, last_id, n, policy_json, next_id(last_id), m,
                      f"{nonce}-1", f"{nonce}-{m}"],
            )  # fmt: skip
        except BaseException:
            with contextlib.suppress(Exception):  # best effort; the next compaction also does
                self._discard_next(g, prefix)
            raise
        status, value = int(status), int(value)
        if status == -3:
            raise BaseChangedError(
                f"base generation {g + 1} holds {value} entries, not the {m} written here: "
                "another writer changed it; nothing committed"
            )
        self._check(status, g, value)
        log.info(
            "compacted %d retained samples up to log entry %s into base generation %d "
            "(%d log entries trimmed)", n, last_id, g + 1, value,
        )  # fmt: skip
        step("committed")
        entries = tuple(f"{nonce}-{e}" for e in range(1, m + 1))
        return Base(g + 1, last_id, n, json.loads(policy_json), entries, rows_per_entry)

    # -- helpers ---------------------------------------------------------------------------
    def _generation(self) -> int:
        raw = self.client.hget(self.keys.meta, "base_generation")
        return int(raw) if raw is not None else 0

    def _discard_next(self, generation: int, prefix: str) -> int:
        """:data:`DISCARD` of ``base:{generation + 1}``: its status (see the script)."""
        keys = [self.keys.meta, self.keys.lock, self.keys.base(generation + 1)]
        return int(self._discard(keys=keys, args=[prefix, generation]))

    @staticmethod
    def _check(status: int, generation: int, found: int | None = None) -> None:
        """Raise for a refused :data:`DISCARD` or :data:`COMMIT` status."""
        if status == -1:
            raise LeaseLostError("the worker lease is held by another process")
        if status == -2:
            now = "" if found is None else f" (now {found})"
            raise BaseChangedError(
                f"another compaction committed since base generation {generation}{now}; "
                "nothing committed"
            )


def _no_pause(stage: str) -> None:
    return None
