"""The client's operations without I/O: generators that yield requests and get answers.

Each operation (push, centroids, assign, stats, wait) is a generator that yields a
:class:`Call` (an HTTP request to make) or a :class:`Sleep`, and receives the
:class:`Answer` of each call. The synchronous and the asynchronous client drive the same
generators (``_sync.py``, ``_async.py``): they make the request, retry it under their
:class:`~nmbatch_client.retry.RetryPolicy`, and send back the final answer, or throw
the typed error of an error answer (:mod:`nmbatch_client.errors`) into the generator,
which may catch it (a ``413`` with the service's limit: send smaller chunks; ``409``
not-enough-samples while waiting: poll again).

Chunking: a batch of ``n`` vectors of dimension ``d`` goes in requests of at most
:meth:`Limits.rows_per_request` rows, so that no request exceeds the service's
``NMBATCH_MAX_VECTORS`` rows or ``NMBATCH_MAX_BODY_BYTES`` bytes. The client starts from
the service's defaults (or the limits it was given) and lowers them for the rest of the
session when a ``413`` names a smaller ``limit`` (nothing of a refused request is stored).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import numpy as np

from nmbatch_client.bodies import (
    NPY_RESERVE,
    NPZ_RESERVE,
    Encoding,
    as_ids,
    as_matrix,
    as_weights,
    encode,
    encode_npz,
    row_bytes,
)
from nmbatch_client.errors import (
    ConnectionFailedError,
    NotEnoughSamplesError,
    PayloadTooLargeError,
    UnavailableError,
    WaitTimeoutError,
    json_loads,
)
from nmbatch_client.results import Assignment, Centroids, PushResult
from nmbatch_client.retry import RetryPolicy
from nmbatch_client.sources import BATCH_ROWS, Batches, Columns, is_source, open_source

__all__ = [
    "Answer",
    "Call",
    "CentroidsCache",
    "Encoding",
    "Limits",
    "Operation",
    "Sleep",
    "assign_operation",
    "centroids_operation",
    "delete_samples_operation",
    "push_operation",
    "sample_operation",
    "stats_operation",
    "wait_operation",
]

T = TypeVar("T")
MAX_KEY_PREFIX = 200
"""Longest key prefix: ``"{key}:{start}-{stop}"`` stays within the service's 255."""
Progress = Callable[[int, int | None], None]
"""``progress(rows_acknowledged, total)``; ``total`` None when unknown (an iterator)."""


@dataclass(frozen=True)
class Call:
    """One HTTP request; ``retry`` None means the client's own policy."""

    method: str
    path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None
    retry: RetryPolicy | None = None


@dataclass(frozen=True)
class Sleep:
    """Wait this many seconds before the next step."""

    seconds: float


@dataclass(frozen=True)
class Answer:
    """A final answer (2xx or 304); ``attempts`` counts the requests it took."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    attempts: int = 1

    def json(self) -> Any:
        return json_loads(self.content)


Operation = Generator[Call | Sleep, Answer | None, T]


@dataclass
class Limits:
    """Most vectors and bytes per request (``NMBATCH_MAX_VECTORS``, ``NMBATCH_MAX_BODY_BYTES``).

    The defaults are the service's defaults; :meth:`learn` lowers them from a ``413``.
    """

    max_vectors: int = 100_000
    max_body_bytes: int = 64 * 1024 * 1024

    @classmethod
    def given(cls, max_vectors: int | None, max_body_bytes: int | None) -> Limits:
        """The service's defaults, but for the limits given (a client's parameters)."""
        limits = cls()
        if max_vectors is not None:
            limits.max_vectors = max_vectors
        if max_body_bytes is not None:
            limits.max_body_bytes = max_body_bytes
        return limits

    def rows_per_request(self, row_bytes: int, reserve: int = NPY_RESERVE) -> int:
        """Rows of ``row_bytes`` bytes each that fit in one request (at least 1) beside
        ``reserve`` bytes of headers."""
        by_bytes = (self.max_body_bytes - reserve) // max(1, row_bytes)
        return max(1, min(self.max_vectors, by_bytes))

    def learn(self, error: PayloadTooLargeError) -> bool:
        """Adopt the smaller limit a ``413`` names; False if it names none smaller."""
        limit = error.extensions.get("limit")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            return False
        if error.slug == "too-many-vectors" and limit < self.max_vectors:
            self.max_vectors = limit
            return True
        if error.slug == "body-too-large" and limit < self.max_body_bytes:
            self.max_body_bytes = limit
            return True
        return False


@dataclass
class CentroidsCache:
    """The last centroids seen, answered again when the service says ``304``."""

    latest: Centroids | None = None


# -- request bodies (nmbatch_client.bodies) -----------------------------------------------
def new_key(key: str | None) -> str:
    """The key prefix of a push: ``key`` checked, or a new random one."""
    if key is None:
        return uuid.uuid4().hex
    if not 1 <= len(key) <= MAX_KEY_PREFIX or not all("!" <= ch <= "~" for ch in key):
        raise ValueError(f"idempotency_key must be 1 to {MAX_KEY_PREFIX} visible ASCII characters")
    return key


def _chunked(
    A: np.ndarray,
    limits: Limits,
    path: str,
    encoding: Encoding,
    headers: Callable[[int, int], dict[str, str]] = lambda start, stop: {},
    on_answer: Callable[[int, int, Answer], None] = lambda start, stop, answer: None,
    weights: np.ndarray | None = None,
    ids: np.ndarray | None = None,
) -> Operation[list[Answer]]:
    """Send the rows of ``A`` to ``path`` in chunks; the answers, in row order.

    ``headers(start, stop)`` adds headers to the request of rows ``[start, stop)``;
    ``on_answer(start, stop, answer)`` sees each answer as it comes. A ``413`` naming a
    smaller limit is learnt and the chunk is split; any other error propagates. An empty
    ``A`` is sent as it is (the service says why it refuses it). ``weights`` ``(n,)``
    float64 and ``ids`` ``(n,)`` (:func:`~nmbatch_client.bodies.as_ids`): the rows'
    sample weights and ids, sent with them as ``.npz`` bodies (whatever ``encoding``).
    """
    n = A.shape[0]
    answers: list[Answer] = []
    start = 0
    npz = weights is not None or ids is not None
    size = row_bytes(A, weights, ids)
    reserve = NPZ_RESERVE if npz else NPY_RESERVE
    while start < n or (n == 0 and not answers):
        stop = min(n, start + limits.rows_per_request(size, reserve))
        if npz:
            body, content_type = encode_npz(
                A[start:stop],
                None if weights is None else weights[start:stop],
                None if ids is None else ids[start:stop],
            )
        else:
            body, content_type = encode(A[start:stop], encoding)
        try:
            answer = yield Call(
                "POST", path, {"content-type": content_type, **headers(start, stop)}, body
            )
        except PayloadTooLargeError as exc:
            if stop - start > 1 and limits.learn(exc):
                continue  # nothing was stored: the same rows again, in smaller chunks
            raise
        assert answer is not None
        answers.append(answer)
        on_answer(start, stop, answer)
        start = stop
    return answers


# -- operations ----------------------------------------------------------------------------
def push_operation(
    X: Any,
    limits: Limits,
    *,
    encoding: Encoding = "npy",
    idempotency_key: str | None = None,
    progress: Progress | None = None,
    columns: Columns = None,
    batch_rows: int = BATCH_ROWS,
    weights: Any = None,
    ids: Sequence[str | int] | np.ndarray | None = None,
) -> Operation[PushResult]:
    """``POST /samples`` of the rows of ``X``, chunk by chunk (with ``weights``, an
    array ``(n,)`` for an array ``X``: each row's sample weight, and ``ids``, ``n``
    strings or integers: each row's sample id; both sent as ``.npz`` with the rows).

    ``X``: an array ``(n, d)``, a file or an iterable of batches of rows
    (:mod:`nmbatch_client.sources`; ``columns`` and ``batch_rows`` are for files). Rows
    ``[start, stop)`` of the whole source (counted across its batches) carry
    ``Idempotency-Key: {prefix}:{start}-{stop}``: a retry (by the client, or by a caller
    repeating the push of the same source with the same ``idempotency_key``) is stored
    once. ``progress(rows_acknowledged, total)`` is called after every chunk; ``total``
    is None for an iterator, whose length is unknown. The result's ``ids`` are every
    row's id in row order, those sent or those the service assigned.
    """
    prefix = new_key(idempotency_key)
    streamed = is_source(X)
    if (weights is not None or ids is not None) and streamed:
        raise ValueError("weights and ids go with an array of rows, not a file or an iterator")
    if streamed:
        source = open_source(X, columns, batch_rows)
    elif columns is not None:
        raise ValueError("columns selects columns of a Parquet, Arrow or CSV file only")
    else:
        A = as_matrix(X)
        source = Batches(iter([A]), A.shape[0])
        if weights is not None:
            weights = as_weights(weights, A.shape[0])
        if ids is not None:
            ids = as_ids(ids, A.shape[0])
    tally = {"accepted": 0, "replayed": 0, "retries": 0, "requests": 0}
    collected: list[str] | None = []  # None once an answer carries no ids (an old replay)
    n_samples: int | None = None
    offset = 0  # rows of the source before the current batch

    def headers(start: int, stop: int) -> dict[str, str]:
        return {"idempotency-key": f"{prefix}:{offset + start}-{offset + stop}"}

    def on_answer(start: int, stop: int, answer: Answer) -> None:
        nonlocal n_samples, collected
        document = answer.json()
        answered = document.get("ids")
        if collected is not None and isinstance(answered, list) \
                and len(answered) == stop - start:  # fmt: skip
            collected.extend(str(i) for i in answered)
        else:
            collected = None
        tally["accepted"] += int(document["accepted"])
        tally["replayed"] += answer.headers.get("idempotent-replayed") == "true"
        tally["retries"] += answer.attempts - 1
        tally["requests"] += 1
        n_samples = int(document["n_samples"])
        if progress is not None:
            progress(tally["accepted"], source.total)

    for batch in source.arrays:
        A = as_matrix(batch)
        if streamed and A.shape[0] == 0:
            continue  # an empty batch of a stream (an array with no rows is sent: refused)
        yield from _chunked(A, limits, "/samples", encoding, headers, on_answer, weights, ids)
        offset += A.shape[0]
    return PushResult(
        tally["accepted"], n_samples, tally["requests"], tally["replayed"], tally["retries"],
        prefix, None if collected is None else tuple(collected),
    )  # fmt: skip


def assign_operation(
    X: Any, limits: Limits, *, encoding: Encoding = "npy"
) -> Operation[Assignment]:
    """``POST /assign`` of the rows of ``X`` ``(n, d)``, chunked like a push."""
    A = as_matrix(X)
    answers = yield from _chunked(A, limits, "/assign", encoding)
    documents = [answer.json() for answer in answers]
    labels = np.concatenate([np.asarray(d["clusters"], dtype=np.int64) for d in documents])
    distances = np.concatenate([np.asarray(d["distances"], dtype=np.float64) for d in documents])
    versions = [int(d["version"]) for d in documents]
    similarities = None
    if documents and all("similarities" in d for d in documents):  # a cosine model
        similarities = np.concatenate(
            [np.asarray(d["similarities"], dtype=np.float64) for d in documents]
        )
    return Assignment(labels, distances, versions[-1], tuple(sorted(set(versions))), similarities)


def centroids_operation(
    cache: CentroidsCache, retry: RetryPolicy | None = None
) -> Operation[Centroids]:
    """``GET /centroids``; the cached object when the service answers ``304``."""
    headers = {"accept": "application/json"}
    cached = cache.latest
    if cached is not None and cached.etag:
        headers["if-none-match"] = cached.etag
    answer = yield Call("GET", "/centroids", headers, retry=retry)
    assert answer is not None
    if answer.status == 304 and cached is not None:
        return cached
    latest = Centroids.from_document(answer.json(), answer.headers.get("etag"))
    cache.latest = latest
    return latest


def stats_operation() -> Operation[dict[str, Any]]:
    """``GET /stats``: the document as a dict."""
    answer = yield Call("GET", "/stats", {"accept": "application/json"})
    assert answer is not None
    return answer.json()


def sample_operation(sample_id: str | int) -> Operation[dict[str, Any]]:
    """``GET /samples/{id}``: where one sample stands (``cluster``, ``distance``,
    ``similarity`` under cosine, ``retained``, ``version``) as a dict."""
    path = "/samples/" + quote(str(sample_id), safe="")
    answer = yield Call("GET", path, {"accept": "application/json"})
    assert answer is not None
    return answer.json()


def delete_samples_operation(sample_ids: Sequence[str | int]) -> Operation[dict[str, Any]]:
    """``POST /samples/delete`` of ``sample_ids`` (1 to 10,000 distinct ids): the answer
    ``{"deleted": [...], "not_found": [...]}`` as a dict. A retry after a lost answer
    finds the ids deleted by the first attempt among ``not_found``."""
    body = json.dumps({"ids": list(sample_ids)}).encode()
    headers = {"content-type": "application/json", "accept": "application/json"}
    answer = yield Call("POST", "/samples/delete", headers, body)
    assert answer is not None
    return answer.json()


def versions_operation() -> Operation[dict[str, Any]]:
    """``GET /versions``: the kept versions (with their ``identities``) as a dict."""
    answer = yield Call("GET", "/versions", {"accept": "application/json"})
    assert answer is not None
    return answer.json()


def wait_operation(
    cache: CentroidsCache,
    *,
    version: int | None = None,
    converged: bool = True,
    min_samples: int | None = None,
    timeout: float = 60.0,
    interval: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
) -> Operation[Centroids]:
    """Poll ``GET /centroids`` until the centroids meet every condition given.

    Conditions: ``version`` or later, ``converged`` (when True), at least ``min_samples``
    samples. No centroids yet, a ``503`` and no answer at all count as "not yet". Raises
    :class:`WaitTimeoutError` after ``timeout`` seconds.
    """
    deadline = clock() + timeout
    last: Centroids | None = None
    why = "no centroids yet"
    while True:
        try:
            latest = yield from centroids_operation(cache, RetryPolicy.never())
        except (NotEnoughSamplesError, UnavailableError, ConnectionFailedError) as exc:
            why = str(exc)
        else:
            last = latest
            missing = []
            if version is not None and latest.version < version:
                missing.append(f"version {latest.version} < {version}")
            if converged and not latest.converged:
                missing.append("not converged")
            if min_samples is not None and latest.n_samples < min_samples:
                missing.append(f"n_samples {latest.n_samples} < {min_samples}")
            if not missing:
                return latest
            why = ", ".join(missing)
        remaining = deadline - clock()
        if remaining <= 0:
            raise WaitTimeoutError(f"gave up after {timeout:g} s: {why}", last)
        yield Sleep(min(interval, remaining))
