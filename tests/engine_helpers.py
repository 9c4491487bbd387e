"""Reference implementations and invariant checks shared by the engine tests.

The references are plain numpy, written to match the engine's documented formulas:

- ``sqdist64_ref`` sums ``(float64(x) - float64(c))**2`` over the features *sequentially*
  (the order of ``engine.kernels.common.sqdist64``), so its values are bit-identical to the
  kernel's, and its argmin (ties to the lowest index, which ``np.argmin`` gives) is the
  engine's exact nearest centroid, whatever the data.
- ``check_step_invariants`` asserts what must hold after every ``step()`` of an algorithm
  that keeps one vote per sample (nmbatch, nmbatch.deact, elkan, lloyd; mbatch.remove over
  the samples it has drawn), for either metric (``algo.metric``): under ``"cosine"`` each
  centroid is the normalised mean of its rows (``centroids_ref``) and each reassigned row
  sits on its brute-force most similar centroid (``brute_most_similar``).
- ``row_state`` and ``check_retire_invariants``: what a ``retire()`` must keep (each
  retained row's label, bounds and norm, by stream id) and establish (votes of the
  retained prefix only, ``b`` within the retained count, sound bounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nmbatch.engine import NestedBatchStore


def sqdist64_ref(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``||X[i] - C[j]||^2`` summed sequentially in float64: ``(n, k)`` float64.

    X : (n, d) float32, C : (k, d) float32.
    """
    X64 = np.asarray(X, dtype=np.float64)
    C64 = np.asarray(C, dtype=np.float64)
    acc = np.zeros((X64.shape[0], C64.shape[0]), dtype=np.float64)
    for t in range(X64.shape[1]):
        diff = X64[:, t, None] - C64[None, :, t]
        acc = acc + diff * diff
    return acc


def brute_nearest(X: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact nearest centroid by brute force, ties to the lowest index.

    Returns ``labels`` ``(n,)`` int64 and ``sqdist`` ``(n,)`` float64.
    """
    D = sqdist64_ref(X, C)
    labels = np.argmin(D, axis=1) if D.shape[0] else np.empty(0, dtype=np.int64)
    return labels.astype(np.int64), D[np.arange(D.shape[0]), labels]


COS_TOLERANCE = 2.0**-21
"""How far below the largest cosine similarity a row's own centroid's may be. The engine
assigns by exact Euclidean distance; rows and centroids are unit within
``|| . ||^2 = 1 +- 2^-23``, so ``||x - c||^2 = 2 - 2 cos(x, c)`` within about ``2^-22``:
the Euclidean nearest is the most similar within ``2^-22``."""


def centroids_ref(S: np.ndarray, v: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The centroids the sums give and the clusters that have one: ``(k, d)`` float32
    (rows without one are 0) and ``(k,)`` bool. ``float32(S(j)/v(j))`` where ``v(j) > 0``;
    under ``"cosine"``, ``float32(S(j)/||S(j)||)`` (the norm summed sequentially in
    float64) where ``v(j) > 0`` and ``S(j) != 0``."""
    v64 = v.astype(np.float64)
    if metric != "cosine":
        has = v > 0
        scale = np.where(has, v64, 1.0)
    else:
        norm2 = np.zeros(S.shape[0], dtype=np.float64)
        for t in range(S.shape[1]):
            norm2 = norm2 + S[:, t] * S[:, t]
        has = (v > 0) & (norm2 > 0.0)
        scale = np.where(has, np.sqrt(norm2), 1.0)
    C = (S / scale[:, None]).astype(np.float32)
    C[~has] = 0.0
    return C, has


def brute_most_similar(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Cosine similarities ``x.c / (||x|| ||c||)`` in float64: ``(n, k)``."""
    X64 = np.asarray(X, dtype=np.float64)
    C64 = np.asarray(C, dtype=np.float64)
    X64 = X64 / np.linalg.norm(X64, axis=1, keepdims=True)
    C64 = C64 / np.linalg.norm(C64, axis=1, keepdims=True)
    return X64 @ C64.T


def filled_store(
    X: np.ndarray, *, seed: int = 0, capacity: int = 64, metric: str = "euclidean"
) -> NestedBatchStore:
    """A store holding the rows of ``X`` (appended in one call), tail shuffled by ``seed``."""
    store = NestedBatchStore(X.shape[1], seed=seed, capacity=capacity, metric=metric)
    store.append(X)
    return store


def assert_sums_are_means(
    S: np.ndarray,
    v: np.ndarray,
    X: np.ndarray,
    labels: np.ndarray,
    *,
    rtol: float = 1e-9,
    weights: np.ndarray | None = None,
) -> None:
    """``v(j)`` counts the rows labelled ``j`` and ``S(j)/v(j)`` is their mean.

    Rows with a negative label are ignored. ``X``: (n, d) float32, ``labels``: (n,).
    ``weights`` (n,) float64 (the weighted twin): ``v(j)`` is the sum of the weights of
    the rows labelled ``j`` (to ``rtol`` of the total weight: float sums in another
    order) and ``S(j)/v(j)`` their weighted mean; weight-0 rows count nowhere.
    """
    k = v.shape[0]
    seen = labels >= 0
    X64 = X.astype(np.float64)
    scale = max(float(np.abs(X64).max()) if X64.size else 0.0, 1e-300)
    if weights is None:
        counts = np.bincount(labels[seen], minlength=k)
        np.testing.assert_array_equal(v, counts)
        w = np.ones(labels.shape[0])
    else:
        w = weights
        counts = np.bincount(labels[seen], weights=w[seen], minlength=k)
        total = max(float(w[seen].sum()), 1.0)
        np.testing.assert_allclose(v, counts, rtol=rtol, atol=rtol * total)
    for j in range(k):
        if counts[j] == 0:
            atol = rtol * scale * max(float(w[seen].sum()), 1.0)
            np.testing.assert_allclose(S[j], 0.0, atol=atol)
            continue
        mine = labels == j
        mean = (w[mine, None] * X64[mine]).sum(axis=0) / w[mine].sum()
        np.testing.assert_allclose(S[j] / v[j], mean, rtol=rtol, atol=rtol * scale)


def prefix_weights(algo, b: int) -> np.ndarray | None:
    """The weights of the prefix rows ``[0, b)`` of a weighted store, else None."""
    return algo.store.weights()[:b] if algo.store.weighted else None


@dataclass
class Snapshot:
    """What a test needs from the state before a ``step()``.

    ``centroids`` is ``None`` when they are not known before the step (the first step of
    a k-means++ start picks them inside ``step()``).
    """

    centroids: np.ndarray | None
    labels: np.ndarray
    batch_size: int


def snapshot(algo) -> Snapshot:
    """Copies of the centroids in force for the next step, the labels, and ``b``.

    Before the first step they are the initial centroids: the explicit array, or the first
    ``k`` rows of the store for ``init="first"`` (the store's first rows cannot change
    before the step as long as nobody appends concurrently).
    """
    C: np.ndarray | None = algo.centroids.copy()
    if not algo.initialized:
        init = algo._init  # the engine keeps the init argument only privately
        if isinstance(init, np.ndarray):
            C = init.copy()
        elif init == "first":
            C = np.array(algo.store.data[: algo.n_clusters])
        else:
            C = None
    return Snapshot(C, algo.labels(), algo.batch_size)


def check_step_invariants(algo, before: Snapshot, *, all_revisited: bool = True) -> None:
    """Assert the one-sample-one-vote invariants after a ``step()``.

    - ``v`` sums to the number of voting rows and ``S(j)/v(j)`` is the exact mean
      (``1e-9`` relative) of the rows labelled ``j``;
    - the centroids are ``float32(S(j)/v(j))`` for non-empty clusters and unchanged for
      empty ones; under ``metric="cosine"`` (the rows unit vectors) ``float32(S(j)/||S(j)||)``,
      the normalised mean, and unchanged where ``S(j) = 0`` too (``centroids_ref``);
    - every row whose label changed (with ``all_revisited``: every row of the prefix) is
      labelled with its brute-force nearest centroid among ``before.centroids``, the
      centroids in force during the step, ties to the lowest index; except a row an
      empty cluster took after the update (``relocate_empty``): then it is the only
      sample of its cluster, whose centroid is the row itself, and there are as many
      such rows as the step says it relocated; and except the rows a cluster swap moved
      (``last_swaps``, :mod:`nmbatch.engine.algorithms.swap`): each is labelled with the
      swap's ``into`` (it came from ``merged``) or ``merged`` (it came from ``split``),
      and no row moved twice; under cosine that nearest centroid is also the most similar
      one, within ``COS_TOLERANCE``;
    - with bounds (``lower_bounds()`` non-empty): ``l(i, j) <= ||x(i) - c_before(j)||`` and
      ``l(i, j) - p(j) <= ||x(i) - c_new(j)||``, in float64.
    """
    b = algo.batch_size
    assert b >= before.batch_size
    assert b <= algo.store.n_samples
    X = np.array(algo.store.data[:b])
    labels = algo.labels()
    assert labels.shape == (b,)
    seen = labels >= 0
    if all_revisited:
        assert seen.all(), f"{int((~seen).sum())} prefix rows have no label (-1)"
    w = prefix_weights(algo, b)
    if w is None:
        assert int(algo.v.sum()) == int(seen.sum())
    else:  # the weighted twin: v sums to the weight of the voting rows
        np.testing.assert_allclose(algo.v.sum(), w[seen].sum(), rtol=1e-9)
    assert_sums_are_means(algo.S, algo.v, X, labels, weights=w)
    wb = np.ones(b) if w is None else w

    metric = getattr(algo, "metric", "euclidean")
    if metric == "cosine":
        norms2 = (X.astype(np.float64) ** 2).sum(axis=1)
        assert (np.abs(norms2 - 1.0) <= 2.0**-21).all(), "a stored row is not a unit vector"
    expected, nz = centroids_ref(algo.S, algo.v, metric)
    np.testing.assert_array_equal(algo.centroids[nz], expected[nz])
    if before.centroids is None:
        return
    np.testing.assert_array_equal(algo.centroids[~nz], before.centroids[~nz])

    old = np.full(b, -1, dtype=labels.dtype)
    old[: before.labels.shape[0]] = before.labels
    check = np.ones(b, dtype=bool) if all_revisited else old != labels
    swapped = [] if not hasattr(algo, "last_swaps") else algo.last_swaps
    moved_rows = np.concatenate([s.rows for s in swapped]) if swapped else np.empty(0, int)
    relocated = getattr(algo, "n_relocated", 0)  # empty clusters given a sample by the step
    if relocated:
        own = centroids_ref(X.astype(np.float64), np.ones(b, dtype=np.int64), metric)[0]
        alone = (algo.v[labels] == wb) & (algo.centroids[labels] == own).all(axis=1)
        alone[moved_rows] = False  # a swap's one-row part is not a relocation
        ref, _ = brute_nearest(X, before.centroids)
        moved = alone & (labels != ref)
        assert int(moved.sum()) <= relocated <= int(alone.sum())
        check &= ~alone
    assert np.unique(moved_rows).shape[0] == moved_rows.shape[0], "a row moved twice"
    for s in swapped:
        n_merged = int(np.count_nonzero(labels[s.rows] == s.into))
        assert n_merged + int(np.count_nonzero(labels[s.rows] == s.merged)) == s.rows.shape[0]
        assert algo.v[s.merged] >= 1 and algo.v[s.split] >= 1
    check[moved_rows] = False
    if check.any():
        ref, _ = brute_nearest(X[check], before.centroids)
        np.testing.assert_array_equal(labels[check], ref)
        if metric == "cosine":
            cos = brute_most_similar(X[check], before.centroids)
            own_cos = cos[np.arange(cos.shape[0]), labels[check]]
            assert (own_cos >= cos.max(axis=1) - COS_TOLERANCE).all(), "not the most similar"

    lower_bounds = getattr(algo, "lower_bounds", None)
    if lower_bounds is not None:
        lower = lower_bounds()
        if lower.shape[0]:
            assert lower.shape == (b, algo.n_clusters)
            assert lower.dtype == np.float32
            low = lower.astype(np.float64)
            dist_used = np.sqrt(sqdist64_ref(X, before.centroids))
            assert (low <= dist_used).all(), "a lower bound exceeds the distance it bounds"
            dist_new = np.sqrt(sqdist64_ref(X, algo.centroids))
            assert (low - algo.p[None, :] <= dist_new).all(), "l - p exceeds the new distance"

    upper_bounds = getattr(algo, "upper_bounds", None)
    if upper_bounds is not None and upper_bounds().shape[0]:
        # u(i) bounds the distance to the sample's centroid among those used in the step.
        d_own = np.sqrt(((X.astype(np.float64) - before.centroids[labels]) ** 2).sum(axis=1))
        assert (upper_bounds() >= d_own).all(), "an upper bound is below the distance it bounds"
    if getattr(algo, "name", "").startswith(("nmbatch", "elkan")):
        # sse(j) = sum of ||x(i) - c(j)||^2 over the samples of j, centroids of the step.
        resid = ((X.astype(np.float64) - before.centroids[labels].astype(np.float64)) ** 2).sum(1)
        sse = np.bincount(labels, weights=wb * resid, minlength=algo.n_clusters)
        scale = max(float(((X.astype(np.float64)) ** 2).sum()), 1.0)
        np.testing.assert_allclose(algo.sse, sse, rtol=1e-7, atol=1e-11 * scale)


def row_state(algo) -> dict[int, tuple]:
    """Per-row state of the prefix by stream id: ``{id: (row bytes, label, upper, lower)}``
    (``upper``/``lower`` None without bounds)."""
    b = algo.batch_size
    ids = algo.store.ids()[:b]
    X = np.array(algo.store.data[:b])
    labels = algo.labels()
    upper = getattr(algo, "upper_bounds", lambda: np.empty(0))()
    lower = getattr(algo, "lower_bounds", lambda: np.empty((0, 0)))()
    out = {}
    for r, i in enumerate(ids.tolist()):
        u = float(upper[r]) if upper.shape[0] else None
        low = lower[r].tobytes() if lower.shape[0] else None
        out[i] = (X[r].tobytes(), int(labels[r]), u, low)
    return out


def check_retire_invariants(algo, before: dict[int, tuple], retired: set[int]) -> None:
    """Assert what must hold after ``algo.retire(...)`` removed the ids ``retired``.

    ``before`` is ``row_state(algo)`` taken just before the call. The prefix holds exactly
    the ids of the old prefix that were not retired, each with its row, label and bounds
    unchanged; ``b`` is the store's and at most ``N``; ``v`` sums to the labelled rows and
    ``S(j)/v(j)`` is the mean of the retained prefix rows of ``j``; for nmbatch and elkan,
    once prefix rows left, ``sse(j)`` is their sum of squared distances to the current
    centroids (recomputed from the sums; untouched otherwise); bounds are
    sound for the current centroids (``l - p`` and ``u + p(a)``, as the next sweep uses
    them).
    """
    store = algo.store
    b = algo.batch_size
    assert b == store.batch_size <= store.n_samples
    assert not (set(store.ids().tolist()) & retired), "a retired id is still stored"
    after = row_state(algo)
    assert set(after) == set(before) - retired
    for i, state in after.items():
        assert state == before[i], f"the state of id {i} changed"
    X = np.array(store.data[:b])
    labels = algo.labels()
    w = prefix_weights(algo, b)
    if w is None:
        assert int(algo.v.sum()) == int((labels >= 0).sum())
    else:  # the weighted twin
        np.testing.assert_allclose(algo.v.sum(), w[labels >= 0].sum(), rtol=1e-9, atol=1e-9)
    assert_sums_are_means(algo.S, algo.v, X, labels, weights=w)
    wb = np.ones(b) if w is None else w
    np.testing.assert_array_equal(algo.counts, algo.v)
    if not algo.initialized or b == 0:
        return
    C = algo.centroids.astype(np.float64)
    X64 = X.astype(np.float64)
    if getattr(algo, "name", "").startswith(("nmbatch", "elkan")) and set(before) & retired:
        resid = ((X64 - C[labels]) ** 2).sum(1)
        sse = np.bincount(labels, weights=wb * resid, minlength=algo.n_clusters)
        scale = max(float((X64**2).sum()), 1.0)
        np.testing.assert_allclose(algo.sse, sse, rtol=1e-7, atol=1e-11 * scale)
    lower_bounds = getattr(algo, "lower_bounds", None)
    if lower_bounds is not None and lower_bounds().shape[0]:
        dist = np.sqrt(sqdist64_ref(X, algo.centroids))
        low = lower_bounds().astype(np.float64) - algo.p[None, :]
        assert (low <= dist).all(), "l - p exceeds the distance to a current centroid"
        up = (algo.upper_bounds() + algo.p[labels]) * (1 + 1e-12)
        assert (up >= dist[np.arange(b), labels]).all(), "u + p(a) below the distance"


def dense_state(n: int, k: int, d: int, width: int | None, seed: int, *, assigned: bool) -> dict:
    """The per-row and per-cluster arrays a dense pass takes, for ``n`` rows of ``d``
    dimensions and ``k`` centroids (``width``: bound columns, None: no bounds); with
    ``assigned``, a third of the rows hold a label and a distance (for ``remove``)."""
    rng = np.random.default_rng(seed)
    labels = np.full(n, -1, dtype=np.int32)
    if assigned:
        labels[::3] = rng.integers(0, k, labels[::3].shape[0])
    return {
        "labels": labels, "dist2": rng.random(n), "S": np.zeros((k, d)),
        "v": np.zeros(k, dtype=np.int64), "sse": np.zeros(k), "Q": np.zeros(k),
        "sqnorms": np.zeros(n),
        "lower_bounds": None if width is None else np.zeros((n, width), dtype=np.float32),
        "upper_bounds": None if width is None else np.zeros(n),
    }  # fmt: skip


def lockstep(algos: list, steps: int):
    """Step ``algos`` together (``check_step_invariants`` after each step of each);
    yields ``(algos, stats)`` after every step, until all have converged."""
    for _ in range(steps):
        stats = []
        for algo in algos:
            before = snapshot(algo)
            stats.append(algo.step())
            check_step_invariants(algo, before)
        yield algos, stats
        if all(s.converged for s in stats):
            return

