"""The streaming methods of the drift benchmark, each fed the same chunks in stream order.

Every method has ``update(X, now)`` (one chunk ``X``, ``(m, d)`` float32, in stream order;
``now``: the chunk's time on the stream clock, seconds) and ``centroids()`` (``(k, d)``
float64, the model it serves now). The benchmark times ``update`` only.

- ``nmbatch.window`` / ``nmbatch.age``: ``NestedMiniBatchKMeans(retention="window",
  max_samples=W)`` / ``(retention="age", max_age_seconds=(W - chunk/2) / rate)``, one
  ``partial_fit(X, now=now)`` per chunk (its defaults otherwise: ``rho = 100``, initial
  batch 5,000, k-means++ on the first batch, cluster swaps on, up to 3 further iterations
  per call while each reassigns over 1% of the batch: ``catch_up``). Chunk times are multiples of
  ``chunk / rate``, so the age window holds the last ``W`` samples when ``chunk``
  divides ``W``, like ``window``; the half chunk keeps the comparison ``t + age <= now``
  off the floating-point tie at exactly ``W / rate``. ``nmbatch.window.noswap``: the
  window with ``swap_clusters=False``, to show what the swaps do in the same run;
  ``nmbatch.window.nocatchup``: with ``catch_up=0`` (one iteration per chunk).
- ``sklearn.minibatch``: ``MiniBatchKMeans(n_init=1).partial_fit(X)`` per chunk (k-means++
  on the first chunk, its default reassignment of small clusters; it never forgets).
- ``spark-decay``: the update rule of Spark MLlib's ``StreamingKMeansModel.update``
  re-implemented in numpy (see :class:`SparkDecay`), ``halfLife = W/2`` points.
- ``river.kmeans``: ``river.cluster.KMeans`` (``c(j) += halflife (x - c(j))`` for the
  nearest ``c(j)``, one sample at a time). River's ``halflife`` is a step size; it is set
  so that a centroid's weights halve every ``W/(2k)`` of its own updates, the number a
  window of ``W`` gives each of ``k`` clusters in half its length:
  ``halflife = 1 - 2^(-2k/W)``. River learns one ``dict`` per sample, too slowly to run
  every stream here; :class:`RiverReplay` plays its exact rule in numba over the whole
  stream, is checked against river itself on the stream's first samples
  (:func:`river_check`), and river's own ``learn_one`` gives the throughput.

Spark-decay and river start from the k-means++ seeding (scikit-learn's
``kmeans_plusplus``) of the first chunk; the others seed themselves on it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numba
import numpy as np

__all__ = [
    "METHODS",
    "NmbatchStream",
    "RiverReplay",
    "SklearnMiniBatch",
    "SparkDecay",
    "make_method",
    "river_check",
    "river_step",
    "spark_decay_factor",
    "warm_up",
]

METHODS = (
    "nmbatch.window",
    "nmbatch.age",
    "nmbatch.window.noswap",
    "nmbatch.window.nocatchup",
    "sklearn.minibatch",
    "spark-decay",
    "river.kmeans",
)


def _seed_centroids(X: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means++ seeding of ``X`` (scikit-learn's): ``(k, d)`` float64."""
    from sklearn.cluster import kmeans_plusplus

    C, _ = kmeans_plusplus(np.asarray(X, dtype=np.float64), k, random_state=seed)
    return C


class NmbatchStream:
    """``NestedMiniBatchKMeans`` with a ``window`` or ``age`` retention, one ``partial_fit``
    per chunk. ``batch_size`` and ``empty`` (clusters with no vote) describe the last step."""

    def __init__(
        self,
        retention: str,
        k: int,
        window: int,
        rate: float,
        seed: int,
        chunk: int,
        swap: bool = True,
        catch_up: int | str = "auto",
    ) -> None:
        from nmbatch.engine import NestedMiniBatchKMeans

        age = retention == "age"
        self.name = f"nmbatch.{retention}" + ("" if swap else ".noswap")
        self.name += "" if catch_up == "auto" else ".nocatchup"
        self.batch_size = 0
        self.empty = 0
        self.est = NestedMiniBatchKMeans(
            n_clusters=k,
            random_state=seed,
            retention=retention,
            max_samples=None if age else window,
            max_age_seconds=(window - chunk / 2) / rate if age else None,
            swap_clusters=swap,
            catch_up=catch_up,
            callback=self._watch,
        )

    def _watch(self, stats: Any, state: Any) -> None:
        self.batch_size = int(stats.batch_size)
        self.empty = int(np.count_nonzero(state.counts == 0))

    def update(self, X: np.ndarray, now: float) -> None:
        self.est.partial_fit(X, now=now)

    def centroids(self) -> np.ndarray:
        return np.asarray(self.est.cluster_centers_, dtype=np.float64)

    def diagnostics(self) -> dict[str, int]:
        return {
            "batch_size": self.batch_size,
            "empty_clusters": self.empty,
            "retained": int(self.est.n_samples_retained_),
        }


class SklearnMiniBatch:
    """scikit-learn's ``MiniBatchKMeans.partial_fit``, one call per chunk."""

    name = "sklearn.minibatch"

    def __init__(self, k: int, seed: int) -> None:
        from sklearn.cluster import MiniBatchKMeans

        self.est = MiniBatchKMeans(n_clusters=k, n_init=1, random_state=seed)

    def update(self, X: np.ndarray, now: float) -> None:
        self.est.partial_fit(X)

    def centroids(self) -> np.ndarray:
        return np.asarray(self.est.cluster_centers_, dtype=np.float64)


def spark_decay_factor(half_life_points: float) -> float:
    """Spark's ``setHalfLife(h, "points")``: ``decayFactor = exp(log(0.5) / h)``."""
    return float(np.exp(np.log(0.5) / half_life_points))


class SparkDecay:
    """The update of Spark MLlib's ``StreamingKMeansModel`` (time unit ``points``), in numpy.

    For a chunk of ``m`` points, all assigned to the centroids as they were before it:
    ``w <- w * a^m`` (``a`` the decay factor); then for each centroid ``j`` with ``n_j > 0``
    points of sum ``s_j``: ``w' = w_j + n_j``, ``lambda = n_j / max(w', 1e-16)``,
    ``c_j <- (1 - lambda) c_j + lambda s_j / n_j``, ``w_j <- w'``. Then, if the smallest
    weight is below ``1e-8`` times the largest, that "dying" centroid takes the largest
    one's place: both get weight ``(w_max + w_min) / 2`` and centres ``c_max (1 +- 1e-14)``
    (Spark's perturbation ``1e-14 max(|x|, 1)`` per coordinate). float64 throughout.

    ``centers`` ``(k, d)`` and ``weights`` ``(k,)`` may be given; otherwise the k-means++
    seeding of the first chunk, with weights 0, starts it.
    """

    name = "spark-decay"

    def __init__(
        self,
        k: int,
        half_life_points: float,
        seed: int,
        centers: np.ndarray | None = None,
        weights: np.ndarray | None = None,
    ) -> None:
        self.k, self.seed = k, seed
        self.decay = spark_decay_factor(half_life_points)
        self.centers = None if centers is None else np.array(centers, dtype=np.float64)
        self.weights = np.zeros(k) if weights is None else np.array(weights, dtype=np.float64)

    def update(self, X: np.ndarray, now: float) -> None:
        X = np.asarray(X, dtype=np.float64)
        if self.centers is None:
            self.centers = _seed_centroids(X, self.k, self.seed)
        C = self.centers
        d2 = (X * X).sum(1)[:, None] - 2.0 * (X @ C.T) + (C * C).sum(1)[None, :]
        closest = np.argmin(d2, axis=1)
        onehot = np.zeros((X.shape[0], self.k))
        onehot[np.arange(X.shape[0]), closest] = 1.0
        count = onehot.sum(0)
        sums = onehot.T @ X
        self.weights *= self.decay ** X.shape[0]
        hit = count > 0
        updated = self.weights[hit] + count[hit]
        lam = count[hit] / np.maximum(updated, 1e-16)
        self.weights[hit] = updated
        C[hit] = (1.0 - lam)[:, None] * C[hit] + (lam / count[hit])[:, None] * sums[hit]
        largest, smallest = int(np.argmax(self.weights)), int(np.argmin(self.weights))
        w_max, w_min = self.weights[largest], self.weights[smallest]
        if w_min < 1e-8 * w_max:
            self.weights[largest] = self.weights[smallest] = (w_max + w_min) / 2.0
            x = C[largest].copy()
            p = 1e-14 * np.maximum(np.abs(x), 1.0)
            C[largest], C[smallest] = x + p, x - p

    def centroids(self) -> np.ndarray:
        return np.array(self.centers, dtype=np.float64)


@numba.njit(cache=True)
def river_step(C: np.ndarray, X: np.ndarray, step: float) -> None:  # pragma: no cover - JIT
    """River's ``KMeans.learn_one`` for each row of ``X`` in order, in place on ``C``.

    ``C`` (k, d) float64; ``X`` (m, d) float64. For each ``x``: ``j`` = the first index of
    the least ``sum_i (c(j, i) - x(i))^2`` (summed left to right, as river sums), then
    ``c(j) += step (x - c(j))``.
    """
    k, d = C.shape
    for r in range(X.shape[0]):
        best, bj = np.inf, 0
        for j in range(k):
            s = 0.0
            for i in range(d):
                t = abs(C[j, i] - X[r, i])
                s += t * t
            if s < best:
                best, bj = s, j
        for i in range(d):
            C[bj, i] += step * (X[r, i] - C[bj, i])


def river_halflife(k: int, window: int) -> float:
    """River's ``halflife`` (a step) whose weights halve every ``W/(2k)`` own updates."""
    return float(1.0 - 2.0 ** (-2.0 * k / window))


class RiverReplay:
    """River's ``cluster.KMeans`` rule played by :func:`river_step` (exactly the same
    arithmetic, in float64), starting from the k-means++ seeding of the first chunk."""

    name = "river.kmeans"

    def __init__(self, k: int, window: int, seed: int) -> None:
        self.k, self.seed = k, seed
        self.step = river_halflife(k, window)
        self.centers: np.ndarray | None = None

    def update(self, X: np.ndarray, now: float) -> None:
        X = np.asarray(X, dtype=np.float64)
        if self.centers is None:
            self.centers = _seed_centroids(X, self.k, self.seed)
        river_step(self.centers, X, self.step)

    def centroids(self) -> np.ndarray:
        return np.array(self.centers, dtype=np.float64)


def _river_model(C0: np.ndarray, step: float, seed: int) -> Any:
    from river import cluster

    model = cluster.KMeans(n_clusters=C0.shape[0], halflife=step, seed=seed)
    # River starts from N(mu, sigma) per coordinate; it starts here from C0 instead.
    for j in range(C0.shape[0]):
        model.centers[j] = defaultdict(model.centers[j].default_factory, enumerate(C0[j].tolist()))
    return model


def river_check(X: np.ndarray, chunk: int, k: int, window: int, seed: int) -> dict[str, Any]:
    """River itself on the rows ``X`` ``(m, d)`` (the stream's first ``m``), started like
    :class:`RiverReplay` from the k-means++ seeding of ``X[:chunk]``: the rate of its
    ``learn_one`` calls (vectors/s; building the dicts is timed apart) and the largest
    difference between its centroids and :class:`RiverReplay`'s after the same rows."""
    try:
        import river
    except ImportError:
        return {"available": False, "note": "river is not installed (pip install river)"}
    replay = RiverReplay(k, window, seed)
    replay.centers = _seed_centroids(X[:chunk], k, seed)
    model = _river_model(replay.centers, replay.step, seed)
    replay.update(X, 0.0)
    t0 = time.perf_counter()
    rows = [dict(enumerate(x)) for x in np.asarray(X, dtype=np.float64).tolist()]
    t1 = time.perf_counter()
    for x in rows:
        model.learn_one(x)
    t2 = time.perf_counter()
    C = np.array([[model.centers[j][i] for i in range(X.shape[1])] for j in range(k)])
    return {
        "available": True,
        "version": river.__version__,
        "samples": int(X.shape[0]),
        "seconds": t2 - t1,
        "vectors_per_s": X.shape[0] / (t2 - t1),
        "vectors_per_s_with_dicts": X.shape[0] / (t2 - t0),
        "max_abs_diff_vs_replay": float(np.max(np.abs(C - replay.centers))),
    }


def make_method(name: str, *, k: int, window: int, chunk: int, rate: float, seed: int) -> Any:
    """One of :data:`METHODS`, fresh, for a window of ``W`` samples fed in chunks of
    ``chunk`` at ``rate`` samples per second of the stream clock."""
    if name.startswith("nmbatch.") and name in METHODS:
        swap = not name.endswith(".noswap")
        catch_up = 0 if name.endswith(".nocatchup") else "auto"
        return NmbatchStream(name.split(".")[1], k, window, rate, seed, chunk, swap, catch_up)
    if name == "sklearn.minibatch":
        return SklearnMiniBatch(k, seed)
    if name == "spark-decay":
        return SparkDecay(k, window / 2.0, seed)
    if name == "river.kmeans":
        return RiverReplay(k, window, seed)
    raise ValueError(f"unknown method {name!r}; choose from {METHODS}")


def warm_up(X: np.ndarray, k: int, names: list[str], rate: float, seed: int, threads: int) -> float:
    """Run every method of ``names`` untimed on the rows ``X`` ``(m, d)`` with a window of a
    third of them (numba compiles our kernels and the replay, retirements included), then
    limit the thread pools again (the JIT may load numba's OpenMP runtime); seconds."""
    from benchmarks.ours import jit_warmup
    from benchmarks.process import limit_threads

    t0 = time.perf_counter()
    jit_warmup(X, k)
    step = max(k, X.shape[0] // 6)
    for name in names:
        m = make_method(name, k=k, window=2 * step, chunk=step, rate=rate, seed=seed)
        for s in range(0, X.shape[0], step):
            m.update(X[s : s + step], s / rate)
        m.centroids()
    limit_threads(threads)
    return time.perf_counter() - t0
