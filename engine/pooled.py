"""The dense pass chunk by chunk on the BLAS pool: each chunk's product, then its rows'
assignment, on the same thread (a Lloyd iteration's blocking: a block's distances and
their argmin together).

The other parallel dense pass (:mod:`.kernels.dense`, :mod:`.kernels.grouped_dense`)
takes the products of several chunks on the pool of Python threads
(:func:`~nmbatch.engine.products.products`), then hands them to numba's OpenMP threads
for the assignment kernel: one hand-over per buffer of chunks, each thread waiting at both
joins, the products written to memory and read back (``4 k`` bytes a row), and the pool's
threads and OpenMP's contending for the cores when the other is spinning. Here a chunk is
one task on the pool: its single-thread BLAS product into the thread's own buffer (still
in cache when read), then the single-thread kernel over its rows (numba's ``nogil``
kernels run in parallel from Python threads), its votes left in ``prev``/``old_d2``.
:func:`~nmbatch.engine.kernels.parallel.apply_moves` then casts every vote in row order.

Results are those of the other paths bit for bit: a chunk's products are the same
numbers (the same rows, the same single-thread BLAS call), each row's label, distance and
bounds depend on the row and the centroids only (the same compiled function per row), and
the votes are added in row order as on one thread.
"""

from __future__ import annotations

import threading

import numpy as np

from nmbatch.engine.kernels import dense as _dense
from nmbatch.engine.kernels import grouped_dense as _grouped
from nmbatch.engine.kernels.common import EMPTY_F64, gemm_error, sqdist32_error
from nmbatch.engine.kernels.parallel import apply_moves, big_enough, n_threads
from nmbatch.engine.products import MIN_POOL_WORK, PRODUCT_ROWS, chunk_product, pool
from nmbatch.engine.projection import Projection

__all__ = ["pooled_assign", "use_pool"]

_NO_S = np.empty((0, 0), dtype=np.float64)
_NO_V = np.empty(0, dtype=np.int64)
_local = threading.local()  # each pool thread's product buffer


def use_pool(m: int, k: int, d: int) -> bool:
    """Whether a dense pass of ``m`` rows takes :func:`pooled_assign`: more than one
    thread, more than one chunk, and chunks worth a pool thread (``PRODUCT_ROWS d k`` at
    least :data:`~nmbatch.engine.products.MIN_POOL_WORK` multiply-adds; any size inside
    :func:`~nmbatch.engine.kernels.parallel.every_parallel_path`)."""
    return (n_threads() > 1 and m > PRODUCT_ROWS
            and big_enough(PRODUCT_ROWS * d * k, MIN_POOL_WORK))  # fmt: skip


def _buffer(k: int) -> np.ndarray:
    """This thread's ``(PRODUCT_ROWS, k)`` float32 buffer (made once per thread and k)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape[1] != k:
        buf = _local.buf = np.empty((PRODUCT_ROWS, k), dtype=np.float32)
    return buf


def pooled_assign(
    X: np.ndarray,
    rows: np.ndarray,
    C: np.ndarray,
    Ct: np.ndarray,
    cc: np.ndarray,
    *,
    labels: np.ndarray,
    dist2: np.ndarray,
    S: np.ndarray,
    v: np.ndarray,
    sse: np.ndarray,
    Q: np.ndarray,
    remove: bool,
    sqnorms: np.ndarray | None = None,
    sqnorms_known: bool = False,
    lower_bounds: np.ndarray | None = None,
    upper_bounds: np.ndarray | None = None,
    group_of: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    subspace: tuple[Projection, np.ndarray, np.ndarray] | None = None,
) -> int:
    """:func:`~nmbatch.engine.kernels.dense.assign_dense` (``group_of`` None) or
    :func:`~nmbatch.engine.kernels.grouped_dense.assign_dense_grouped` of ``rows``,
    computing each chunk's products itself.

    Ct : (d, k) float32  ``C.T``, C-contiguous;  cc : (k,) float64  ``||C[j]||^2``.
    The other arguments and the return value as ``assign_dense`` (with ``group_of``:
    ``lower_bounds`` (N, G) and ``upper_bounds`` required, as ``assign_dense_grouped``).
    ``subspace``: ``(projection, PCt, rc)`` of :meth:`.projection.Subspace.for_pass`, or
    None; each chunk's products are then taken in the subspace (not with ``group_of``).
    """
    m, (k, d) = rows.shape[0], C.shape
    fill = sqnorms is None or not sqnorms_known
    xx = np.empty(m, dtype=np.float64) if fill else sqnorms[rows]
    prev = np.empty(m, dtype=np.int32)
    old_d2 = np.empty(m, dtype=np.float64)
    lower = np.empty((0, k), dtype=np.float32) if lower_bounds is None else lower_bounds
    upper = EMPTY_F64 if upper_bounds is None else upper_bounds
    g_gemm, g = gemm_error(d), sqdist32_error(d)

    def chunk(lo: int, hi: int) -> int:
        dots = _buffer(k)[: hi - lo]
        r = rows[lo:hi]
        plain = (EMPTY_F64, EMPTY_F64, EMPTY_F64)
        if subspace is None:
            chunk_product(X, r, Ct, dots)
        else:
            proj, PCt, rc = subspace
            plain = (proj.products(X, r, PCt, dots), rc, proj.slack)
        head = (X, r, 0, hi - lo, xx[lo:hi], fill, dots, C, cc, g_gemm, g, remove, labels,
                dist2, lower, upper)  # fmt: skip
        tail = (_NO_S, _NO_V, EMPTY_F64, EMPTY_F64, EMPTY_F64, prev[lo:hi], old_d2[lo:hi])
        if group_of is None:
            return int(_dense._dense_range(*head, *tail, *plain))
        return int(_grouped._dense_range(*head, group_of, *tail))

    spans = [(s, min(m, s + PRODUCT_ROWS)) for s in range(0, m, PRODUCT_ROWS)]
    jobs = [pool(n_threads()).submit(chunk, lo, hi) for lo, hi in spans]
    n_changed = sum(job.result() for job in jobs)
    apply_moves(X, rows, prev, labels[rows], S=S, v=v, Q=Q, sqnorms=xx, sse=sse,
                old_dist2=old_d2, new_dist2=dist2[rows], weights=weights)  # fmt: skip
    if fill and sqnorms is not None:
        sqnorms[rows] = xx
    return n_changed
