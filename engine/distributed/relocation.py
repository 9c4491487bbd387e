"""The relocation of empty clusters on the Ray backend: one round's farthest-point search
over the shards (the coordinator's part; each shard's is
:meth:`~.shard.ShardState.relocation_begin`, ``relocation_take``, ``relocation_next``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from nmbatch.engine.kernels.update import centroid_of

__all__ = ["relocate_on_shards"]

_SAFETY = 1.0 + 1e-9  # p rounded up, as the centroid update rounds it


def relocate_on_shards(coord: Any, C_prev: np.ndarray) -> int:
    """Empty clusters of ``coord`` (a :class:`~.coordinator.Coordinator` after its
    centroid update; ``C_prev`` ``(k, d)`` float32 the centroids before it) take the
    farthest samples of the prefix, as
    :func:`~nmbatch.engine.algorithms.relocation.relocate_empty` with farthest-point
    order (ties: lowest priority); each shard proposes its farthest row. A sample's
    whole vote moves (``w x``, ``w``, ``w ||x||^2``; unweighted ``w = 1``), in the
    shard's ledger, its copy and the sums; a changed cluster's centroid comes from its
    sums by :func:`~nmbatch.engine.kernels.update.centroid_of` (its mean, or under
    ``metric="cosine"`` its sum's direction: the relocated sample itself, a unit row).
    Returns how many clusters got a sample."""
    coord.relocated_ids = []
    empty = np.flatnonzero(coord.v == 0)
    if not empty.shape[0] or not coord.batch_size:
        return 0
    C_ref = ray.put(coord.centroids)
    best = coord.call_all("relocation_begin", C_ref, coord.v)
    moved, changed = 0, set()
    while moved < empty.shape[0]:
        offers = [(-o[0], o[1], s, o[2]) for s, o in enumerate(best) if o is not None]
        if not offers:
            break
        _, _, s, row = min(offers)
        j = int(empty[moved])
        taken = coord._gather([coord.shards[s].relocation_take.remote(row, j, C_prev)])[0]
        if taken is None:  # the shard was lost: its offer is gone
            best[s] = None
            continue
        a, x, xx, sample_id, w = taken
        coord.relocated_ids.append(sample_id)
        vote = 1 if coord.v.dtype == np.int64 else w
        for sums in (coord.ledgers[s], [coord.S, coord.v, coord.Q]):
            sums[0][a] -= w * x
            sums[1][a] -= vote
            sums[2][a] -= w * xx
            sums[0][j] += w * x
            sums[1][j] += vote
            sums[2][j] += w * xx
        changed |= {a, j}
        moved += 1
        best = coord.call_all("relocation_next", x, coord.v)
    for c in sorted(changed):
        centroid_of(coord.S, coord.v, c, coord._unit, coord.centroids[c])  # v(c) = 0: kept
        step = coord.centroids[c].astype(np.float64) - C_prev[c].astype(np.float64)
        coord.p[c] = float(np.sqrt(step @ step)) * _SAFETY
        old = C_prev[c].astype(np.float64)
        coord.sse[c] = max(coord.Q[c] - 2.0 * (old @ coord.S[c]) + coord.v[c] * (old @ old), 0.0)
    return moved
