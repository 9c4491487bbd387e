"""The first nested batch sized to ``k``: ``b_0 = max(batch_size, c k)``.

With ``k`` in the thousands, the paper's ``b_0 = 5,000`` gives each cluster about five
samples at ``k = 1,024``: many clusters lose all their samples at the first update and
the model settles above what Lloyd reaches (issue 16). The first batch therefore holds at
least ``c = B0_PER_CLUSTER`` samples per cluster. At ``k <= batch_size / c`` (``k = 50``
with the default ``batch_size = 5,000``) the rule changes nothing, so the paper's protocol
and every ``k = 50`` result are unchanged.

``c = 20`` was measured (issue 16; MNIST and image patches, ``k = 256`` and ``1,024``,
``c`` from 5 to 80, one thread, CPU time): on MNIST at ``k = 1,024``, ``c = 20`` and
``40`` reached 5%, 2% and 1% of the best energy sooner than ``b_0 = 5,000`` and ended
lower, in each of three seeds; on patches at ``k = 256`` a larger ``c`` than 20 ended
higher in both seeds, and at ``k = 1,024`` the seeds disagreed.
``per_cluster = 0`` gives the paper's rule.

The doubling rule's guard (a cluster with ``v(j) = 1`` and ``p(j) > 0`` fails the test,
:meth:`~nmbatch.engine.algorithms.base.KMeansAlgorithm._doubling_test`) is kept: on
patches at ``k = 1,024`` with ``b_0 = 20 k`` it never blocked a doubling that the ratio
test would have allowed (40 to 150 steps); what kept the batch from growing at large
``k`` was the ratio test itself (no doubling in 40 steps, two in 150), hence the
tolerance of :func:`doubling_allowance`, under which such a cluster counts as one of
the failing clusters.
"""

from __future__ import annotations

import math

__all__ = [
    "B0_PER_CLUSTER",
    "DOUBLING_TOLERANCE",
    "LARGE_K_RHO",
    "doubling_allowance",
    "doubling_rho",
    "first_batch_size",
    "sized_to_k",
]

#: ``c``: samples per cluster in the first nested batch (measured: docs/internals/algorithm.md).
B0_PER_CLUSTER = 20
#: ``q``: with the first batch sized to ``k``, the fraction of the clusters that may fail
#: the doubling test (measured: :func:`doubling_allowance`).
DOUBLING_TOLERANCE = 0.5
#: ``rho`` of the doubling test with the first batch sized to ``k`` (:func:`doubling_rho`).
LARGE_K_RHO = 1.0


def first_batch_size(
    batch_size: int, n_clusters: int, n_samples: int, per_cluster: int = B0_PER_CLUSTER
) -> int:
    """``b_0 = min(max(batch_size, per_cluster * n_clusters), n_samples)``.

    ``batch_size``: the ``b_0`` asked for (the estimator's ``batch_size``); ``n_samples``:
    the samples stored when the first step runs (``N``). ``per_cluster = 0`` gives the
    paper's ``b_0 = min(batch_size, N)``. The step then takes at least ``k`` rows.
    """
    if per_cluster < 0:
        raise ValueError(f"per_cluster must be >= 0, got {per_cluster}")
    return min(max(int(batch_size), int(per_cluster) * int(n_clusters)), int(n_samples))


def sized_to_k(batch_size: int, n_clusters: int, per_cluster: int = B0_PER_CLUSTER) -> bool:
    """True when the first batch is sized to ``k`` rather than to ``batch_size``:
    ``per_cluster * k > batch_size`` (``k > 250`` with the defaults)."""
    return int(per_cluster) * int(n_clusters) > int(batch_size)


def doubling_rho(
    rho: float,
    batch_size: int,
    n_clusters: int,
    per_cluster: int = B0_PER_CLUSTER,
    large_k_rho: float = LARGE_K_RHO,
) -> float:
    """The doubling test's threshold: ``min(rho, large_k_rho)`` when the first batch is
    sized to ``k`` (``per_cluster * k > batch_size``), else ``rho`` (the paper's test).

    With :data:`DOUBLING_TOLERANCE` ``= 0.5`` this is a test on the median moved
    cluster: the batch doubles once at least half of the moved clusters moved by less
    than the standard error of their centroid, ``sigma_C(j) = sqrt(sse(j) / (v(j)
    (v(j) - 1)))``. Further steps on the same batch then mostly chase its sampling noise,
    while the doubled batch lowers the held-out energy by much more: on MNIST at
    ``k = 1,024`` with ``rho = 100`` the batch of 20,480 took 10 more steps (0.9 s) for
    0.2 points of held-out energy (percent above the best) after its ratios
    ``sigma_C / p`` had reached a median of 3; the doubling that followed gave 2.2.
    Measured (seed 0, one thread, nmbatch's own step time, held-out energy outside the
    clock, as ``python -m benchmarks.doubling_sweep`` does; docs/internals/algorithm.md,
    "The doubling rule"):
    seconds to 1% of the best energy, ``rho = 100, q = 5%`` against ``rho = 1, q = 50%``,
    MNIST ``k = 256`` 1.35 -> 0.64, ``k = 1,024`` 5.08 -> 3.00; patches ``k = 1,024``
    10.5 -> 4.8, ``k = 256`` 1.66 -> 3.39 (slower: see the design).
    """
    if not large_k_rho > 0:
        raise ValueError(f"large_k_rho must be > 0, got {large_k_rho}")
    if not sized_to_k(batch_size, n_clusters, per_cluster):
        return float(rho)
    return min(float(rho), float(large_k_rho))


def doubling_allowance(
    batch_size: int,
    n_clusters: int,
    per_cluster: int = B0_PER_CLUSTER,
    tolerance: float = DOUBLING_TOLERANCE,
) -> int:
    """How many clusters may fail the doubling test: ``floor(q k)`` when the first batch
    is sized to ``k`` (``per_cluster * k > batch_size``), else 0 (the paper's rule).

    The paper's test doubles when every moved cluster has ``sigma_C(j) / p(j) > rho``.
    With ``k`` in the thousands and tens of samples per cluster, some cluster nearly
    always still moves by more than ``sigma_C / rho`` (a sample joins or leaves it),
    so the batch stays at a fraction of the data for most of the run: on image patches
    at ``k = 1,024``, ``b = 81,920`` of 114,196 from 3.2 s to 12.5 s, and the held-out
    energy reaches 1% of the best only once the batch is the whole store. With
    ``rho = 100``, letting ``q = 5%`` of the clusters fail reached 1% 1.3x to 2.0x sooner
    (``q`` from 1% to 20% measured); with ``rho = 1`` (:func:`doubling_rho`), ``q = 50%``
    (the median cluster decides) was sooner than 25% on MNIST and patches at
    ``k = 1,024`` (3.00 s against 3.19 s, 4.8 s against 6.9 s; docs/internals/algorithm.md).
    ``k <= batch_size / per_cluster`` (``k = 50`` with the defaults) and
    ``per_cluster = 0`` keep the paper's test unchanged.
    """
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    if not sized_to_k(batch_size, n_clusters, per_cluster):
        return 0
    return math.floor(tolerance * int(n_clusters))
