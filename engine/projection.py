"""Dense passes through a subspace: new rows' candidates from products in ``p`` dimensions.

A dense pass needs, for every row it assigns, a lower estimate of its squared distance to
every centroid, to know which centroids can be the nearest; the full product
``X[rows] @ C.T`` gives them for ``m k d`` multiply-adds. With ``k`` in the thousands and
``d`` in the hundreds that product is nearly all of a pass (MNIST, ``k = 4,096``: 6 s
of one core for the 60,000 rows). Data of this kind lies close to a subspace of far
fewer dimensions than ``d``: in the span ``R`` of the ``p`` leading principal directions
of the centroids, ``x . c = (R^T x) . (R^T c) + r(x) . r(c)`` where ``r`` is the part off
the span, and ``|r(x) . r(c)| <= |r(x)| |r(c)|`` (Cauchy-Schwarz). So

    ||x - c||^2 >= ||x||^2 + ||c||^2 - 2 ((R^T x) . (R^T c) + |r(x)| |r(c)|),

a lower estimate from a product in ``p`` dimensions (``m k p`` multiply-adds) and two
norms per row and centroid (``|r(x)|^2 = ||x||^2 - ||R^T x||^2``). The kernel
(:func:`~nmbatch.engine.kernels.projected.projected_estimates`) computes one centroid's
distance directly, the nearest in the subspace, which bounds the nearest distance above,
and every centroid whose lower estimate is not above it is a candidate, decided by direct
distances as in the full pass. Labels, distances and votes are therefore those of the full
pass exactly; the lower bounds written for the bounded revisits are the lower estimates
(sound, a little looser for far centroids).

Rounding is covered by ``eta`` (a relative slack on the dot product, ``eta ||x|| ||c||``)
and an inflation of the residual norms: the float32 basis is orthonormal only to within
``delta`` (measured once), the float32 projections ``R^T x`` carry at most ``e ||x||`` of
error (``e = gamma_d sqrt(p (1 + delta))``), their float32 product ``gamma_p ||R^T x||
||R^T c||`` (see ``docs/design.md``, "Dense passes through a subspace").

``p`` and whether to project at all are chosen per run, when the first large dense pass
starts, by counting on 256 of its rows how many candidates each ``p`` would leave and
pricing a direct distance at :data:`DIRECT_COST` multiply-adds of BLAS
(:func:`fit_projection`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nmbatch.engine.kernels.common import F64_ULP, gemm_error
from nmbatch.engine.products import PRODUCT_ROWS

__all__ = [
    "BASIS_ROWS",
    "DIRECT_COST",
    "MAX_DIM",
    "MIN_CENTROIDS",
    "PROJECTED_DIMS",
    "SAMPLE_ROWS",
    "Projection",
    "Subspace",
    "fit_projection",
    "projected_products",
]

PROJECTED_DIMS = (8, 16, 32, 64, 128, 256)
"""The values of ``p`` tried; ``p`` at most ``d / 3`` and below ``k``."""
SAMPLE_ROWS = 256
"""Rows of the pass on which the candidates of each ``p`` are counted."""
BASIS_ROWS = 512
"""Centroids (evenly spaced) whose principal directions give the basis."""
MAX_DIM = 2048
"""Above this ``d`` no projection (the ``d x d`` eigendecomposition would cost more than
it saves on one pass)."""
MIN_CENTROIDS = 2048
"""No projection below this ``k``. Measured (MNIST, one idle core, six steps, the same
centroids bit for bit either way): ``k = 1,024`` 4.19 s projected (``p = 64``) against
4.21 s not, the full product being a small part of a step there; ``k = 4,096`` the end
of step 3 (1% above the best energy) at 7.7 s against 13.0 s."""
DIRECT_COST = 8.0
"""What a direct distance of ``d`` terms costs, in multiply-adds of a float32 BLAS
product, per term (a gathered centroid row, a scalar loop: measured 6-10x on the
project's 2-core machine)."""
ACCEPT = 0.5
"""Project only when the priced cost is at most this fraction of the full product's."""


@dataclass(frozen=True)
class Projection:
    """The subspace of a run's dense passes.

    basis : (d, p) float32   C-contiguous; near-orthonormal columns (the principal
                             directions of the centroids, largest first)
    slack : (4,) float64     ``eta``, ``e``, ``delta``, ``p`` for the kernel
    """

    basis: np.ndarray
    slack: np.ndarray

    @property
    def dims(self) -> int:
        """``p``."""
        return int(self.basis.shape[1])

    def centroids(self, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(PCt, rc)`` of the centroids ``C`` ``(k, d)`` float32: ``PCt = (C R)^T``
        ``(p, k)`` float32 C-contiguous, and ``rc`` ``(k,)`` float64, an upper bound on
        each centroid's norm off the subspace."""
        PC = C @ self.basis
        return np.ascontiguousarray(PC.T), self.residuals(C, PC)

    def products(
        self, X: np.ndarray, r: np.ndarray, PCt: np.ndarray, out: np.ndarray
    ) -> np.ndarray:
        """``out = fl(X[r] R) @ PCt`` (two float32 BLAS calls); returns ``rx``.

        X   : (N, d) float32   IN;  r : (m,) int64 sorted rows, m > 0
        PCt : (p, k) float32   IN   from :meth:`centroids`
        out : (m, k) float32   OUT  C-contiguous
        Returns ``(m,)`` float64: upper bounds on the rows' norms off the subspace.
        """
        lo, span = int(r[0]), int(r[-1]) + 1 - int(r[0])
        rows = X[lo : lo + span] if span == r.shape[0] else X[r]
        with np.errstate(over="ignore", invalid="ignore"):  # not finite: every candidate
            PX = rows @ self.basis
            np.matmul(PX, PCt, out=out)
            return self.residuals(rows, PX)

    def residuals(self, X: np.ndarray, PX: np.ndarray) -> np.ndarray:
        """Upper bounds on ``|r(x)|`` for the rows of ``X`` ``(m, d)`` float32 with
        their projections ``PX`` ``(m, p)`` float32: ``(m,)`` float64."""
        _, e, delta, p = self.slack
        xx = np.einsum("ij,ij->i", X, X, dtype=np.float64)
        pxx = np.einsum("ij,ij->i", PX, PX, dtype=np.float64)
        return residual_bounds(xx, pxx, e, delta, p)


class Subspace:
    """A run's choice of projection for its dense passes, made at the first pass large
    enough to price it (:func:`fit_projection`) and kept for the run.

    ``enabled``: None (auto: :func:`fit_projection`'s rule), True (always, with the
    best-priced ``p``, whatever ``k`` and the price: the tests' switch), or False
    (never: every pass takes the full product).
    """

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = enabled
        self.projection: Projection | None = None
        self._decided = False

    def reset(self) -> None:
        """Choose again at the next large pass (new starting centroids)."""
        self.projection, self._decided = None, False

    def for_pass(
        self, X: np.ndarray, rows: np.ndarray, C: np.ndarray
    ) -> tuple[Projection, np.ndarray, np.ndarray] | None:
        """``(projection, PCt, rc)`` for a dense pass of ``rows`` (sorted int64) of ``X``
        against ``C`` ``(k, d)`` float32, or None: the full product."""
        if self.enabled is False:
            return None
        if not self._decided and rows.shape[0] >= SAMPLE_ROWS:
            picks = rows[np.linspace(0, rows.shape[0] - 1, SAMPLE_ROWS).astype(np.int64)]
            self.projection = fit_projection(C, X[picks], force=bool(self.enabled))
            self._decided = True
        if self.projection is None:
            return None
        PCt, rc = self.projection.centroids(C)
        return self.projection, PCt, rc


def projected_products(
    proj: Projection, X: np.ndarray, rows: np.ndarray, PCt: np.ndarray, out: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Projection.products` of ``rows`` by chunks of
    :data:`~nmbatch.engine.products.PRODUCT_ROWS` (the chunks of the full product, so the
    numbers do not depend on the thread count): ``(out[:m], rx)``."""
    m = rows.shape[0]
    rx = np.empty(m, dtype=np.float64)
    for lo in range(0, m, PRODUCT_ROWS):
        hi = min(m, lo + PRODUCT_ROWS)
        rx[lo:hi] = proj.products(X, rows[lo:hi], PCt, out[lo:hi])
    return out[:m], rx


def residual_bounds(
    xx: np.ndarray, pxx: np.ndarray, e: float, delta: float, p: float
) -> np.ndarray:
    """``|r(x)| <= sqrt(||x||^2 - (||R^T x|| - e ||x||)^2 / (1 + delta))``, inflated
    for float64 rounding. ``xx``, ``pxx``: ``(m,)`` float64 ``||x||^2`` and
    ``||fl(R^T x)||^2``; the sums of squares within ``d + 1`` ulps."""
    inner = np.maximum(np.sqrt(pxx * (1.0 - (p + 2) * F64_ULP)) - e * np.sqrt(xx), 0.0)
    rest = xx * (1.0 + 4096 * F64_ULP) - inner * inner / (1.0 + delta)
    return np.sqrt(np.maximum(rest, 0.0)) * (1.0 + 64 * F64_ULP)


def _slack(basis: np.ndarray) -> np.ndarray:
    """``(eta, e, delta, p)`` of a float32 basis ``(d, p)`` (module docstring)."""
    d, p = basis.shape
    B = basis.astype(np.float64)
    G = B.T @ B - np.eye(p)
    delta = float(np.sqrt((G * G).sum())) * (1.0 + 1e-6) + 1e-12  # >= ||G||_2
    e = gemm_error(d) * math.sqrt(p * (1.0 + delta))
    grow = math.sqrt(1.0 + delta) + e  # ||fl(R^T x)|| <= grow ||x||
    eta = (gemm_error(p) * grow * grow + e * (2.0 * math.sqrt(1.0 + delta) + e)
           + delta / (1.0 - delta) * (1.0 + delta))  # fmt: skip
    return np.array([2.0 * eta, e, delta, float(p)], dtype=np.float64)


def _basis(C: np.ndarray, p_max: int) -> np.ndarray:
    """The ``p_max`` leading principal directions of (up to :data:`BASIS_ROWS` evenly
    spaced rows of) ``C``: ``(d, p_max)`` float64 orthonormal, largest first. From the
    ``s x s`` Gram matrix of the ``s`` centred rows when ``s < d`` (``s^2 d``, not ``d^3``),
    then orthonormalised (QR), else from the ``d x d`` covariance."""
    k, d = C.shape
    M = C[:: max(1, math.ceil(k / BASIS_ROWS))].astype(np.float64)
    M -= M.mean(axis=0)
    if M.shape[0] < d:
        _, U = np.linalg.eigh(M @ M.T)  # ascending eigenvalues
        V = M.T @ U[:, ::-1][:, :p_max]
        return np.linalg.qr(V)[0]
    _, V = np.linalg.eigh(M.T @ M)
    return V[:, ::-1][:, :p_max]


def fit_projection(C: np.ndarray, X: np.ndarray, *, force: bool = False) -> Projection | None:
    """The projection for dense passes of rows like ``X`` against ``C``, or None when
    ``k < MIN_CENTROIDS`` or no ``p`` is priced at most :data:`ACCEPT` of the full
    product (``force``: the best-priced ``p`` whatever ``k`` and its price).

    C : (k, d) float32   the centroids in force
    X : (s, d) float32   sample rows of the pass (:data:`SAMPLE_ROWS` are enough)
    """
    k, d = C.shape
    dims = [p for p in PROJECTED_DIMS if 3 * p <= d and p < k]
    if not dims or d > MAX_DIM or X.shape[0] == 0 or (k < MIN_CENTROIDS and not force):
        return None
    V = _basis(C, dims[-1])
    # Counting candidates needs no exactness: float32 products, float64 norms.
    xx = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    cc = np.einsum("ij,ij->i", C, C, dtype=np.float64)
    nearest = np.min(xx[:, None] + cc[None, :] - 2.0 * (X @ C.T), axis=1)
    V32 = V.astype(np.float32)
    PX, PC = X @ V32, C @ V32
    best_p, best_cost = 0, np.inf if force else ACCEPT * k * d
    for p in dims:
        px, pc = PX[:, :p], PC[:, :p]
        rx = np.sqrt(np.maximum(xx - np.einsum("ij,ij->i", px, px, dtype=np.float64), 0.0))
        rc = np.sqrt(np.maximum(cc - np.einsum("ij,ij->i", pc, pc, dtype=np.float64), 0.0))
        low = xx[:, None] + cc[None, :] - 2.0 * (px @ pc.T + rx[:, None] * rc[None, :])
        candidates = float(np.mean((low <= nearest[:, None] * (1.0 + 1e-6)).sum(1)))
        cost = d * p + k * p + DIRECT_COST * (candidates + 1.0) * d
        if cost < best_cost:
            best_p, best_cost = p, cost
    if not best_p:
        return None
    basis = np.ascontiguousarray(V[:, :best_p].astype(np.float32))
    return Projection(basis, _slack(basis))
