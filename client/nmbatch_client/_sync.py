"""The synchronous client: :class:`Client` over ``httpx.Client``.

It drives the operations of :mod:`nmbatch_client.operations`: each :class:`Call` is sent
with the API key, retried under the :class:`RetryPolicy` (no answer, ``429``/``502``/
``503``/``504``, ``Retry-After``), and its final answer is handed back, or the typed
error of an error answer is thrown into the operation. :class:`AsyncClient` (``_async.py``)
is the same on ``httpx.AsyncClient``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import httpx

from nmbatch_client.errors import NmbatchError
from nmbatch_client.events import Event, EventStream
from nmbatch_client.operations import (
    Answer,
    Call,
    CentroidsCache,
    Encoding,
    Limits,
    Operation,
    Progress,
    Sleep,
    assign_operation,
    centroids_operation,
    delete_samples_operation,
    push_operation,
    sample_operation,
    stats_operation,
    versions_operation,
    wait_operation,
)
from nmbatch_client.results import Assignment, Centroids, PushResult
from nmbatch_client.retry import RETRIED_ERRORS, RetryPolicy
from nmbatch_client.session import (
    DEFAULT_TIMEOUT,
    client_headers,
    final_answer,
    model_prefix,
    no_answer,
)
from nmbatch_client.sources import BATCH_ROWS

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """A client of one model of an nmbatch service: its default model, or a named one.

    Parameters
    ----------
    base_url : str
        The service's address, e.g. ``http://127.0.0.1:8000``; a path prefix is kept
        (``http://host/nmbatch`` behind a proxy).
    api_key : str or None
        Sent as ``Authorization: Bearer <key>`` (``NMBATCH_API_KEY`` of the service).
    model : str or None
        None: the service's default model (``/samples``, ``/centroids``, ``/assign``,
        ``/stats``). A name: that named model's routes (``/models/{model}/samples`` ...;
        create it first with ``PUT /models/{model}``, else every call raises
        :class:`NotFoundError`). ValueError if it is not a model name (1 to 64 letters,
        digits, ``_``, ``.``, ``-``, starting with a letter or digit).
    retry : RetryPolicy
        Retries of every request (see :mod:`nmbatch_client.retry`).
    timeout : float
        Seconds for each request's connect, read and write (httpx's timeout).
    max_vectors, max_body_bytes : int
        The service's ``NMBATCH_MAX_VECTORS`` and ``NMBATCH_MAX_BODY_BYTES`` (default:
        the service's defaults); smaller limits a ``413`` names are learnt on the way.
    **http_options
        Passed to ``httpx.Client`` (``transport``, ``verify``, ``event_hooks`` ...).

    Example
    -------
    >>> with Client("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     client.push(X)
    ...     model = client.wait_for(converged=True, min_samples=len(X))
    ...     labels = client.assign(X).labels
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        model: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_vectors: int | None = None,
        max_body_bytes: int | None = None,
        **http_options: Any,
    ) -> None:
        self.model = model
        self._prefix = model_prefix(model)
        self.retry = retry or RetryPolicy()
        self.limits = Limits.given(max_vectors, max_body_bytes)
        self._cache = CentroidsCache()
        self._http = httpx.Client(
            base_url=base_url,
            timeout=timeout,
            headers=client_headers(api_key),
            **http_options,
        )

    # -- the API ---------------------------------------------------------------------------
    def push(
        self,
        X: Any,
        *,
        encoding: Encoding = "npy",
        idempotency_key: str | None = None,
        progress: Progress | None = None,
        columns: str | Sequence[str] | None = None,
        batch_rows: int = BATCH_ROWS,
        weights: Any = None,
        ids: Sequence[str | int] | None = None,
    ) -> PushResult:
        """Store the rows of ``X`` (``(n, d)``, real numbers, sent as float32).

        ``X`` may also be a file (a path: ``.npy``, ``.csv``/``.tsv``/``.txt``,
        ``.parquet``, ``.arrow``/``.feather``; ``columns`` names the column of vectors
        or the numeric columns to take) or any iterable of arrays ``(m, d)`` (a
        generator ...), read ``batch_rows`` rows at a time (:mod:`nmbatch_client.sources`).

        Sent in chunks within the service's limits, each with its own
        ``Idempotency-Key`` (``"{idempotency_key}:{start}-{stop}"``; a random prefix when
        None), so retries store every vector once; repeat a push that raised with the
        same ``idempotency_key`` to complete it without duplicates. ``encoding`` ``raw``
        sends bare float32 (the model's dimension must be known). ``weights`` (an array
        ``(n,)`` for an array ``X``): each row's sample weight (finite, ``>= 0``; a weight
        of ``w`` counts as ``w`` copies of the row), and ``ids`` (``n`` strings or
        integers, for an array ``X``): each row's sample id (distinct, unique in the
        model: :class:`ConflictError` ``duplicate-sample-id`` otherwise), sent with the
        rows as ``application/x-npz`` bodies whatever ``encoding``. The result's ``ids``
        are the rows' ids, those sent or else those the service assigned, which
        :meth:`sample` and :meth:`delete_samples` take. ``progress(done, total)``
        is called after each chunk (``total`` None for an iterator). Raises a
        :class:`ProblemError` subclass when refused (:class:`WrongDimensionError`,
        :class:`StoreFullError` ...), the chunks before it stored, and
        :class:`~nmbatch_client.sources.SourceError` for a file that cannot be read.
        """
        return self._run(
            push_operation(
                X,
                self.limits,
                encoding=encoding,
                idempotency_key=idempotency_key,
                progress=progress,
                columns=columns,
                batch_rows=batch_rows,
                weights=weights,
                ids=ids,
            )
        )

    def centroids(self) -> Centroids:
        """The current centroids; the same object again while the version is unchanged
        (the request carries ``If-None-Match`` and the service answers ``304``)."""
        return self._run(centroids_operation(self._cache))

    def assign(self, X: Any, *, encoding: Encoding = "npy") -> Assignment:
        """Nearest centroid and distance of each row of ``X`` ``(n, d)`` (nothing stored)."""
        return self._run(assign_operation(X, self.limits, encoding=encoding))

    def stats(self) -> dict[str, Any]:
        """``GET /stats``: phase, version, ``b``, ``N``, energy, doublings, memory ..."""
        return self._run(stats_operation())

    def sample(self, sample_id: str | int) -> dict[str, Any]:
        """``GET /samples/{id}``: the sample's ``cluster`` now, its ``distance`` (and
        ``similarity`` under cosine), ``retained``, ``version``. :class:`NotFoundError`
        for an id the model does not hold (never stored, deleted, retired)."""
        return self._run(sample_operation(sample_id))

    def delete_samples(self, sample_ids: Sequence[str | int]) -> dict[str, Any]:
        """Delete samples by id, exactly (``POST /samples/delete``, 1 to 10,000 distinct
        ids): ``{"deleted": [...], "not_found": [...]}``."""
        return self._run(delete_samples_operation(sample_ids))

    def versions(self) -> dict[str, Any]:
        """``GET /versions``: the kept versions, oldest first, each with its
        ``identities`` (how its clusters relate to the version before it; follow one
        cluster with :func:`~nmbatch_client.results.follow_cluster`), the pin, the bound."""
        return self._run(versions_operation())

    def wait_for(
        self,
        *,
        version: int | None = None,
        converged: bool = True,
        min_samples: int | None = None,
        timeout: float = 60.0,
        interval: float = 0.2,
    ) -> Centroids:
        """Poll until the centroids reach ``version`` (or later), are ``converged`` (when
        True) and hold ``min_samples`` samples; returns them. Raises
        :class:`WaitTimeoutError` after ``timeout`` seconds."""
        return self._run(
            wait_operation(
                self._cache,
                version=version,
                converged=converged,
                min_samples=min_samples,
                timeout=timeout,
                interval=interval,
            )
        )

    def events(
        self, *, last_event_id: str | None = None, reconnect: bool = True
    ) -> Iterator[Event]:
        """The model's events (``GET /events``: new versions, doublings, relocations,
        retention steps, drift alarms) as they happen, forever (break out of the loop).

        ``last_event_id``: resume after that event (the events since are replayed, as
        many as the service keeps); None: from the next one. With ``reconnect`` a dropped
        connection or a "later" answer (``429``, ``502``, ``503``, ``504``) is retried
        with the last id seen, after a wait doubling from 0.5 s to 30 s; without, it
        raises (:class:`ConnectionFailedError`, :class:`UnavailableError`). A refusal
        raises its typed error: :class:`NotFoundError` for an unknown model, or a service
        without events (before they existed).
        """
        stream = EventStream(self._prefix, last_event_id, reconnect, self._http.timeout.connect)
        while (wait := stream.wait()) is not None:
            if wait:
                time.sleep(wait)
            try:
                request = self._http.stream(
                    "GET", stream.path, headers=stream.attempt(), timeout=stream.timeout
                )
                with request as response:
                    answer = stream.answer(response)
                    if answer == "refused":
                        response.read()
                        stream.refuse(response)  # raises the typed error
                    elif answer == "events":
                        for line in response.iter_lines():
                            event = stream.line(line)
                            if event is not None:
                                yield event
            except RETRIED_ERRORS as exc:
                stream.failed(exc)  # raises unless reconnecting

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the driver ------------------------------------------------------------------------
    def _run(self, operation: Operation[T]) -> T:
        answer: Answer | None = None
        error: Exception | None = None
        while True:
            try:
                step = operation.throw(error) if error is not None else operation.send(answer)
            except StopIteration as done:
                return done.value
            answer, error = None, None
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                continue
            try:
                # The model's routes: "/models/{name}/samples" for a named model.
                answer = self._send(replace(step, path=self._prefix + step.path))
            except NmbatchError as exc:  # into the operation, which may handle it
                error = exc

    def _send(self, call: Call) -> Answer:
        retrying = (call.retry or self.retry).retrying()
        try:
            response = retrying(
                self._http.request, call.method, call.path, headers=call.headers,
                content=call.content,
            )  # fmt: skip
        except httpx.HTTPError as exc:  # no answer, or not worth retrying (a bad URL, say)
            raise no_answer(call, exc, retrying.statistics["attempt_number"]) from exc
        return final_answer(response, retrying.statistics["attempt_number"])
