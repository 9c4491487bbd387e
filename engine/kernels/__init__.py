"""Numba kernels of the engine, one module per job (as scikit-learn splits its k-means).

- ``common``: float32/float64 distances and their error bounds, safe rounding of bounds,
  the prefetch intrinsic, and the inline helpers the kernels share (a vote move, a
  candidate list, BLAS distance estimates, the listing of open rows);
- ``bounded``: the bounded revisit of rows already in the batch (bound sweep, exact
  distance to the assigned centroid, reassignment of the rows left open);
- ``grouped``: the same revisit with one lower bound per group of centroids (Yinyang's
  group and local filters; Hamerly's single bound is one group), its reassignment in
  ``grouped_reassign`` and its dense pass in ``grouped_dense``;
- ``dense``: assignment from a BLAS product of all distances (new rows, dense revisits,
  the baselines);
- ``update``: the centroid update and ``sse`` from the per-cluster sums;
- ``lookup``: the exact nearest centroid of arbitrary samples (``engine.assign``);
- ``retire``: exact forgetting (votes of retired samples taken back, the store's
  compaction).

Symbols (as in the paper, Newling & Fleuret 2016, Alg. ``nmbatch``):

- ``X``      samples, ``(n, d)`` float32
- ``C``      centroids ``c(j)``, ``(k, d)`` float32
- ``S``      per-cluster sum of assigned samples, ``(k, d)`` float64
- ``v``      per-cluster count of assigned samples, ``(k,)`` int64
- ``sse``    per-cluster sum of ``d(i)^2``, ``(k,)`` float64
- ``Q``      per-cluster sum of ``||x(i)||^2``, ``(k,)`` float64
- ``labels`` assignment ``a(i)``, int32 (``-1``: not assigned yet)
- ``dist2``  ``d(i)^2``, the squared distance added to ``sse`` when ``i`` was assigned, float64
- ``lower``  lower bounds ``l(i, j) <= ||x(i) - c(j)||``, ``(n, k)`` float32 (grouped:
  ``l(i, g) <= min_{j in g, j != a(i)} ||x(i) - c(j)||``, ``(n, G)`` float32)
- ``upper``  upper bounds ``u(i) >= ||x(i) - c(a(i))||``, ``(n,)`` float64
- ``p``      distance each centroid moved at the last update, ``(k,)`` float64

The kernels with flags or optional arrays are called through keyword-only Python wrappers
(``assign_dense``, ``reassign_rows``, ``centroid_update``) that fill in the compiled
kernel's positional arguments (an absent array becomes an empty one the kernel skips).
"""

from nmbatch.engine.kernels.bounded import bound_sweep, reassign_rows, settle_assigned
from nmbatch.engine.kernels.common import (
    UNIT_ROUNDOFF32,
    gemm_error,
    sqdist32,
    sqdist32_error,
    sqdist64,
    sqdist_safe,
    sqnorms32,
)
from nmbatch.engine.kernels.dense import assign_dense
from nmbatch.engine.kernels.lookup import nearest_dense, nearest_direct
from nmbatch.engine.kernels.retire import remove_votes
from nmbatch.engine.kernels.update import centroid_update

__all__ = [
    "UNIT_ROUNDOFF32",
    "assign_dense",
    "bound_sweep",
    "centroid_update",
    "gemm_error",
    "nearest_dense",
    "nearest_direct",
    "reassign_rows",
    "remove_votes",
    "settle_assigned",
    "sqdist32",
    "sqdist32_error",
    "sqdist64",
    "sqdist_safe",
    "sqnorms32",
]
