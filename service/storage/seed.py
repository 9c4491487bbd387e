"""The centroids a model was seeded with (``nmbatch:{model}:seed``), kept for its restarts.

A model created with initial centroids (``PUT /models/{name}`` with ``init``, or the
default model's ``NMBATCH_INIT_FILE``) keeps them in one hash next to its spec:
``k``, ``dim`` and ``x``, the ``(k, dim)`` centroids as raw little-endian ``float32``
bytes (``4 k dim`` bytes, counted in the model's memory where its spec is,
:func:`~nmbatch.service.models.registry.required_bytes`). Until the model's first
snapshot a restart seeds it the same way; a re-clustering (another ``k``) deletes it in
the script that changes ``k`` (:mod:`nmbatch.service.models.registry`); deleting the
model deletes it with every other key of the model.
"""

from __future__ import annotations

import numpy as np

__all__ = ["decode_seed", "encode_seed", "seed_bytes"]


def seed_bytes(k: int, dim: int) -> int:
    """Bytes of the seed's centroids: ``4 k dim``."""
    return 4 * int(k) * int(dim)


def encode_seed(centroids: np.ndarray) -> dict[str, bytes | int]:
    """The hash fields of ``centroids`` ``(k, d)`` float32."""
    C = np.ascontiguousarray(centroids, dtype="<f4")
    return {"k": C.shape[0], "dim": C.shape[1], "x": C.tobytes()}


def decode_seed(fields: dict[bytes, bytes]) -> np.ndarray | None:
    """The ``(k, d)`` float32 centroids of a seed hash (a new, writable array); None if
    ``fields`` is empty or not a whole seed."""
    try:
        k, dim, raw = int(fields[b"k"]), int(fields[b"dim"]), fields[b"x"]
    except (KeyError, ValueError):
        return None
    if len(raw) != seed_bytes(k, dim):
        return None
    return np.frombuffer(raw, dtype="<f4").reshape(k, dim).astype(np.float32)
