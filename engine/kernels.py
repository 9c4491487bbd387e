"""Numba kernels of the engine: distances, bounded reassignment, dense assignment, store shuffle.

Symbols (as in the paper, Newling & Fleuret 2016, Alg. ``nmbatch``):

- ``X``      samples, ``(n, d)`` float32
- ``C``      centroids ``c(j)``, ``(k, d)`` float32
- ``S``      per-cluster sum of assigned samples, ``(k, d)`` float64
- ``v``      per-cluster count of assigned samples, ``(k,)`` int64
- ``sse``    per-cluster sum of ``d(i)^2``, ``(k,)`` float64
- ``labels`` assignment ``a(i)``, int32 (``-1``: not assigned yet)
- ``dist2``  ``d(i)^2``, the squared distance added to ``sse`` when ``i`` was assigned, float64
- ``lower``  lower bounds ``l(i, j) <= ||x(i) - c(j)||``, ``(n, k)`` float32
- ``p``      distance each centroid moved at the last update, ``(k,)`` float64

Exactness. Distances are computed in float32 for speed, with error bounds:

- ``sqdist32`` (a SIMD loop; any summation order) returns ``s`` with
  ``|s - ||x - c||^2| <= g * ||x - c||^2``, ``g = sqdist32_error(d)``.
- The expanded form ``||x||^2 + ||c||^2 - 2 x.c`` with the dot product from BLAS
  (``float32``) has absolute error at most ``2 gemm_error(d) ||x|| ||c||`` (plus float64
  rounding), whatever order BLAS sums in.

Every lower bound is shrunk by its error bound and rounded *down* to float32, so it never
exceeds the true distance. A sample's nearest centroid is decided in float64 whenever the
float32 values cannot separate the candidates, ties going to the lowest index: the same
centroids always give the same assignment, with bounds on or off.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "UNIT_ROUNDOFF32",
    "assign_dense",
    "bound_sweep",
    "centroid_update",
    "gemm_error",
    "reassign_bounded",
    "reassign_rows",
    "row_sqnorms",
    "settle_assigned",
    "shuffle_insert",
    "sqdist32",
    "sqdist32_error",
    "sqdist64",
    "sqdist_safe",
    "sqnorms32",
]

UNIT_ROUNDOFF32 = 2.0**-24
_DOWN = 1.0 - 2.0**-22  # float64 factor that makes float32 rounding land below the value
_F64_ULP = 2.0**-53
_UP = 1.0 + 2.0**-50  # float64 factor that keeps a rounded upper bound above its value
_UP32 = 1.0 + 2.0**-22  # float64 factor: float32 rounding of value * _UP32 is >= value
_DOWN32 = 1.0 - 2.0**-23  # exactly representable in float32

_FAST = {"reassoc", "contract", "nsz", "arcp"}


def sqdist32_error(d: int) -> float:
    """Relative error bound ``g`` of ``sqdist32`` in dimension ``d`` (``(d+3)u/(1-(d+3)u)``)."""
    m = (d + 3) * UNIT_ROUNDOFF32
    return m / (1.0 - m)


def gemm_error(d: int) -> float:
    """Bound ``gamma_d = d u / (1 - d u)`` on the relative error of a float32 dot product."""
    m = (d + 1) * UNIT_ROUNDOFF32
    return m / (1.0 - m)


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def sqdist32(x: np.ndarray, c: np.ndarray) -> float:
    """``sum((x - c)**2)`` in float32, vectorised; ``x``, ``c``: ``(d,)`` float32; float64 out."""
    s = np.float32(0.0)
    for t in range(x.shape[0]):
        diff = x[t] - c[t]
        s += diff * diff
    return np.float64(s)


@numba.njit(cache=True, nogil=True)
def sqdist64(x: np.ndarray, c: np.ndarray) -> float:
    """``sum((x - c)**2)`` accumulated in float64, sequentially; ``x``, ``c``: ``(d,)``."""
    s = 0.0
    for t in range(x.shape[0]):
        diff = np.float64(x[t]) - np.float64(c[t])
        s += diff * diff
    return s


_FLT_MAX = float(np.finfo(np.float32).max)
_SAFE_LOW = 2.0**-90  # below: float32 squares may have underflowed
_SAFE_HIGH = 2.0**126  # above: float32 sums may overflow


@numba.njit(cache=True, nogil=True)
def _down32(value: float) -> np.float32:
    """A float32 that is ``<= value`` (values <= 0 become 0; huge ones FLT_MAX)."""
    if value <= 0.0:
        return np.float32(0.0)
    if value >= _FLT_MAX:
        return np.float32(_FLT_MAX)
    return np.float32(value * _DOWN)


@numba.njit(cache=True, nogil=True)
def sqdist_safe(x: np.ndarray, c: np.ndarray) -> float:
    """``sqdist32``, redone in float64 where float32 may under- or overflow.

    Within ``sqdist32_error(d)`` (relative) of ``||x - c||^2`` for any finite float32 input.
    """
    s = sqdist32(x, c)
    if s >= _SAFE_LOW and s <= _SAFE_HIGH:
        return s
    return sqdist64(x, c)


@numba.njit(cache=True, nogil=True)
def _gemm_estimate(xx, cc, dot, nx, nc, g_gemm, d):
    """``(estimate, error)`` of ``||x - c||^2`` from a float32 BLAS dot product.

    ``nx = sqrt(xx)`` and ``nc = sqrt(cc)`` are the norms of the sample and the centroid.

    The error covers the float32 product (``2 gamma_d ||x|| ||c||``), float32 underflow
    of its terms, and float64 rounding; a non-finite product gives an infinite error.
    """
    dot64 = np.float64(dot)
    if not math.isfinite(dot64):
        return 0.0, np.inf
    est = xx + cc - 2.0 * dot64
    # float64 terms: xx and cc are sums of d squares, each within (d + 1) ulps.
    err = (
        2.0 * g_gemm * nx * nc
        + (d + 8) * _F64_ULP * (xx + cc)
        + (d + 1) * 2.0**-148
    )
    return est, err


@numba.njit(cache=True, nogil=True)
def row_sqnorms(X: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[q] = sum(X[rows[q]]**2)`` in float64.

    X    : (n, d) float32   IN
    rows : (m,) int64       IN
    out  : (m,) float64     OUT
    """
    for q in range(rows.shape[0]):
        x = X[rows[q]]
        s = 0.0
        for t in range(x.shape[0]):
            s += np.float64(x[t]) * np.float64(x[t])
        out[q] = s


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def sqnorms32(X: np.ndarray, out: np.ndarray) -> None:
    """``out[q] = sum(X[q]**2)`` accumulated in float64 (vectorised, any order).

    X   : (m, d) float32   IN
    out : (m,) float64     OUT  within ``(d + 1)`` float64 ulps of the exact value
    """
    for q in range(X.shape[0]):
        out[q] = _sqnorm(X[q])


@numba.njit(cache=True, nogil=True)
def _exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s):
    """Resolve the nearest centroid among computed candidates, in float64 if needed.

    ``cand_s[q]`` approximates ``||x - C[cand[q]]||^2`` with true value within
    ``[cand_s * g_lo, cand_s * g_hi]``. Returns ``(best, s)`` with ``s`` float32-grade when
    unambiguous, exact float64 when a float64 decision was needed.
    """
    thr = best_s * g_hi
    n_amb = 0
    for q in range(nc):
        if cand_s[q] * g_lo <= thr:
            n_amb += 1
    if n_amb <= 1:
        return best, best_s
    best = -1
    best_exact = np.inf
    for q in range(nc):
        if cand_s[q] * g_lo <= thr:
            j = cand[q]
            e = sqdist64(x, C[j])
            if e < best_exact or (e == best_exact and j < best):
                best = j
                best_exact = e
    return best, best_exact


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _sqnorm(x: np.ndarray) -> float:
    """``sum(x**2)`` of a ``(d,)`` float32 row, accumulated in float64 (vectorised)."""
    s = 0.0
    for t in range(x.shape[0]):
        xt = np.float64(x[t])
        s += xt * xt
    return s


@intrinsic
def _prefetch_row(typingctx, arr, i):
    """Hint the CPU to start loading row ``i`` of a 2-D C-contiguous array into its caches
    (one ``llvm.prefetch`` per 64-byte line; no effect on results)."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1], zero])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        base = builder.bitcast(ptr, i8p)
        itemsize = context.get_constant(types.intp, aryty.dtype.bitwidth // 8)
        nbytes = builder.mul(itemsize, builder.extract_value(ary.shape, 1))
        line = context.get_constant(types.intp, 64)
        with cgutils.for_range_slice(builder, zero, nbytes, line) as (offset, _):
            # read, high locality, data cache
            args_ = [builder.gep(base, [offset]), i32(0), i32(3), i32(1)]
            builder.call(fn, args_)
        return context.get_dummy_value()

    return sig, codegen


_PREFETCH_AHEAD = 2  # listed rows ahead of the one being processed


@numba.njit(cache=True, nogil=True)
def bound_sweep(p, labels, upper, lower):
    """Pass 1 of a bounded revisit (nmbatch lines 10-13): update every bound, list the open rows.

    Over every row ``i``: the bound update ``l(i, j) -= p(j)`` and ``u(i) += p(a(i))``
    (fused, rounded safely, vectorised). If ``u(i) < l(i, j)`` for every ``j != a(i)``,
    ``a(i)`` is still the unique nearest centroid and the sample need not be read at all;
    otherwise ``i`` is listed in ``todo``.

    p      : (k,) float64     IN   distance moved by each centroid at the last update
    labels : (n,) int32       IN   ``a(i)``
    upper  : (n,) float64     INOUT  ``u(i) >= ||x(i) - c(a(i))||``
    lower  : (n, k) float32   INOUT  ``l(i, j) <= ||x(i) - c(j)||``

    Returns ``(todo, n_open)``: ``todo`` (m,) int64, the rows whose bounds do not settle
    their label, in increasing order; ``n_open`` the number of (row, centroid) pairs of
    those rows that the bounds leave open, ``a(i)`` included (at most ``m k``).
    """
    n = labels.shape[0]
    k = lower.shape[1]
    # p rounded up to float32, so that the float32 bound update stays below the truth:
    # fl(fl(l - p32) * (1 - 2^-23)) <= l - p for l - p > 0 (and a negative bound is valid).
    p32 = np.empty(k, dtype=np.float32)
    for j in range(k):
        p32[j] = np.float32(p[j] * _UP32)
    down = np.float32(_DOWN32)
    todo = np.empty(n, dtype=np.int64)
    n_todo = 0
    n_pairs = 0
    for i in range(n):
        li = lower[i]
        a = labels[i]
        ub = (upper[i] + p[a]) * _UP
        ub32 = np.float32(ub * _UP32)
        for j in range(k):  # branch-free, vectorised
            li[j] = (li[j] - p32[j]) * down
        n_open = 0
        for j in range(k):
            n_open += np.int32(li[j] <= ub32)
        if li[a] <= ub32:
            n_open -= 1
        upper[i] = ub
        if n_open > 0:
            todo[n_todo] = i
            n_todo += 1
            n_pairs += n_open + 1
    return todo[:n_todo], n_pairs


@numba.njit(cache=True, nogil=True)
def settle_assigned(X, rows, C, g, labels, upper, lower, s_assigned):
    """Pass 2a of a bounded revisit (nmbatch lines 14-15): the exact distance to ``a(i)``.

    For each listed row: ``s = ||x(i) - c(a(i))||^2``, stored in ``s_assigned[i]``;
    ``u(i)`` and ``l(i, a(i))`` become tight. A row whose tight ``u(i)`` is now below every
    other ``l(i, j)`` keeps its label and leaves the list.

    X          : (n, d) float32   IN
    rows       : (m,) int64       IN   rows listed by ``bound_sweep``
    C          : (k, d) float32   IN   current centroids
    g          : float            IN   ``sqdist32_error(d)``
    labels     : (n,) int32       IN
    upper      : (n,) float64     INOUT
    lower      : (n, k) float32   INOUT
    s_assigned : (n,) float64     OUT  (for the listed rows)

    Returns ``(todo, n_open)``: the rows still open (a subsequence of ``rows``) and the
    number of their (row, centroid) pairs the tight bounds leave open, ``a(i)`` included.
    """
    k = C.shape[0]
    g_lo = 1.0 - g
    g_hi = 1.0 / (1.0 - g)
    todo = np.empty(rows.shape[0], dtype=np.int64)
    n_todo = 0
    n_pairs = 0
    m = rows.shape[0]
    for t in range(m):
        if t + _PREFETCH_AHEAD < m:
            _prefetch_row(X, rows[t + _PREFETCH_AHEAD])
        i = rows[t]
        li = lower[i]
        a = labels[i]
        s_a = sqdist_safe(X[i], C[a])
        s_assigned[i] = s_a
        u = math.sqrt(s_a * g_hi)
        upper[i] = u * _UP
        li[a] = _down32(math.sqrt(s_a * g_lo))
        u32 = np.float32(u * _UP32)
        n_open = 0
        for j in range(k):  # branch-free, vectorised
            n_open += np.int32(li[j] <= u32)
        if li[a] <= u32:
            n_open -= 1
        if n_open > 0:
            todo[n_todo] = i
            n_todo += 1
            n_pairs += n_open + 1
    return todo[:n_todo], n_pairs


@numba.njit(cache=True, nogil=True)
def reassign_rows(X, rows, C, g, labels, upper, lower, S, v, Q, s_assigned, known):
    """Pass 2 of a bounded revisit (nmbatch lines 14-21) on the listed rows, row by row.

    For each listed row: the exact distance to ``a(i)`` (already in ``s_assigned`` when
    ``known``, after :func:`settle_assigned`; otherwise computed here, so the row is read
    once), a distance to every ``j`` whose bound does not exclude it (the bound tightened
    as nearer centroids are found), and the nearest decided exactly. ``S``, ``v`` and
    ``Q`` change only for samples whose label changed (one sample, one vote); ``sse``
    follows from them (``Q(j) - 2 c(j).S(j) + v(j) ||c(j)||^2``).

    X          : (n, d) float32   IN   samples (rows already in the batch)
    rows       : (m,) int64       IN   rows to revisit (bounds already updated this step)
    C          : (k, d) float32   IN   current centroids
    g          : float            IN   ``sqdist32_error(d)``
    labels     : (n,) int32       INOUT  ``a(i)``
    upper      : (n,) float64     INOUT  ``u(i) >= ||x(i) - c(a(i))||``
    lower      : (n, k) float32   INOUT  ``l(i, j) <= ||x(i) - c(j)||``
    S          : (k, d) float64   INOUT
    v          : (k,) int64       INOUT
    Q          : (k,) float64     INOUT  sum of ``||x(i)||^2`` over the samples of each cluster
    s_assigned : (n,) float64     IN   ``||x(i) - c(a(i))||^2`` from ``settle_assigned``
    known      : bool             IN   whether ``s_assigned`` holds it (else not read)

    Returns ``(n_changed, n_distances)`` (distances computed here).
    """
    k = C.shape[0]
    d = X.shape[1]
    g_lo = 1.0 - g
    g_hi = 1.0 / (1.0 - g)
    cand = np.empty(k, dtype=np.int64)
    cand_s = np.empty(k, dtype=np.float64)
    open_j = np.empty(k, dtype=np.int64)
    n_changed = 0
    n_dist = 0
    m = rows.shape[0]
    for t in range(m):
        if t + _PREFETCH_AHEAD < m:
            _prefetch_row(X, rows[t + _PREFETCH_AHEAD])
        i = rows[t]
        li = lower[i]
        a = labels[i]
        x = X[i]
        if known:
            s_a = s_assigned[i]
        else:
            s_a = sqdist_safe(x, C[a])
            n_dist += 1
        best = a
        best_s = s_a
        u = math.sqrt(best_s * g_hi)
        u32 = np.float32(u * _UP32)
        # Branch-free gathering of the centroids whose bound does not exclude them.
        n_open = 0
        for j in range(k):
            open_j[n_open] = j
            n_open += np.int32(li[j] <= u32) & np.int32(j != a)
        cand[0] = a
        cand_s[0] = s_a
        nc = 1
        for q in range(n_open):
            j = open_j[q]
            if li[j] > u:  # excluded by a nearer centroid found meanwhile
                continue
            s_j = sqdist_safe(x, C[j])
            n_dist += 1
            li[j] = _down32(math.sqrt(s_j * g_lo))
            cand[nc] = j
            cand_s[nc] = s_j
            nc += 1
            if s_j < best_s:
                best = j
                best_s = s_j
                u = math.sqrt(best_s * g_hi)
        li[a] = _down32(math.sqrt(s_a * g_lo))
        if nc > 1:
            best, s_new = _exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s)
            upper[i] = math.sqrt(s_new * g_hi) * _UP
        else:
            upper[i] = u * _UP
        if best != a:
            n_changed += 1
            labels[i] = best
            v[a] -= 1
            v[best] += 1
            xx = _sqnorm(x)
            Q[a] -= xx
            Q[best] += xx
            for t2 in range(d):
                xt = np.float64(x[t2])
                S[a, t2] -= xt
                S[best, t2] += xt
    return n_changed, n_dist


@numba.njit(cache=True, nogil=True)
def reassign_bounded(X, C, p, g, labels, upper, lower, S, v, Q):
    """Revisit already-assigned samples with Elkan-style bounds (nmbatch lines 10-21):
    :func:`bound_sweep`, then :func:`reassign_rows` on the rows it lists, all scalar.

    Arguments as those (``X`` (n, d) float32 holds the revisited rows). Returns
    ``(n_changed, n_distances)``.
    """
    rows, _ = bound_sweep(p, labels, upper, lower)
    no_s = np.empty(0, dtype=np.float64)
    return reassign_rows(X, rows, C, g, labels, upper, lower, S, v, Q, no_s, False)


@numba.njit(cache=True, nogil=True)
def assign_dense(
    X, rows, xx, fill_xx, dots, C, cc, g_gemm, g, remove, labels, dist2, lower, upper, S, v,
    sse, Q,
):
    """Assign rows from a BLAS product of all their distances; update sums (and bounds).

    ``||x - c||^2 = xx + cc - 2 x.c`` with the error of the float32 product bounded by
    ``2 g_gemm ||x|| ||c||``: candidates that the bound cannot rule out are separated by a
    direct distance, in float64 when needed. ``d(i)^2`` is always a direct computation.

    X      : (N, d) float32   IN   sample buffer (rows indexed by ``rows``)
    rows   : (m,) int64       IN   the rows to assign
    xx     : (m,) float64     IN   ``||X[rows[q]]||^2`` (OUT when ``fill_xx``)
    fill_xx: bool             IN   compute ``xx`` here, as each row is read (one pass
                                   over the rows instead of two)
    dots   : (m, k) float32   IN   ``X[rows] @ C.T``
    C      : (k, d) float32   IN
    cc     : (k,) float64     IN   ``||C[j]||^2``
    g_gemm : float            IN   ``gemm_error(d)``
    g      : float            IN   ``sqdist32_error(d)``
    remove : bool             IN   one sample, one vote: a row with ``labels >= 0`` gives
                                   back its old contribution (only if its label changes,
                                   plus its old ``sse`` term). ``False``: always add (mbatch,
                                   and a fresh pass whose sums start at zero).
    labels : (N,) int32       INOUT  ``-1`` for unassigned rows
    dist2  : (N,) float64     INOUT
    lower  : (N, k) float32 or (0, k)  OUT  tight bounds (skipped when it has 0 rows)
    upper  : (N,) float64 or (0,)      OUT  ``u(i)`` (skipped when it has 0 rows)
    S, v, sse, Q              INOUT  ``Q``: sum of ``||x||^2`` per cluster

    Returns ``n_changed``: rows that had a label and now have another.
    """
    m = rows.shape[0]
    k = C.shape[0]
    d = X.shape[1]
    g_lo = 1.0 - g
    g_hi = 1.0 / (1.0 - g)
    keep_bounds = lower.shape[0] > 0
    keep_upper = upper.shape[0] > 0
    cand = np.empty(k, dtype=np.int64)
    cand_s = np.empty(k, dtype=np.float64)
    err = np.empty(k, dtype=np.float64)
    est = np.empty(k, dtype=np.float64)
    norm_c = np.sqrt(cc)
    n_changed = 0
    for q in range(m):
        i = rows[q]
        x = X[i]
        if fill_xx:
            xx[q] = _sqnorm(x)
        nx = math.sqrt(xx[q])
        top = np.inf
        for j in range(k):
            est[j], err[j] = _gemm_estimate(xx[q], cc[j], dots[q, j], nx, norm_c[j], g_gemm, d)
            if est[j] + err[j] < top:
                top = est[j] + err[j]
        # Candidates whose lower estimate does not exceed the best upper estimate.
        nc = 0
        best = -1
        best_s = np.inf
        for j in range(k):
            if est[j] - err[j] <= top:
                s_j = sqdist_safe(x, C[j])
                cand[nc] = j
                cand_s[nc] = s_j
                nc += 1
                if s_j < best_s:
                    best = j
                    best_s = s_j
        best, s_new = _exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s)
        if keep_bounds:
            li = lower[i]
            for j in range(k):  # branch-free _down32 (vectorised)
                li[j] = np.float32(min(math.sqrt(max(est[j] - err[j], 0.0)) * _DOWN, _FLT_MAX))
            for q2 in range(nc):
                li[cand[q2]] = _down32(math.sqrt(cand_s[q2] * g_lo))
        if keep_upper:
            upper[i] = math.sqrt(s_new * g_hi) * _UP
        old = labels[i]
        if old >= 0 and old != best:
            n_changed += 1
        if remove and old >= 0:
            sse[old] -= dist2[i]
            sse[best] += s_new
            if old != best:
                v[old] -= 1
                v[best] += 1
                Q[old] -= xx[q]
                Q[best] += xx[q]
                for t in range(d):
                    xt = np.float64(x[t])
                    S[old, t] -= xt
                    S[best, t] += xt
        else:
            sse[best] += s_new
            v[best] += 1
            Q[best] += xx[q]
            for t in range(d):
                S[best, t] += np.float64(x[t])
        labels[i] = best
        dist2[i] = s_new
    return n_changed


@numba.njit(cache=True, nogil=True)
def nearest_dense(X, xx, dots, C, cc, g_gemm, labels_out, sqdist_out):
    """Exact nearest centroid of every row (ties: lowest index) and its squared distance.

    X          : (m, d) float32   IN
    xx         : (m,) float64     IN   ``||X[q]||^2``
    dots       : (m, k) float32   IN   ``X @ C.T``
    C          : (k, d) float32   IN
    cc         : (k,) float64     IN
    g_gemm     : float            IN   ``gemm_error(d)``
    labels_out : (m,) int64       OUT
    sqdist_out : (m,) float64     OUT  ``||X[q] - C[label]||^2`` accumulated in float64
    """
    m = X.shape[0]
    k = C.shape[0]
    d = X.shape[1]
    err = np.empty(k, dtype=np.float64)
    est = np.empty(k, dtype=np.float64)
    norm_c = np.sqrt(cc)
    for q in range(m):
        nx = math.sqrt(xx[q])
        top = np.inf
        for j in range(k):
            est[j], err[j] = _gemm_estimate(xx[q], cc[j], dots[q, j], nx, norm_c[j], g_gemm, d)
            if est[j] + err[j] < top:
                top = est[j] + err[j]
        best = -1
        best_e = np.inf
        for j in range(k):
            if est[j] - err[j] <= top:
                e = sqdist64(X[q], C[j])
                if e < best_e:
                    best = j
                    best_e = e
        labels_out[q] = best
        sqdist_out[q] = best_e


@numba.njit(cache=True, nogil=True)
def centroid_update(S, v, Q, C_old, sse_from_sums, sse):
    """The centroid update (nmbatch lines 31-35) in one pass over ``S``.

    ``c(j) = S(j)/v(j)`` (float64 division, rounded to float32) where ``v(j) > 0``, else
    ``c(j)`` stays; ``p(j) = ||c_new(j) - c_old(j)||`` (float64, times ``1 + 1e-9``). With
    ``sse_from_sums``, ``sse(j) = max(Q(j) - 2 c_old(j).S(j) + v(j) ||c_old(j)||^2, 0)``
    first: the sum of ``d(i)^2`` under the centroids in force during the iteration.

    S, v, Q : (k, d) float64, (k,) int64, (k,) float64   IN
    C_old   : (k, d) float32   IN
    sse     : (k,) float64     OUT when ``sse_from_sums`` (else untouched)

    Returns ``(C_new (k, d) float32, p (k,) float64)``.
    """
    k, d = C_old.shape
    C_new = np.empty((k, d), dtype=np.float32)
    p = np.empty(k, dtype=np.float64)
    for j in range(k):
        cj = C_old[j]
        if sse_from_sums:
            cs = 0.0
            cc = 0.0
            for t in range(d):
                c64 = np.float64(cj[t])
                cs += c64 * S[j, t]
                cc += c64 * c64
            sse[j] = max(Q[j] - 2.0 * cs + v[j] * cc, 0.0)
        moved = 0.0
        if v[j] > 0:
            inv = np.float64(v[j])
            for t in range(d):
                new = np.float32(S[j, t] / inv)
                C_new[j, t] = new
                diff = np.float64(new) - np.float64(cj[t])
                moved += diff * diff
        else:
            for t in range(d):
                C_new[j, t] = cj[t]
        p[j] = math.sqrt(moved) * (1.0 + 1e-9)
    return C_new, p


@numba.njit(cache=True, nogil=True)
def shuffle_insert(X, swap, n, data, ids):
    """Inside-out Fisher-Yates insertion of new rows into the shuffled tail.

    Row ``t`` of ``X`` goes to position ``swap[t]`` (uniform in ``[b, n + t]``), and the row
    that was there moves to the end, ``n + t``.

    X    : (m, d) float32   IN
    swap : (m,) int64       IN
    n    : int              IN   number of rows stored before the call
    data : (cap, d) float32 INOUT
    ids  : (cap,) int64     INOUT  insertion index of each stored row
    """
    for t in range(X.shape[0]):
        end = n + t
        r = swap[t]
        if r != end:
            data[end] = data[r]
            ids[end] = ids[r]
        data[r] = X[t]
        ids[r] = end
