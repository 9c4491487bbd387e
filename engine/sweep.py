"""Choosing ``k``: one fit per candidate ``k``, scored on rows the fits did not see.

:func:`sweep` splits the rows once (a uniform :data:`HOLDOUT` share held out, the same
split for every ``k``), fits :class:`~nmbatch.engine.estimator.NestedMiniBatchKMeans` on
the rest for each ``k``, and reports per ``k``:

- the **held-out energy**: the mean dissimilarity of the held-out rows to their nearest
  centroid (squared distance; ``1 - cos`` under ``metric="cosine"``). It keeps falling
  with ``k``, but flattens once ``k`` passes the structure of the data;
- the **silhouette** (Rousseeuw 1987) of a uniform sample of at most
  :data:`SILHOUETTE_ROWS` held-out rows (the same rows for every ``k``), labelled by
  their nearest centroid: :func:`silhouette`, plain numpy on their ``m x m`` distances
  (Euclidean; cosine distance under cosine), as scikit-learn's ``silhouette_score``;
- the training energy, iterations and seconds of the fit;

and a recommended ``k`` by the rule :data:`ELBOW_RULE` (:func:`elbow`). Log-log axes
make the rule free of the data's scale and of the spacing of the ks: without clusters
the energy of k-means falls about as a power of ``k`` (``k^(-2/d)``), a straight line
there, so the rule finds a bend only where the energy drops faster than that.
:class:`UniformSample` draws a uniform sample of bounded size from rows that arrive in
chunks (the service's retained samples, read from Redis).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from nmbatch.engine._validation import as_float32_matrix
from nmbatch.engine.assign import nearest
from nmbatch.engine.metric import check_metric, dissimilarity, metric_rows

__all__ = [
    "ELBOW_RULE",
    "HOLDOUT",
    "SILHOUETTE_ROWS",
    "SweepPoint",
    "SweepResult",
    "UniformSample",
    "elbow",
    "silhouette",
    "sweep",
]

HOLDOUT = 0.2
"""Share of the rows held out of every fit (drawn uniformly, once) to score it."""
SILHOUETTE_ROWS = 2000
"""Most held-out rows the silhouette is computed on (its cost: ``m^2 d``)."""
ELBOW_RULE = (
    "elbow of the held-out energy on log-log axes (Kneedle on ln k and ln E): with the "
    "ks sorted, x = ln k and y = ln E each scaled to [0, 1] between the first k and the "
    "last (y: 1 at the first, 0 at the last); the recommended k is the one farthest below "
    "the straight line from the first point to the last (the smaller k on a tie); none "
    "with fewer than 3 ks, or an energy that does not fall or is not positive"
)
"""The rule :func:`elbow` applies, in words (reported with every sweep)."""


@dataclass(frozen=True)
class SweepPoint:
    """One ``k`` of a sweep: ``heldout_energy`` and ``train_energy`` (mean dissimilarity
    of the held-out and the training rows), ``silhouette`` (None for ``k = 1`` or fewer
    than 2 clusters used), ``n_iter`` and ``seconds`` of the fit."""

    k: int
    heldout_energy: float
    train_energy: float
    silhouette: float | None
    n_iter: int
    seconds: float


@dataclass(frozen=True)
class SweepResult:
    """A sweep: its points (ks ascending), the recommended ``k`` (None: the rule found
    none), the rule, and the rows it used (``n_train`` fitted, ``n_heldout`` scored,
    ``n_silhouette`` of them in the silhouette)."""

    points: tuple[SweepPoint, ...]
    recommended_k: int | None
    rule: str
    n_train: int
    n_heldout: int
    n_silhouette: int
    metric: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the fields, ``points`` a list of dicts."""
        out = asdict(self)
        out["points"] = [asdict(p) for p in self.points]
        return out


def silhouette(X: np.ndarray, labels: np.ndarray, metric: str = "euclidean") -> float | None:
    """The mean silhouette coefficient of the rows of ``X`` under ``labels``.

    For row ``i`` of cluster ``l_i``: ``a(i)`` its mean distance to the other rows of
    ``l_i``, ``b(i)`` the lowest mean distance to the rows of another cluster,
    ``s(i) = (b - a) / max(a, b)``, and ``s(i) = 0`` for a row alone in its cluster (as
    scikit-learn's ``silhouette_score``). Distances: Euclidean, or ``1 - cos`` under
    ``metric="cosine"`` (rows made unit first). Work ``m^2 d`` and memory ``8 m^2`` bytes
    for ``m`` rows: for a sample (:data:`SILHOUETTE_ROWS`). None unless
    ``2 <= clusters used <= m - 1`` (where the coefficient is defined).

    X : (m, d) real   labels : (m,) int, any values
    """
    X = np.asarray(X, dtype=np.float64)
    _, lab = np.unique(np.asarray(labels), return_inverse=True)
    m, k = X.shape[0], int(lab.max()) + 1 if lab.size else 0
    if not 2 <= k <= m - 1:
        return None
    if check_metric(metric) == "cosine":
        U = X / np.linalg.norm(X, axis=1, keepdims=True)
        D = np.maximum(1.0 - U @ U.T, 0.0)
    else:
        sq = np.einsum("ij,ij->i", X, X)
        D = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (X @ X.T), 0.0))
    np.fill_diagonal(D, 0.0)
    onehot = np.zeros((m, k))
    onehot[np.arange(m), lab] = 1.0
    sums = D @ onehot  # (m, k): distance of row i to all rows of cluster c
    sizes = onehot.sum(axis=0)
    own = sizes[lab]
    a = sums[np.arange(m), lab] / np.maximum(own - 1.0, 1.0)
    means = sums / sizes
    means[np.arange(m), lab] = np.inf
    b = means.min(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(own > 1, (b - a) / np.maximum(a, b), 0.0)
    return float(np.nan_to_num(s).mean())


def elbow(ks: list[int] | tuple[int, ...], energies: list[float] | np.ndarray) -> int | None:
    """The ``k`` of :data:`ELBOW_RULE` for held-out ``energies`` at ``ks`` (any order)."""
    order = np.argsort(np.asarray(ks, dtype=np.int64), kind="stable")
    k = np.asarray(ks, dtype=np.float64)[order]
    e = np.asarray(energies, dtype=np.float64)[order]
    if k.size < 3 or not np.all(np.isfinite(e) & (e > 0)) or not e[0] > e[-1]:
        return None
    x = (np.log(k) - math.log(k[0])) / (math.log(k[-1]) - math.log(k[0]))
    y = (np.log(e) - math.log(e[-1])) / (math.log(e[0]) - math.log(e[-1]))
    below = (1.0 - x) - y  # the chord from (0, 1) to (1, 0), minus the curve
    return int(k[int(np.argmax(below))])


class UniformSample:
    """A uniform sample of at most ``size`` rows of a stream of chunks (bottom-k: each row
    draws a uniform key, the ``size`` smallest keys are kept).

    Memory: ``size`` rows, their keys and arrival numbers, plus the chunk offered. Work per
    chunk once full: ``O(size)`` comparisons, and the rows copied are only those that
    enter the sample (a row of the ``t``-th one seen does with probability ``size / t``).
    ``rng``: a generator or a seed. :meth:`rows` gives the sample in arrival order.
    """

    def __init__(self, size: int, rng: np.random.Generator | int | None = None) -> None:
        self.size = int(size)
        self.rng = np.random.default_rng(rng)
        self.seen = 0
        self.count = 0
        self._X: np.ndarray | None = None
        self._keys = np.empty(self.size)
        self._order = np.empty(self.size, dtype=np.int64)

    def offer(self, X: np.ndarray) -> None:
        """Offer the rows of ``X`` ``(n, d)`` (copied, as float32, where kept)."""
        n = X.shape[0]
        keys = self.rng.random(n)
        order = np.arange(self.seen, self.seen + n, dtype=np.int64)
        self.seen += n
        if self._X is None:
            self._X = np.empty((self.size, X.shape[1]), dtype=np.float32)
        fill = min(self.size - self.count, n)  # not full yet: every row is in the sample
        if fill:
            at = slice(self.count, self.count + fill)
            self._X[at], self._keys[at], self._order[at] = X[:fill], keys[:fill], order[:fill]
            self.count += fill
            X, keys, order = X[fill:], keys[fill:], order[fill:]
        if keys.size == 0 or self.size == 0:
            return
        enter = np.flatnonzero(keys < self._keys.max())  # only these can displace a row
        if enter.size == 0:
            return
        pool = np.concatenate([self._keys, keys[enter]])
        kept = np.argpartition(pool, self.size - 1)[: self.size]
        incoming = kept[kept >= self.size] - self.size  # positions in `enter`
        slots = np.setdiff1d(np.arange(self.size), kept[kept < self.size])  # leaving rows
        rows = enter[incoming]
        self._X[slots], self._keys[slots], self._order[slots] = X[rows], keys[rows], order[rows]

    def rows(self) -> np.ndarray:
        """The sample ``(m, d)`` float32, ``m = min(size, rows offered)``, in arrival order."""
        if self._X is None:
            return np.empty((0, 0), dtype=np.float32)
        order = np.argsort(self._order[: self.count], kind="stable")
        return np.ascontiguousarray(self._X[: self.count][order])


def sweep(
    X: np.ndarray,
    ks: list[int] | tuple[int, ...],
    *,
    holdout: float = HOLDOUT,
    silhouette_rows: int = SILHOUETTE_ROWS,
    random_state: int | None = None,
    metric: str = "euclidean",
    n_threads: int | None = None,
    **params: Any,
) -> SweepResult:
    """Fit each ``k`` of ``ks`` on a training split of ``X`` and score it (see the module).

    ``X`` ``(n, d)`` real, finite; every ``k`` at least 1 and at most the training rows
    (``ValueError`` otherwise). ``holdout`` in ``(0, 1)``: the share held out (drawn with
    ``random_state``, as the fits' seeds and the silhouette sample are). ``params`` go to
    :class:`~nmbatch.engine.estimator.NestedMiniBatchKMeans` (``batch_size``, ``init``,
    ``max_iter`` ...); ``n_threads`` bounds each fit's threads.
    """
    # The estimator (and scikit-learn) only when a sweep runs: the service imports this.
    from nmbatch.engine.estimator import NestedMiniBatchKMeans

    started = time.perf_counter()
    metric = check_metric(metric)
    A = metric_rows(as_float32_matrix(X, name="X"), metric, name="X")
    ks = sorted({int(k) for k in ks})
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout must be in (0, 1), got {holdout}")
    rng = np.random.default_rng(random_state)
    n = A.shape[0]
    n_held = round(holdout * n)
    perm = rng.permutation(n)
    train, held = A[np.sort(perm[n_held:])], A[np.sort(perm[:n_held])]
    if held.shape[0] == 0:
        raise ValueError(f"no row held out: {n} rows at holdout = {holdout}; more rows are needed")
    if not ks or ks[0] < 1 or ks[-1] > train.shape[0]:
        raise ValueError(f"every k must be in [1, {train.shape[0]}] (the training rows), "
                         f"got {ks}")  # fmt: skip
    sample = held[np.sort(rng.permutation(held.shape[0])[:silhouette_rows])]
    seed = int(rng.integers(0, 2**31)) if random_state is None else random_state
    points = []
    for k in ks:
        t0 = time.perf_counter()
        km = NestedMiniBatchKMeans(n_clusters=k, random_state=seed, metric=metric,
                                   n_threads=n_threads, **params).fit(train)  # fmt: skip
        C = km.cluster_centers_
        held_energy = float(dissimilarity(nearest(held, C, n_threads=n_threads)[1], metric).mean())
        labels = nearest(sample, C, n_threads=n_threads)[0]
        points.append(SweepPoint(
            k=k,
            heldout_energy=held_energy,
            train_energy=float(km.inertia_) / train.shape[0],  # already a dissimilarity
            silhouette=silhouette(sample, labels, metric),
            n_iter=int(km.n_iter_),
            seconds=time.perf_counter() - t0,
        ))  # fmt: skip
    return SweepResult(
        points=tuple(points),
        recommended_k=elbow(ks, [p.heldout_energy for p in points]),
        rule=ELBOW_RULE,
        n_train=int(train.shape[0]),
        n_heldout=int(held.shape[0]),
        n_silhouette=int(sample.shape[0]),
        metric=metric,
        seconds=time.perf_counter() - started,
    )
