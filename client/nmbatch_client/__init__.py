"""A Python client of the nmbatch service: :class:`Client` and :class:`AsyncClient`.

``from nmbatch import Client, AsyncClient`` (or ``from nmbatch_client import
...``; ``from service.client import ...`` from a checkout gives the same classes)::

    with Client("http://127.0.0.1:8000", api_key=None) as client:
        client.push(X)                       # (n, d) array, chunked, each chunk stored once
        model = client.wait_for(converged=True, min_samples=len(X))
        model.centroids, model.counts, model.version
        labels = client.assign(X).labels
        client.stats()["energy"]

    Client("http://127.0.0.1:8000", model="tenant-a")  # the routes /models/tenant-a/...

Modules: :mod:`~nmbatch_client.operations` (the requests of each call, without I/O),
:mod:`~nmbatch_client.sources` (what ``push`` reads: arrays, files, iterators),
``_sync``/``_async`` (the two drivers), :mod:`~nmbatch_client.retry` (backoff),
:mod:`~nmbatch_client.errors` (typed problem exceptions), :mod:`~nmbatch_client.results`
(returned objects), :mod:`~nmbatch_client.cli` (``nmbatch push`` and ``nmbatch watch``).

The names are imported on first use, so that ``nmbatch --help`` (which reads the
argument parsers of :mod:`~nmbatch_client.cli`) loads neither httpx nor numpy.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = [
    "Assignment",
    "AsyncClient",
    "BadRequestError",
    "Centroids",
    "Client",
    "ConflictError",
    "ConnectionFailedError",
    "Event",
    "IdempotencyKeyReusedError",
    "InvalidVectorsError",
    "NmbatchError",
    "NotEnoughSamplesError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ProblemError",
    "PushResult",
    "RetryPolicy",
    "ServerError",
    "StoreFullError",
    "UnauthorizedError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
    "WaitTimeoutError",
    "WrongDimensionError",
    "follow_cluster",
]

_WHERE = {
    "Client": "_sync",
    "AsyncClient": "_async",
    "Assignment": "results",
    "Centroids": "results",
    "Event": "events",
    "PushResult": "results",
    "follow_cluster": "results",
    "RetryPolicy": "retry",
    "BadRequestError": "errors",
    "ConflictError": "errors",
    "ConnectionFailedError": "errors",
    "IdempotencyKeyReusedError": "errors",
    "InvalidVectorsError": "errors",
    "NmbatchError": "errors",
    "NotEnoughSamplesError": "errors",
    "NotFoundError": "errors",
    "PayloadTooLargeError": "errors",
    "ProblemError": "errors",
    "ServerError": "errors",
    "StoreFullError": "errors",
    "UnauthorizedError": "errors",
    "UnavailableError": "errors",
    "UnsupportedMediaTypeError": "errors",
    "WaitTimeoutError": "errors",
    "WrongDimensionError": "errors",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"nmbatch_client.{module}"), name)
