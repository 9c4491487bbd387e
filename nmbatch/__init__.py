"""nmbatch: a streaming clustering service on Nested Mini-Batch K-Means.

Two packages live under this namespace: :mod:`nmbatch.engine` (the algorithm, no HTTP,
no Redis) and :mod:`nmbatch.service` (the HTTP service around it). The estimator is
importable from the top::

    from nmbatch import NestedMiniBatchKMeans, RayBackend

and so is the client of a running service (:mod:`nmbatch_client`, the ``nmbatch-client``
distribution, which this one ships too)::

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
        import nmbatch_client

        return getattr(nmbatch_client, name)
    raise AttributeError(f"module 'nmbatch' has no attribute {name!r}")
