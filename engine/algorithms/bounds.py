"""nmbatch's per-sample lower bounds: one per centroid, one per group, or one in all.

- ``full``: ``k`` float32 bounds per sample (Elkan's; the paper's nmbatch): ``4 k`` bytes
  per sample, the tightest bounds, the fewest distances.
- ``group``: one bound per group of centroids (Yinyang k-means, Ding et al. 2015): ``4 G``
  bytes per sample, ``G = ceil(k / GROUP_SIZE)`` capped at ``MAX_GROUPS``.
- ``hamerly``: one bound on the distance to the second-nearest centroid (Hamerly 2010):
  4 bytes per sample, the group bounds with ``G = 1``.
- ``auto``: ``full`` while its ``4 k`` bytes per sample are no more than the sample's
  own row (``4 d`` bytes) or ``FULL_BOUNDS_MIN_BYTES``, i.e. ``k <= max(d, 256)``: small
  ``k`` (50) keeps the paper's bounds. For a larger ``k``, ``full`` while the bounds of
  the batch fit in ``FULL_BOUNDS_BUDGET`` bytes (they are the fastest, see below), then
  ``group`` for the rest of the run: when the batch's arrays grow past the budget, each
  sample's group bound becomes the smallest of its full bounds over the group's members
  other than its own centroid (:func:`full_to_group`), which is sound as they are.

Every mode gives the same assignments (the nearest centroid, decided exactly); only the
memory and the number of distances computed differ. Measured on 20,000 MNIST digits
(``benchmarks.bounds_memory``, 10 steps, a shared 2-core machine), full bounds
computed the fewest distances and were the fastest at k = 1,024 and 4,096: group
bounds took 1.4 to 2.3 times as long per revisit, with 10 and 16 times less memory
for the bounds; Hamerly's single bound took 4 to 9 times as long.

Groups are formed once per run, from the centroids in force when the first rows are
reserved (the initial ones, or those given to ``restore``), by a few Lloyd iterations on
the centroids themselves, seeded with ``G`` of them at evenly spaced indices (as Yinyang
groups them). Clustered groups rather than blocks of consecutive indices: a group bound
is the distance to the group's nearest member, so it only excludes a group whose
members are all far from the sample; with blocks of indices (random places in the data
under k-means++ or ``init="first"``) nearly every group holds a centroid near any
sample. Grouping is deterministic (seeded by the centroids' order), so a run stays
reproducible from its seed. An empty group takes the centroid farthest from its group's
centre (of a group with two or more), so every group has members and ``G`` is fixed.
"""

from __future__ import annotations

import math

import numpy as np

from nmbatch.engine.kernels import bound_sweep, reassign_rows, settle_assigned
from nmbatch.engine.kernels.grouped import (
    group_drift,
    group_sweep,
    reassign_grouped_rows,
    settle_assigned_grouped,
)

__all__ = [
    "BOUND_MODES",
    "FULL_BOUNDS_BUDGET",
    "FULL_BOUNDS_MIN_BYTES",
    "GROUP_SIZE",
    "MAX_GROUPS",
    "FullBounds",
    "GroupBounds",
    "check_bound_mode",
    "form_groups",
    "full_to_group",
    "make_bounds",
    "resolve_bound_mode",
]

BOUND_MODES = ("auto", "full", "group", "hamerly")
FULL_BOUNDS_MIN_BYTES = 1024
"""``auto`` keeps one bound per centroid while they take at most this many bytes per
sample, or the bytes of the sample's row if more (k <= max(d, 256))."""
FULL_BOUNDS_BUDGET = 1 << 30
"""``auto`` with a large ``k``: full bounds while those of the batch (at capacity) take at
most this many bytes (1 GiB: 262,144 samples at k = 1,024, 16,384 at k = 16,384)."""
GROUP_SIZE = 10
"""Centroids per group in ``group`` mode (Yinyang's ``k / 10``), up to ``MAX_GROUPS``."""
MAX_GROUPS = 256
"""Most groups: group bounds take at most 1 KiB per sample (64 KiB with full bounds at
k = 16,384)."""
GROUPING_ITERATIONS = 5  # Lloyd iterations on the centroids (Yinyang uses 5)


def check_bound_mode(mode: object) -> str:
    """``mode`` if it is one of ``BOUND_MODES``, else ``ValueError``."""
    if not isinstance(mode, str) or mode not in BOUND_MODES:
        raise ValueError(f"bounds must be one of {BOUND_MODES}, got {mode!r}")
    return mode


def resolve_bound_mode(mode: str, n_clusters: int, dim: int = 0) -> tuple[str, int]:
    """``(mode, G)``: ``auto`` resolved by ``k`` and ``d`` (``dim``), and the number of
    bounds per sample."""
    mode = check_bound_mode(mode)
    k = int(n_clusters)
    if mode == "auto":
        mode = "full" if 4 * k <= max(4 * int(dim), FULL_BOUNDS_MIN_BYTES) else "group"
    if mode == "full":
        return mode, k
    if mode == "hamerly":
        return mode, 1
    return mode, max(1, min(math.ceil(k / GROUP_SIZE), MAX_GROUPS, k))


def form_groups(
    C: np.ndarray, n_groups: int, iterations: int = GROUPING_ITERATIONS
) -> np.ndarray:
    """Split the centroids ``C`` (``(k, d)`` float32) into ``n_groups`` non-empty groups
    by Lloyd iterations on the centroids; returns ``group_of`` ``(k,)`` int32.

    Deterministic: seeded with the centroids at ``n_groups`` evenly spaced indices. The
    groups only steer which bounds are kept; any grouping gives sound bounds.
    """
    k = C.shape[0]
    G = max(1, min(int(n_groups), k))
    if G == 1:
        return np.zeros(k, dtype=np.int32)
    C = np.ascontiguousarray(C, dtype=np.float32)
    X = C.astype(np.float64)
    xx = np.einsum("ij,ij->i", X, X)
    centres = X[np.linspace(0, k - 1, G).round().astype(np.int64)].copy()
    group_of = np.zeros(k, dtype=np.int64)
    for _ in range(max(1, int(iterations))):
        dots = C @ centres.astype(np.float32).T  # float32 BLAS: grouping need not be exact
        D = xx[:, None] - 2.0 * dots + np.einsum("ij,ij->i", centres, centres)
        group_of = np.argmin(D, axis=1)
        own = D[np.arange(k), group_of]
        _fill_empty_groups(group_of, own, G)
        counts = np.bincount(group_of, minlength=G)  # every group non-empty
        order = np.argsort(group_of, kind="stable")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        centres = np.add.reduceat(C[order], starts, axis=0, dtype=np.float64) / counts[:, None]
    return group_of.astype(np.int32)


def _fill_empty_groups(group_of: np.ndarray, own: np.ndarray, G: int) -> None:
    """Each empty group takes the centroid farthest from its own group's centre (of a
    group that keeps another member; ties: lowest index). ``own``: (k,) squared
    distances to the group centres, set to -inf for the centroids taken."""
    counts = np.bincount(group_of, minlength=G)
    for g in np.flatnonzero(counts == 0):
        order = np.lexsort((np.arange(own.shape[0]), -own))
        j = next(int(j) for j in order if counts[group_of[j]] >= 2)
        counts[group_of[j]] -= 1
        counts[g] += 1
        group_of[j] = g
        own[j] = -np.inf


class FullBounds:
    """One float32 lower bound per centroid (:mod:`..kernels.bounded`); with a ``budget``
    (``auto``), group bounds once the batch's bounds would pass it (:meth:`too_big`)."""

    mode = "full"
    group_of = None  # the dense pass writes one bound per centroid

    def __init__(self, n_clusters: int, budget: float | None = None, dim: int = 0) -> None:
        self.width = int(n_clusters)
        self.budget = budget
        self.dim = int(dim)

    def too_big(self, capacity: int) -> bool:
        """True when ``capacity`` rows of full bounds would pass the budget."""
        return self.budget is not None and 4.0 * self.width * capacity > self.budget

    def to_groups(
        self, lower: np.ndarray, labels: np.ndarray, n: int, C: np.ndarray
    ) -> tuple[GroupBounds, np.ndarray]:
        """Group bounds (groups formed from the centroids ``C``) and the ``(n, G)`` group
        bounds of the first ``n`` rows of ``lower``, from their full bounds."""
        k = self.width
        bounds = GroupBounds("group", k, resolve_bound_mode("group", k, self.dim)[1])
        bounds.prepare(C)
        return bounds, full_to_group(lower[:n], labels[:n], bounds)

    def prepare(self, C: np.ndarray) -> None:
        """Nothing to form."""

    def sweep(self, p, labels, upper, lower):
        """:func:`~nmbatch.engine.kernels.bounded.bound_sweep`."""
        return bound_sweep(p, labels, upper, lower)

    def settle(self, X, rows, C, g, labels, upper, lower, s_assigned):
        """:func:`~nmbatch.engine.kernels.bounded.settle_assigned`."""
        return settle_assigned(X, rows, C, g, labels, upper, lower, s_assigned)

    def reassign(self, X, rows, C, p, *, labels, upper, lower, S, v, Q, assigned_sqdist,
                 weights=None):
        """:func:`~nmbatch.engine.kernels.bounded.reassign_rows`."""
        return reassign_rows(
            X, rows, C, labels=labels, upper_bounds=upper, lower_bounds=lower,
            S=S, v=v, Q=Q, assigned_sqdist=assigned_sqdist, weights=weights,
        )

    def expand(self, lower: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The bounds as ``(n, k)`` float32 (a copy)."""
        return lower.copy()

    def relocation_bounds(self, lower: np.ndarray) -> None:
        """None: a per-centroid bound stays valid when the sample changes cluster."""
        return None


class GroupBounds:
    """One float32 lower bound per group of centroids (:mod:`..kernels.grouped`)."""

    def __init__(self, mode: str, n_clusters: int, n_groups: int) -> None:
        self.mode = mode
        self.n_clusters = int(n_clusters)
        self.width = int(n_groups)
        self.group_of: np.ndarray | None = None
        self._pmax = np.zeros(self.width, dtype=np.float64)

    def too_big(self, capacity: int) -> bool:
        """False: group bounds are kept whatever the batch."""
        return False

    def prepare(self, C: np.ndarray) -> None:
        """Form the groups from the centroids ``C`` (``(k, d)`` float32), once."""
        if self.group_of is not None:
            return
        self.group_of = form_groups(C, self.width)
        self.members = np.argsort(self.group_of, kind="stable").astype(np.int32)
        self.sizes = np.bincount(self.group_of, minlength=self.width).astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.position = np.empty(self.n_clusters, dtype=np.int64)  # of j in members
        self.position[self.members] = np.arange(self.n_clusters)

    def sweep(self, p, labels, upper, lower):
        """:func:`~nmbatch.engine.kernels.grouped.group_sweep` (``pmax`` kept for the
        reassignment that follows)."""
        self._pmax = group_drift(p, self.group_of, self.width)
        return group_sweep(p, self._pmax, self.group_of, self.sizes, labels, upper, lower)

    def settle(self, X, rows, C, g, labels, upper, lower, s_assigned):
        """:func:`~nmbatch.engine.kernels.grouped.settle_assigned_grouped`."""
        return settle_assigned_grouped(
            X, rows, C, g, self.group_of, self.sizes, labels, upper, lower, s_assigned
        )

    def reassign(self, X, rows, C, p, *, labels, upper, lower, S, v, Q, assigned_sqdist,
                 weights=None):
        """:func:`~nmbatch.engine.kernels.grouped.reassign_grouped` (after :meth:`sweep`)."""
        return reassign_grouped_rows(
            X, rows, C, group_of=self.group_of, members=self.members, starts=self.starts,
            p=p, pmax=self._pmax, labels=labels, upper_bounds=upper, lower_bounds=lower,
            S=S, v=v, Q=Q, assigned_sqdist=assigned_sqdist, weights=weights,
        )

    def expand(self, lower: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The bound each centroid gets from its group, ``(n, k)`` float32; 0 (no bound
        kept) for the sample's own centroid."""
        if self.group_of is None:
            return np.zeros((lower.shape[0], self.n_clusters), dtype=np.float32)
        out = lower[:, self.group_of]
        rows = np.flatnonzero(labels >= 0)
        out[rows, labels[rows]] = 0.0
        return out

    def relocation_bounds(self, lower: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, group_of)`` for :func:`.relocation.relocate_empty`: a relocated
        sample's old cluster joins what its group bound covers."""
        return lower, self.group_of


def full_to_group(lower: np.ndarray, labels: np.ndarray, groups: GroupBounds) -> np.ndarray:
    """``out[i, g] = min { lower[i, j] : j in g, j != labels[i] }`` (``FLT_MAX`` if none):
    ``(n, G)`` float32 from full bounds ``(n, k)`` float32, in blocks of rows."""
    n = lower.shape[0]
    out = np.empty((n, groups.width), dtype=np.float32)
    starts = groups.starts[:-1]
    for lo in range(0, n, _CONVERT_ROWS):
        block = lower[lo : lo + _CONVERT_ROWS][:, groups.members]  # columns by group
        rows = np.arange(block.shape[0])
        own = groups.position[labels[lo : lo + _CONVERT_ROWS]]
        block[rows, own] = np.finfo(np.float32).max
        out[lo : lo + block.shape[0]] = np.minimum.reduceat(block, starts, axis=1)
    return out


_CONVERT_ROWS = 4096  # rows per block of full_to_group


def make_bounds(mode: str, n_clusters: int, dim: int = 0) -> FullBounds | GroupBounds:
    """The bounds of ``mode`` (one of ``BOUND_MODES``) for ``n_clusters`` centroids of
    ``dim`` features (``auto`` with a large ``k``: full bounds with a budget)."""
    resolved, width = resolve_bound_mode(mode, n_clusters, dim)
    if mode == "auto" and resolved == "group":
        return FullBounds(n_clusters, FULL_BOUNDS_BUDGET, dim)
    if resolved == "full":
        return FullBounds(n_clusters)
    return GroupBounds(resolved, n_clusters, width)
