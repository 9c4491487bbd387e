"""The asynchronous client: :class:`AsyncClient` over ``httpx.AsyncClient``.

The same operations (:mod:`nmbatch_client.operations`), retries and errors as
:class:`~nmbatch_client._sync.Client`; only the driver awaits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
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

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """An asyncio client of one model of an nmbatch service (its default model, or the
    named ``model``); parameters as for :class:`Client`.

    Example
    -------
    >>> async with AsyncClient("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     await client.push(X)
    ...     model = await client.wait_for(converged=True, min_samples=len(X))
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
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            headers=client_headers(api_key),
            **http_options,
        )

    # -- the API (documented on Client) ----------------------------------------------------
    async def push(
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
        """Store the rows of ``X`` ``(n, d)``, chunked, every chunk stored once
        (see :meth:`Client.push`)."""
        return await self._run(
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

    async def centroids(self) -> Centroids:
        """The current centroids (the same object while unchanged: ``304``)."""
        return await self._run(centroids_operation(self._cache))

    async def assign(self, X: Any, *, encoding: Encoding = "npy") -> Assignment:
        """Nearest centroid and distance of each row of ``X`` ``(n, d)``."""
        return await self._run(assign_operation(X, self.limits, encoding=encoding))

    async def stats(self) -> dict[str, Any]:
        """``GET /stats`` as a dict."""
        return await self._run(stats_operation())

    async def sample(self, sample_id: str | int) -> dict[str, Any]:
        """``GET /samples/{id}``: where one sample stands (see :meth:`Client.sample`)."""
        return await self._run(sample_operation(sample_id))

    async def delete_samples(self, sample_ids: Sequence[str | int]) -> dict[str, Any]:
        """Delete samples by id, exactly (see :meth:`Client.delete_samples`)."""
        return await self._run(delete_samples_operation(sample_ids))

    async def versions(self) -> dict[str, Any]:
        """``GET /versions``: the kept versions and the pin (see :meth:`Client.versions`)."""
        return await self._run(versions_operation())

    async def wait_for(
        self,
        *,
        version: int | None = None,
        converged: bool = True,
        min_samples: int | None = None,
        timeout: float = 60.0,
        interval: float = 0.2,
    ) -> Centroids:
        """Poll until the centroids meet the conditions (see :meth:`Client.wait_for`)."""
        return await self._run(
            wait_operation(
                self._cache,
                version=version,
                converged=converged,
                min_samples=min_samples,
                timeout=timeout,
                interval=interval,
            )
        )

    async def events(
        self, *, last_event_id: str | None = None, reconnect: bool = True
    ) -> AsyncIterator[Event]:
        """The model's events as they happen, forever, reconnecting after the last one
        seen (see :meth:`Client.events`)."""
        stream = EventStream(self._prefix, last_event_id, reconnect, self._http.timeout.connect)
        while (wait := stream.wait()) is not None:
            if wait:
                await asyncio.sleep(wait)
            try:
                request = self._http.stream(
                    "GET", stream.path, headers=stream.attempt(), timeout=stream.timeout
                )
                async with request as response:
                    answer = stream.answer(response)
                    if answer == "refused":
                        await response.aread()
                        stream.refuse(response)  # raises the typed error
                    elif answer == "events":
                        async for line in response.aiter_lines():
                            event = stream.line(line)
                            if event is not None:
                                yield event
            except RETRIED_ERRORS as exc:
                stream.failed(exc)  # raises unless reconnecting

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the driver ------------------------------------------------------------------------
    async def _run(self, operation: Operation[T]) -> T:
        answer: Answer | None = None
        error: Exception | None = None
        while True:
            try:
                step = operation.throw(error) if error is not None else operation.send(answer)
            except StopIteration as done:
                return done.value
            answer, error = None, None
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                continue
            try:
                # The model's routes: "/models/{name}/samples" for a named model.
                answer = await self._send(replace(step, path=self._prefix + step.path))
            except NmbatchError as exc:  # into the operation, which may handle it
                error = exc

    async def _send(self, call: Call) -> Answer:
        retrying = (call.retry or self.retry).retrying(asynchronous=True)
        try:
            response = await retrying(
                self._http.request, call.method, call.path, headers=call.headers,
                content=call.content,
            )  # fmt: skip
        except httpx.HTTPError as exc:  # no answer, or not worth retrying (a bad URL, say)
            raise no_answer(call, exc, retrying.statistics["attempt_number"]) from exc
        return final_answer(response, retrying.statistics["attempt_number"])
