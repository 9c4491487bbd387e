"""Hosting a streaming model, and the one driver of its loop.

- :mod:`.protocol`: :class:`EngineHost`, the interface every host gives its driver,
  and :class:`EngineConfig`, what builds a hosted model;
- :mod:`.driver`: the streaming loop (admit, feed, step, publish), used by
  ``NestedMiniBatchKMeans.partial_fit`` and the service's worker;
- :mod:`.local`: :class:`LocalEngine`, the model in the calling thread;
- :mod:`.child`: :class:`EngineProcess`, the model in a child process
  (:mod:`.heap`: its heap trimmed after steps);
- :mod:`.ray`: :class:`~.ray.RayEngine`, the model on a Ray cluster
  (``nmbatch[ray]``; not imported here, so this package imports no Ray).
"""

from nmbatch.engine.hosting.child import EngineProcess, EngineProcessError, lower_priority
from nmbatch.engine.hosting.driver import (
    Publish,
    admit,
    carry_out,
    feed,
    iterate,
    offer,
    retire_then_append,
    settled,
)
from nmbatch.engine.hosting.local import LocalEngine
from nmbatch.engine.hosting.protocol import NO_IDS, EngineConfig, EngineHost, StoreView

__all__ = [
    "NO_IDS",
    "EngineConfig",
    "EngineHost",
    "EngineProcess",
    "EngineProcessError",
    "LocalEngine",
    "Publish",
    "StoreView",
    "admit",
    "carry_out",
    "feed",
    "iterate",
    "lower_priority",
    "offer",
    "retire_then_append",
    "settled",
]
