"""nmbatch: a streaming clustering service on Nested Mini-Batch K-Means.

Two packages live under this namespace: :mod:`nmbatch.engine` (the algorithm, no HTTP,
no Redis) and :mod:`nmbatch.service` (the HTTP service around it). The estimator is
importable from the top::

    from nmbatch import NestedMiniBatchKMeans

``python -m nmbatch`` runs the service.
"""

from __future__ import annotations

__all__ = ["NestedMiniBatchKMeans"]


def __getattr__(name: str):
    # Imported on first use: `import nmbatch` alone stays cheap.
    if name == "NestedMiniBatchKMeans":
        from nmbatch.engine.estimator import NestedMiniBatchKMeans

        return NestedMiniBatchKMeans
    raise AttributeError(f"module 'nmbatch' has no attribute {name!r}")
