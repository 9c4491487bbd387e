"""Where ``NestedMiniBatchKMeans.fit`` runs: the ``backend`` parameter's values.

``backend="local"`` (or None) fits in this process. ``RayBackend(...)`` (or the string
``"ray"``, meaning ``RayBackend()``) fits on Ray actors (``nmbatch.engine.distributed``,
the ``nmbatch[ray]`` extra); every setting of the Ray fit lives in that one object.
Importing this module does not import Ray.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

__all__ = ["BACKEND_NAMES", "RayBackend", "ray_backend"]

#: The backends named by a string; ``"ray"`` is ``RayBackend()``.
BACKEND_NAMES = ("local", "ray")


@dataclass(frozen=True)
class RayBackend:
    """The Ray backend of ``NestedMiniBatchKMeans``: ``backend=RayBackend(n_shards=4)``.

    Parameters
    ----------
    address : str or None, default=None
        Ray cluster address (``"auto"``, ``"host:6379"``); None: the Ray already
        initialised in this process, else a local Ray started for the fit and stopped
        after.
    n_shards : int, default=2
        Shard actors ``P``: sample ``i`` goes to shard ``i mod P``.

    Raises ``ValueError`` for an ``address`` that is not None or a str, or ``n_shards``
    that is not an int >= 1.
    """

    address: str | None = None
    n_shards: int = 2

    def __post_init__(self) -> None:
        if self.address is not None and not isinstance(self.address, str):
            raise ValueError(f"address must be None or a str, got {self.address!r}")
        shards = self.n_shards
        if not isinstance(shards, numbers.Integral) or isinstance(shards, bool) or shards < 1:
            raise ValueError(f"n_shards must be an int >= 1, got {shards!r}")


def ray_backend(backend: object) -> RayBackend | None:
    """The ``RayBackend`` a ``backend`` parameter value means, or None for the local one.

    ``backend`` is ``"local"``, None, ``"ray"`` or a ``RayBackend`` (the estimator's
    parameter constraints have checked it).
    """
    if isinstance(backend, RayBackend):
        return backend
    return RayBackend() if backend == "ray" else None
