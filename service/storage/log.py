"""The sample log as request handlers write it (``redis.asyncio``): one ``append``.

:meth:`AsyncSampleLog.append` stores a batch of vectors in the log
(``nmbatch:{model}:log``) and adds its rows to ``n_samples`` of the meta hash, all of it
or nothing. Before that, the first batch of a model without a dimension fixes it
(``HSETNX`` of ``dim``); a batch of another dimension racing with it is refused with
:class:`~service.storage.errors.WrongDimensionError` and stores nothing.

Capacity: with ``max_samples``, a batch that would take ``n_samples`` past it is refused
whole with :class:`~service.storage.errors.StoreFullError`. The check runs inside the
transaction or script that appends (both paths below), so of two concurrent requests at
the boundary only what fits is stored. A write Redis refuses for its memory (``OOM`` at
``maxmemory`` with ``noeviction``) raises the same error; Redis checks memory before a
transaction runs and before a script's first write, so such a refusal stores nothing
either.

Without an ``Idempotency-Key`` the entries are appended in one MULTI/EXEC transaction
that ends with the capacity check (:data:`GUARD`), and handed to this process's worker
in memory when asked (:mod:`service.storage.handoff`).

With an ``Idempotency-Key`` (``POST /samples``; any 1 to 255 visible ASCII characters,
see :data:`~service.storage.keys.KEY_PATTERN`), a retry with the same key and the same
vectors stores nothing and returns the first answer; the same key with other vectors is
refused with :class:`~service.storage.errors.IdempotencyKeyReusedError`; a retry is
answered from the record also when the store is full meanwhile. "Same vectors"
means the same ``float32`` matrix after parsing, and the same weights (shape and values,
:func:`~service.storage.codec.fingerprint`), so a retry that re-encodes the batch (JSON
instead of ``.npy``) is still a retry. The check of the key, the append of the entries
(the same fields ``n``, ``d``, ``x``, and ``w`` when weighted, as the plain path) with
the ``n_samples`` increment, and the record of the key are one Lua script
(:data:`APPEND_ONCE`), so two concurrent requests with one key store the samples once,
whatever their timing. The record
(:meth:`~service.storage.keys.ModelKeys.idempotency`) expires ``key_seconds`` after its
request was stored; at most ``max_keys`` are kept per model, the oldest forgotten first
by the same script (a retry under a forgotten key is stored again). Entries of this
path are not handed over: the worker reads them from Redis. A request refused before the
append (bad body, wrong dimension ...) leaves no record: the client may fix it and retry
under the same key.

Both paths (and :meth:`AsyncSampleLog.fix_dim`) first check the model's generation key
(:attr:`~service.storage.keys.ModelKeys.generation`) against the token the log was
given: a model deleted (or deleted and created again) since the request picked it gets
nothing, and :class:`~service.storage.errors.ModelGoneError` is raised.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import redis.asyncio

from nmbatch.service.storage.codec import as_str, encode_chunks, fingerprint
from nmbatch.service.storage.errors import (
    DuplicateSampleIdError,
    IdempotencyKeyReusedError,
    ModelGoneError,
    StoreFullError,
    WrongDimensionError,
    redis_oom,
)
from nmbatch.service.storage.handoff import LocalEntries
from nmbatch.service.storage.keys import ModelKeys, idempotency_digest
from nmbatch.service.storage.scripts import APPEND_ONCE, FIX_DIM, GUARD

__all__ = [
    "APPEND_ONCE",
    "DEFAULT_MAX_KEYS",
    "FIX_DIM",
    "GUARD",
    "AppendOutcome",
    "AsyncSampleLog",
    "Offload",
    "assigned_ids",
    "inline",
]

T = TypeVar("T")

Offload = Callable[..., Awaitable[Any]]
"""``await offload(values, fn, *args)`` returns ``fn(*args)``, run where the caller wants
it (``service.usecases.serving.off_loop``: in the thread pool for large inputs); ``values``
estimates the work in numbers touched."""

DEFAULT_MAX_KEYS = 100_000
"""Most ``Idempotency-Key`` records kept per model when the caller names no bound
(``NMBATCH_IDEMPOTENCY_MAX_KEYS``'s default)."""

_COPY_WEIGHT = 16  # a plain copy costs about 1/16 of the numpy work an Offload counts

async def inline(values: int, fn: Callable[..., T], *args: object) -> T:
    """The :data:`Offload` that runs ``fn(*args)`` right here."""
    return fn(*args)


@dataclass(frozen=True)
class AppendOutcome:
    """What :meth:`AsyncSampleLog.append` did.

    Attributes
    ----------
    stored : bool
        True if this call appended the samples; False for a replay of an earlier request
        with the same ``Idempotency-Key``.
    accepted : int
        Vectors accepted by the (first) request.
    n_samples : int
        Total samples in the log right after the (first) request was stored.
    ids : list of str
        The (first) request's sample ids, one per row: those it sent, else those the log
        assigned (:func:`assigned_ids`).
    """

    stored: bool
    accepted: int
    n_samples: int
    ids: list[str]


def assigned_ids(entry_ids: list[str], rows: list[int]) -> list[str]:
    """The sample ids the log assigns to the rows of entries ``entry_ids`` holding
    ``rows[i]`` rows each: ``"<entry id>-<row>"`` (``"1732870000000-0-17"``), unique
    per model since stream entry ids are (:mod:`nmbatch.service.sampleids` refuses ids
    of that form from clients)."""
    return [f"{entry}-{r}" for entry, n in zip(entry_ids, rows, strict=True) for r in range(n)]


def _script_args(
    X: np.ndarray, weights: np.ndarray | None, ids: list[str] | None
) -> tuple[str, list[int], list[bytes | int]]:
    """Fingerprint (with the ``ids``), the rows of each log entry and the flat
    :data:`APPEND_ONCE` arguments (n, d, x, w per log entry) of ``X`` and its
    ``weights``."""
    args: list[bytes | int] = []
    rows: list[int] = []
    for fields in encode_chunks(X, weights):
        rows.append(int(fields["n"]))
        args += [fields["n"], fields["d"], fields["x"], fields.get("w", b"")]
    return fingerprint(X, weights, ids), rows, args


class AsyncSampleLog:
    """What request handlers need: append samples (fixing the dimension), read counters.

    Parameters
    ----------
    client : redis.asyncio.Redis
        Returns bytes (``decode_responses=False``).
    model : str
    local : LocalEntries or None
        Where appended entries are handed to this process's worker.
    generation : str or None
        The model's generation token (``nmbatch:{model}:generation``): every append
        and :meth:`fix_dim` store nothing and raise :class:`ModelGoneError` once the key
        holds another value or none. None: not checked (a log used outside the service).
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        model: str,
        local: LocalEntries | None = None,
        generation: str | None = None,
    ) -> None:
        self.client = client
        self.keys = ModelKeys(model)
        self.local = local
        self.generation = generation
        self._once_script = client.register_script(APPEND_ONCE)
        self._fix_dim_script = client.register_script(FIX_DIM)

    @property
    def _token(self) -> str:
        return self.generation or ""

    def _gone(self) -> ModelGoneError:
        return ModelGoneError(
            f"model '{self.keys.model}' was deleted while this request was in flight; "
            "nothing was stored"
        )

    async def append(
        self,
        X: np.ndarray,
        *,
        dim: int | None,
        max_samples: int | None = None,
        idempotency_key: str | None = None,
        key_seconds: float | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
        hand_over: bool = False,
        offload: Offload = inline,
        weights: np.ndarray | None = None,
        ids: list[str] | None = None,
    ) -> AppendOutcome:
        """Append ``X`` (``(m, d)`` float32, validated, not modified afterwards) to the log.

        Parameters
        ----------
        X : ndarray (m, d) float32
        dim : int or None
            The model's dimension as the caller knows it; None: ``X`` fixes it unless
            another batch did (then :class:`WrongDimensionError` if ``d`` differs).
        max_samples : int or None
            The model's capacity: :class:`StoreFullError` (nothing stored) if the log
            would hold more samples afterwards; None: no limit.
        idempotency_key : str or None
            Store ``X`` once for this key (see the module); :class:`IdempotencyKeyReusedError`
            if the key stored other vectors.
        key_seconds : float or None
            How long the key is remembered; needed with ``idempotency_key``.
        max_keys : int
            Most keys remembered (the oldest are forgotten first).
        hand_over : bool
            Hand the entries to this process's worker in memory (:attr:`local`; plain
            path only).
        offload : Offload
            Runs the encoding (and fingerprint) of ``X``.
        weights : ndarray (m,) float64 or None
            The rows' sample weights (checked: finite, ``>= 0``), stored with them (the
            entries' ``w``, :mod:`~nmbatch.service.storage.codec`) and part of the
            idempotency fingerprint; None: every row weighs 1 (entries as ever).
        ids : list of str or None
            The rows' sample ids (checked: one per row, distinct, of the client's form,
            :mod:`nmbatch.service.sampleids`); stored in the model's id map
            (:attr:`~nmbatch.service.storage.keys.ModelKeys.sample_ids`) by the script
            that appends, which refuses the whole request with
            :class:`DuplicateSampleIdError` if one is already there. Part of the
            idempotency fingerprint. None: the log assigns them (:func:`assigned_ids`).
        """
        m = int(X.shape[0])
        if dim is None:
            await self.fix_dim(int(X.shape[1]))
        capacity = 0 if max_samples is None else int(max_samples)
        if idempotency_key is not None or ids is not None:
            if idempotency_key is not None and key_seconds is None:
                raise ValueError("key_seconds is needed with an idempotency_key")
            return await self._append_once(
                X, weights, ids, idempotency_key, key_seconds or 1.0, max_keys, capacity,
                offload,
            )
        if capacity:
            # Refused before any XADD when the count already shows it: the guard below
            # would take the entries out again, but Redis's append-only file would keep
            # both the entries and their deletion.
            held = await self.n_samples()
            if held + m > capacity:
                raise StoreFullError(capacity, held, m)
        entries = await offload(X.size // _COPY_WEIGHT, encode_chunks, X, weights)
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                for fields in entries:
                    pipe.xadd(self.keys.log, fields)
                pipe.eval(
                    GUARD, 3, self.keys.log, self.keys.meta, self.keys.generation,
                    capacity, m, len(entries), self._token,
                )  # fmt: skip
                reply = await pipe.execute()
        except redis.ResponseError as exc:
            if not redis_oom(exc):
                raise
            raise StoreFullError(capacity, await self.n_samples(), m, redis_oom=True) from None
        stored, n_samples = (int(value) for value in reply[-1])
        if stored < 0:
            raise self._gone()
        if not stored:
            raise StoreFullError(capacity, n_samples, m)
        entry_ids = [as_str(raw) for raw in reply[:-1]]
        rows = [int(fields["n"]) for fields in entries]
        if hand_over and self.local is not None:
            parts, weighed, start = [], [], 0
            for n in rows:
                parts.append(X[start : start + n])
                weighed.append(None if weights is None else weights[start : start + n])
                start += n
            self.local.put(entry_ids, parts, weighed)
        return AppendOutcome(stored=True, accepted=m, n_samples=n_samples,
                             ids=assigned_ids(entry_ids, rows))  # fmt: skip

    async def _append_once(
        self,
        X: np.ndarray,
        weights: np.ndarray | None,
        ids: list[str] | None,
        idempotency_key: str | None,
        key_seconds: float,
        max_keys: int,
        capacity: int,
        offload: Offload,
    ) -> AppendOutcome:
        """:data:`APPEND_ONCE` of ``X`` (its ``weights``, its sample ``ids``), under
        ``idempotency_key`` if any."""
        m = int(X.shape[0])
        mine, rows, args = await offload(X.size, _script_args, X, weights, ids)
        ttl_ms = max(1, round(key_seconds * 1000))
        sent = ids or []
        try:
            digest = "" if idempotency_key is None else idempotency_digest(idempotency_key)
            keys = self.keys
            reply = await self._once_script(
                keys=[keys.idempotency_prefix + digest, keys.log, keys.meta, keys.generation,
                      keys.idempotency_index, keys.sample_ids],
                args=[mine, ttl_ms, m, capacity, self._token, int(time.time() * 1000),
                      int(max_keys), keys.idempotency_prefix, digest, len(sent), *sent,
                      *args],
            )  # fmt: skip
        except redis.ResponseError as exc:
            if not redis_oom(exc):
                raise
            raise StoreFullError(capacity, await self.n_samples(), m, redis_oom=True) from None
        status, theirs = int(reply[0]), as_str(reply[1])
        if status == -3:
            raise DuplicateSampleIdError(as_str(reply[2]))
        if status == -2:
            raise self._gone()
        if status == -1:
            raise StoreFullError(capacity, int(reply[3]), m)
        if status == 0 and theirs != mine:
            raise IdempotencyKeyReusedError(
                "this Idempotency-Key was used for a request with other vectors; use a new "
                "key for new samples"
            )
        entry_ids = as_str(reply[4]).split() if len(reply) > 4 else []
        if ids is None and len(entry_ids) == len(rows):
            ids = assigned_ids(entry_ids, rows)
        return AppendOutcome(stored=bool(status), accepted=int(reply[2]),
                             n_samples=int(reply[3]), ids=list(ids or []))  # fmt: skip

    async def fix_dim(self, d: int) -> None:
        """Set the model's dimension to ``d`` unless set; raise if it is another one.

        Raises :class:`WrongDimensionError` (another dimension is fixed),
        :class:`StoreFullError` (Redis refuses the write for its memory) or
        :class:`ModelGoneError`.
        """
        try:
            stored = int(
                await self._fix_dim_script(
                    keys=[self.keys.meta, self.keys.generation], args=[d, self._token]
                )
            )
        except redis.ResponseError as exc:
            if not redis_oom(exc):
                raise
            raise StoreFullError(0, await self.n_samples(), 0, redis_oom=True) from None
        if stored < 0:
            raise self._gone()
        if stored != d:
            raise WrongDimensionError(expected=stored, got=d)

    async def dim(self) -> int | None:
        """The model's dimension, once fixed."""
        raw = await self.client.hget(self.keys.meta, "dim")
        return int(raw) if raw is not None else None

    async def log_size(self) -> tuple[int, int | None]:
        """Entries of the log, and the Redis memory of the log and its retained base
        (``MEMORY USAGE``, sampled; None where the command is not allowed)."""
        entries = int(await self.client.xlen(self.keys.log))
        try:
            used = [await self.client.memory_usage(self.keys.log)]
            generation = await self.client.hget(self.keys.meta, "base_generation")
            if generation is not None:
                used.append(await self.client.memory_usage(self.keys.base(int(generation))))
        except redis.ResponseError:
            return entries, None
        return entries, sum(int(u or 0) for u in used)

    async def n_samples(self) -> int:
        """Total number of samples in the log."""
        raw = await self.client.hget(self.keys.meta, "n_samples")
        return int(raw) if raw is not None else 0
