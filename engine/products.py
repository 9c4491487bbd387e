"""BLAS products of sorted rows with the centroids, in fixed chunks, several at once.

The dense passes need ``X[rows] @ C.T`` for every row they assign. They take it in
chunks of :data:`PRODUCT_ROWS` rows, always the same chunks whatever the thread count:
a float32 product's rows can depend on how many rows the BLAS call was given (its
kernels block and accumulate differently for a few rows), so the chunk, not the thread,
is the unit. With ``n`` kernel threads (numba's count for the calling thread),
:func:`products` hands the chunks to a pool of ``n`` Python threads, each chunk one
single-thread BLAS call (BLAS is limited to one thread while the algorithms iterate;
numpy releases the GIL in it). Each chunk's products are then the same numbers as on one
thread, bit for bit, and they land in one buffer in row order. Chunks of 1,024 rows keep
two threads busy on the 5,000 new rows of a first batch (4,096-row chunks split them
4,096 + 904) and cost a single-thread BLAS call nothing measurable.

A chunk whose rows fill most of their span of ``X`` is multiplied in place (the extra
rows of the product cost less than gathering a copy); other chunks are gathered first.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from nmbatch.engine.kernels.parallel import n_threads

__all__ = [
    "CHUNKS_PER_THREAD",
    "DOTS_BYTES",
    "MIN_POOL_WORK",
    "PRODUCT_ROWS",
    "SPAN_PRODUCT_RATIO",
    "chunk_product",
    "chunks_at_once",
    "pool",
    "products",
]

PRODUCT_ROWS = 1024  # rows of one BLAS call
# Chunks of fewer multiply-adds (PRODUCT_ROWS d k) stay on the calling thread: a pool
# thread's wake-up, and on a machine with no spare core the OpenMP threads of the kernel
# before still spinning, cost more than they save. Measured on 2 cores, new samples'
# products: MNIST (d k = 39,200: 40 M per chunk) 1.4-1.8x faster on two threads, image
# patches (d k = 5,400: 5.5 M) 1.08x alone and slower between kernels.
MIN_POOL_WORK = 2**24

# Sorted rows whose span is at most this many times their number are multiplied in place
# (extra rows of the product are cheaper than gathering a copy).
SPAN_PRODUCT_RATIO = 1.5
# A dense pass takes CHUNKS_PER_THREAD chunks per kernel thread at once (one buffer, then
# one call of the assignment kernel over all of them): a fixed buffer, as large as the
# 4,096 rows one thread always took, whatever the number of rows; fewer chunks if their
# products would pass DOTS_BYTES (large k), but at least one per thread.
CHUNKS_PER_THREAD = 4
DOTS_BYTES = 32 * 2**20

_pools: dict[int, ThreadPoolExecutor] = {}


def pool(n: int) -> ThreadPoolExecutor:
    """A pool of ``n`` threads, made once per ``n`` and kept (its threads sleep between
    passes)."""
    workers = _pools.get(n)
    if workers is None:
        workers = _pools[n] = ThreadPoolExecutor(n, thread_name_prefix="nmbatch-blas")
    return workers


def chunks_at_once(k: int) -> int:
    """How many chunks of products a dense pass takes at once for ``k`` centroids:
    :data:`CHUNKS_PER_THREAD` per thread of the calling thread's count, within
    :data:`DOTS_BYTES`, at least one per thread."""
    n = n_threads()
    return max(n, min(CHUNKS_PER_THREAD * n, DOTS_BYTES // (PRODUCT_ROWS * k * 4)))


def chunk_product(X: np.ndarray, r: np.ndarray, Ct: np.ndarray, out: np.ndarray) -> None:
    """``out = X[r] @ Ct``, float32 BLAS.

    X   : (N, d) float32   IN
    r   : (m,) int64       IN   sorted rows, m > 0
    Ct  : (d, k) float32   IN   C-contiguous
    out : (m, k) float32   OUT  C-contiguous
    """
    lo, span = int(r[0]), int(r[-1]) + 1 - int(r[0])
    # A product that overflows float32 is treated as unknown by the kernels.
    with np.errstate(over="ignore", invalid="ignore"):
        if span == r.shape[0]:  # contiguous rows: no gather copy
            np.matmul(X[lo : lo + span], Ct, out=out)
        elif span <= SPAN_PRODUCT_RATIO * r.shape[0]:
            out[:] = (X[lo : lo + span] @ Ct)[r - lo]
        else:
            np.matmul(X[r], Ct, out=out)


def products(X: np.ndarray, rows: np.ndarray, Ct: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``X[rows] @ Ct`` by chunks of ``PRODUCT_ROWS`` rows (chunk ``c``: ``rows[c
    PRODUCT_ROWS: (c + 1) PRODUCT_ROWS]``), on the kernel threads' count of pool threads
    (on the calling thread below :data:`MIN_POOL_WORK`: the same numbers either way).

    X    : (N, d) float32     IN
    rows : (m,) int64         IN   sorted
    Ct   : (d, k) float32     IN   C-contiguous
    out  : (>= m, k) float32  OUT  C-contiguous; its first ``m`` rows are written

    Returns ``out[:m]``.
    """
    m = rows.shape[0]
    spans = [(s, min(m, s + PRODUCT_ROWS)) for s in range(0, m, PRODUCT_ROWS)]
    small = PRODUCT_ROWS * Ct.shape[0] * Ct.shape[1] < MIN_POOL_WORK
    if len(spans) == 1 or n_threads() == 1 or small:
        for lo, hi in spans:
            chunk_product(X, rows[lo:hi], Ct, out[lo:hi])
    else:
        workers = pool(n_threads())
        jobs = [workers.submit(chunk_product, X, rows[lo:hi], Ct, out[lo:hi]) for lo, hi in spans]
        for job in jobs:
            job.result()
    return out[:m]
