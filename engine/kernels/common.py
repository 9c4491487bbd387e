"""Shared pieces of the kernels: float32 distances and their error bounds, safe rounding,
the prefetch intrinsic, and small inline helpers used by more than one kernel.

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

The helpers marked ``inline="always"`` are inlined into the kernels that call them (numba
IR): no call per row or per centroid. The prefetch of the next listed rows is written out
in each kernel loop instead: issued from inside a helper, it made those loops slower.
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
    "DOWN",
    "DOWN32",
    "EMPTY_F64",
    "FASTMATH",
    "FLT_MAX",
    "PREFETCH_AHEAD",
    "UNIT_ROUNDOFF32",
    "UP",
    "UP32",
    "add_vote",
    "all_finite32",
    "bound_factors",
    "down32",
    "exact_argmin",
    "gemm_error",
    "gemm_estimates",
    "list_row",
    "min8",
    "move_vote",
    "open_pairs",
    "prefetch_row",
    "projected_estimates",
    "push_candidate",
    "sqdist32",
    "sqdist32_error",
    "sqdist64",
    "sqdist_safe",
    "sqnorm",
    "sqnorms32",
    "weight_of",
]

UNIT_ROUNDOFF32 = 2.0**-24
DOWN = 1.0 - 2.0**-22  # float64 factor that makes float32 rounding land below the value
F64_ULP = 2.0**-53
UP = 1.0 + 2.0**-50  # float64 factor that keeps a rounded upper bound above its value
UP32 = 1.0 + 2.0**-22  # float64 factor: float32 rounding of value * UP32 is >= value
DOWN32 = 1.0 - 2.0**-23  # exactly representable in float32

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

FLT_MAX = float(np.finfo(np.float32).max)
SAFE_LOW = 2.0**-90  # below: float32 squares may have underflowed
SAFE_HIGH = 2.0**126  # above: float32 sums may overflow

PREFETCH_AHEAD = 2  # listed rows ahead of the one being processed (see prefetch_row)

EMPTY_F64 = np.empty(0, dtype=np.float64)  # an absent float64 vector: kernels skip it


# -- error bounds ---------------------------------------------------------------------
def sqdist32_error(d: int) -> float:
    """Relative error bound ``g`` of ``sqdist32`` in dimension ``d`` (``(d+3)u/(1-(d+3)u)``)."""
    m = (d + 3) * UNIT_ROUNDOFF32
    return m / (1.0 - m)


def gemm_error(d: int) -> float:
    """Bound ``gamma_d = d u / (1 - d u)`` on the relative error of a float32 dot product."""
    m = (d + 1) * UNIT_ROUNDOFF32
    return m / (1.0 - m)


# -- distances and norms --------------------------------------------------------------
@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
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


@numba.njit(cache=True, nogil=True)
def down32(value: float) -> np.float32:
    """A float32 that is ``<= value`` (values <= 0 become 0; huge ones FLT_MAX)."""
    if value <= 0.0:
        return np.float32(0.0)
    if value >= FLT_MAX:
        return np.float32(FLT_MAX)
    return np.float32(value * DOWN)


@numba.njit(cache=True, nogil=True)
def sqdist_safe(x: np.ndarray, c: np.ndarray) -> float:
    """``sqdist32``, redone in float64 where float32 may under- or overflow.

    Within ``sqdist32_error(d)`` (relative) of ``||x - c||^2`` for any finite float32 input.
    """
    s = sqdist32(x, c)
    if s >= SAFE_LOW and s <= SAFE_HIGH:
        return s
    return sqdist64(x, c)


@numba.njit(cache=True, nogil=True)
def gemm_estimate(xx, cc, dot, nx, nc, g_gemm, d):
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
        + (d + 8) * F64_ULP * (xx + cc)
        + (d + 1) * 2.0**-148
    )
    return est, err


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def sqnorm(x: np.ndarray) -> float:
    """``sum(x**2)`` of a ``(d,)`` float32 row, accumulated in float64 (vectorised)."""
    s = 0.0
    for t in range(x.shape[0]):
        xt = np.float64(x[t])
        s += xt * xt
    return s


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def sqnorms32(X: np.ndarray, out: np.ndarray) -> None:
    """``out[q] = sum(X[q]**2)`` accumulated in float64 (vectorised, any order).

    X   : (m, d) float32   IN
    out : (m,) float64     OUT  within ``(d + 1)`` float64 ulps of the exact value
    """
    for q in range(X.shape[0]):
        out[q] = sqnorm(X[q])


@numba.njit(inline="always")
def bound_factors(g):
    """``(1 - g, 1 / (1 - g))``: the true ``||x - c||^2`` of a ``sqdist32`` value ``s`` is
    within ``[s (1 - g), s / (1 - g)]``."""
    return 1.0 - g, 1.0 / (1.0 - g)


# -- deciding the nearest centroid ----------------------------------------------------
@numba.njit(cache=True, nogil=True)
def exact_argmin(x, C, cand, cand_s, nc, g_lo, g_hi, best, best_s):
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


@numba.njit(inline="always")
def push_candidate(j, s_j, cand, cand_s, nc, best, best_s):
    """Append centroid ``j`` at float32-grade distance ``s_j`` to the candidates of a row.

    cand, cand_s : (k,) int64, (k,) float64   INOUT  the first ``nc`` entries are in use

    Returns ``(nc, best, best_s)``: ``best`` becomes ``j`` if ``s_j < best_s``.
    """
    cand[nc] = j
    cand_s[nc] = s_j
    if s_j < best_s:
        return nc + 1, j, s_j
    return nc + 1, best, best_s


@numba.njit(cache=True, nogil=True)
def all_finite32(a: np.ndarray) -> bool:
    """True when every value of the ``(k,)`` float32 array ``a`` is finite (vectorised:
    a count, no branch)."""
    flt_max = np.float32(FLT_MAX)
    n_finite = 0
    for j in range(a.shape[0]):
        n_finite += np.int64(abs(a[j]) <= flt_max)  # False for inf and NaN
    return n_finite == a.shape[0]


@numba.njit(inline="always")
def min8(a):
    """The smallest value of a ``(k,)`` float64 array with no NaN (``inf`` if empty):
    eight running minima, so the loop is not one chain of dependent comparisons."""
    k = a.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.inf
    n8 = k - k % 8
    for j in range(0, n8, 8):
        m0 = min(m0, a[j])
        m1 = min(m1, a[j + 1])
        m2 = min(m2, a[j + 2])
        m3 = min(m3, a[j + 3])
        m4 = min(m4, a[j + 4])
        m5 = min(m5, a[j + 5])
        m6 = min(m6, a[j + 6])
        m7 = min(m7, a[j + 7])
    m = min(min(min(m0, m1), min(m2, m3)), min(min(m4, m5), min(m6, m7)))
    for j in range(n8, k):
        m = min(m, a[j])
    return m


@numba.njit(inline="always")
def gemm_estimates(xx_q, dots_q, cc, norm_c, g_gemm, d, low, high):
    """Lower estimates of a row's squared distance to every centroid, from a BLAS product.

    xx_q   : float                 ``||x||^2``
    dots_q : (k,) float32          ``x . C[j]``
    cc     : (k,) float64          ``||C[j]||^2``; ``norm_c`` its square root
    g_gemm : float                 ``gemm_error(d)``, ``d`` the dimension
    low    : (k,) float64   OUT    ``est - err`` of :func:`gemm_estimate`
    high   : (k,) float64   SCRATCH  ``est + err``

    Returns the smallest upper estimate ``min_j est + err``: a centroid with
    ``low[j] > top`` cannot be the nearest.

    When every product is finite (the usual case) the estimates are computed in one
    branch-free loop, which the compiler vectorises, and their minimum by :func:`min8`;
    the values are those of :func:`gemm_estimate`, bit for bit (the same operations in
    the same order, no contraction). Otherwise each goes through :func:`gemm_estimate`.
    """
    nx = math.sqrt(xx_q)
    if not all_finite32(dots_q):
        top = np.inf
        for j in range(cc.shape[0]):
            est, err = gemm_estimate(xx_q, cc[j], dots_q[j], nx, norm_c[j], g_gemm, d)
            low[j] = est - err
            if est + err < top:
                top = est + err
        return top
    scale = 2.0 * g_gemm * nx
    rounding = (d + 8) * F64_ULP
    underflow = (d + 1) * 2.0**-148
    for j in range(cc.shape[0]):  # gemm_estimate's formula, vectorised
        est = xx_q + cc[j] - 2.0 * np.float64(dots_q[j])
        err = scale * norm_c[j] + rounding * (xx_q + cc[j]) + underflow
        low[j] = est - err
        high[j] = est + err
    return min8(high)


@numba.njit(inline="always")
def projected_estimates(x, C, xx_q, rx_q, pdots_q, cc, norm_c, rc, slack, d, g_hi, low, high):
    """Lower estimates of a row's squared distance to every centroid from its products in
    a subspace (:mod:`nmbatch.engine.projection`), and an upper bound on the nearest.

    x        : (d,) float32   the row; ``C`` (k, d) float32 the centroids
    xx_q     : float          ``||x||^2``; ``cc`` (k,) float64 ``||C[j]||^2``, ``norm_c``
                              its square root
    rx_q     : float          upper bound on the row's norm off the subspace; ``rc`` (k,)
                              float64 the centroids'
    pdots_q  : (k,) float32   ``fl(R^T x) . fl(R^T c(j))`` (BLAS)
    slack    : (4,) float64   ``eta, e, delta, p`` of the projection
    low      : (k,) float64   OUT  ``||x - c(j)||^2 >= low[j]``
    high     : (k,) float64   SCRATCH  the subspace's estimates

    Returns ``top >= min_j ||x - c(j)||^2``: the distance, computed directly, to the
    centroid nearest in the subspace (``inf`` if a product is not finite, and then every
    ``low`` is 0: every centroid a candidate).
    """
    if not all_finite32(pdots_q):
        for j in range(cc.shape[0]):
            low[j] = 0.0
        return np.inf
    eta = slack[0]
    nx = math.sqrt(xx_q)
    rounding = (d + 16) * F64_ULP
    underflow = (d + 1) * 2.0**-148
    for j in range(cc.shape[0]):  # branch-free: vectorised
        dot = np.float64(pdots_q[j])
        dot_hi = dot + rx_q * rc[j] + eta * nx * norm_c[j]
        low[j] = xx_q + cc[j] - 2.0 * dot_hi - rounding * (xx_q + cc[j]) - underflow
        high[j] = cc[j] - 2.0 * dot
    least = min8(high)  # vectorised; then the first index that holds it
    near = 0
    while high[near] != least:
        near += 1
    return sqdist_safe(x, C[near]) * g_hi * UP


# -- bounds ---------------------------------------------------------------------------
@numba.njit(inline="always")
def open_pairs(li, a, u32):
    """The (row, centroid) pairs of a row that its bounds leave open, ``a`` included.

    li : (k,) float32 lower bounds of the row; ``a`` its label; ``u32`` its upper bound,
    rounded up to float32. A centroid ``j != a`` is open when ``li[j] <= u32``; with none
    open the label is settled and the row has no open pair (0).
    """
    n_open = 0
    for j in range(li.shape[0]):  # branch-free, vectorised
        n_open += np.int32(li[j] <= u32)
    if li[a] <= u32:
        n_open -= 1
    return n_open + 1 if n_open > 0 else 0


@numba.njit(inline="always")
def list_row(todo, n_todo, i, listed):
    """Append row ``i`` to the first ``n_todo`` entries of ``todo`` if ``listed``.

    Branch-free: the next slot is written either way (``todo`` has a slot for every row
    that may be listed). Returns the new number of entries.
    """
    todo[n_todo] = i
    return n_todo + np.int64(listed)


# -- one sample, one vote -------------------------------------------------------------
@numba.njit(inline="always")
def weight_of(w, i):
    """The weight of store row ``i``: ``w[i]``, or 1.0 when ``w`` is empty (unweighted).

    w : (N,) float64 or (0,)   the store's ``weights_buffer``
    """
    return w[i] if w.shape[0] > 0 else 1.0


@numba.njit(inline="always")
def add_vote(x, xx, wi, b, S, v, Q):
    """Cast the vote of sample ``x`` (``xx = ||x||^2``, weight ``wi``) for cluster ``b``:
    ``S(b) += wi x``, ``v(b) += wi``, ``Q(b) += wi xx``. With ``wi = 1`` (unweighted, ``v``
    int64) every sum is what adding ``x``, 1 and ``xx`` gives, bit for bit."""
    v[b] += wi
    Q[b] += wi * xx
    for t in range(x.shape[0]):
        S[b, t] += wi * np.float64(x[t])


@numba.njit(inline="always")
def move_vote(x, xx, wi, a, b, S, v, Q):
    """Move the vote of sample ``x`` (``xx = ||x||^2``, weight ``wi``) from cluster ``a`` to ``b``.

    S : (k, d) float64, v : (k,) int64 (float64 when weighted), Q : (k,) float64   INOUT
    """
    v[a] -= wi
    v[b] += wi
    Q[a] -= wi * xx
    Q[b] += wi * xx
    for t in range(x.shape[0]):
        xt = wi * np.float64(x[t])
        S[a, t] -= xt
        S[b, t] += xt


# -- memory ---------------------------------------------------------------------------
@intrinsic
def prefetch_row(typingctx, arr, i):
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


