"""nmbatch: a streaming clustering service on Nested Mini-Batch K-Means.

Two packages live under this namespace: :mod:`nmbatch.engine` (the algorithm, no HTTP,
no Redis) and :mod:`nmbatch.service` (the HTTP service around it). The estimator is
importable from the top::

    from nmbatch import NestedMiniBatchKMeans, RayBackend

and so is the client of a running service (:mod:`nmbatch.service.client`)::

    from nmbatch import Client, AsyncClient

``python -m nmbatch`` runs the service.
"""

from __future__ import annotations

__all__ = ["AsyncClient", "Client", "NestedMiniBatchKMeans", "RayBackend"]


def __getattr__(name: str):
    # Imported on first use: `import nmbatch` alone stays cheap.
    if name == "NestedMiniBatchKMeans":
        from nmbatch.engine.estimator import NestedMiniBatchKMeans

        return NestedMiniBatchKMeans
    if name == "RayBackend":
        from nmbatch.engine.backend import RayBackend

        return RayBackend
    if name in ("Client", "AsyncClient"):
        from nmbatch.service import client

        return getattr(client, name)
    raise AttributeError(f"module 'nmbatch' has no attribute {name!r}")
