"""Nested Mini-Batch K-Means with scikit-learn's estimator contract.

``NestedMiniBatchKMeans`` finds ``n_clusters`` centroids that minimise the mean squared
distance of the samples to their nearest centroid, like ``sklearn.cluster.KMeans``, but
with the ``nmbatch`` algorithm of Newling & Fleuret. Each iteration works on a *nested*
mini-batch: the first ``b`` samples of a shuffled copy of the data. A sample that was in
the batch at iteration ``t`` stays in it at ``t + 1``, so its distance bounds stay valid
and most of its distances need not be recomputed. Every sample in the batch counts
exactly once in its centroid (its old vote is removed before it is reassigned), so each
centroid is the exact mean of the batch samples assigned to it. The batch doubles when
the centroids move little compared with their statistical uncertainty (the ratio test
with threshold ``rho``), and the fit ends when the batch is the whole data set and no
assignment changes, which is a fixed point of Lloyd's algorithm. ``metric="cosine"`` makes
it spherical k-means: samples count as their directions, centroids are unit vectors, and
the objective is the sum of cosine dissimilarities (``nmbatch.engine.metric``).

The samples live in a ``NestedBatchStore`` (``float32``); ``partial_fit`` appends to it and
runs one iteration, so the model can follow a stream; ``retention`` bounds what the
stream leaves in the store (a sample that leaves takes its vote back exactly), and
``forget(ids)`` deletes samples by their arrival index, exactly, by the same mechanism
(``lookup(ids)`` tells where a sample stands).
``algorithm`` selects one of the engine's algorithms: the paper's baselines run behind
the same interface.

Symbols of the paper used here: ``b`` (the nested batch size, ``batch_size_``), ``rho``
(the doubling threshold), ``k`` (``n_clusters``), ``N`` (``n_samples_seen_``).

It is a scikit-learn ``BaseEstimator`` (``ClusterMixin``, ``TransformerMixin``): its
parameters, ``clone``, ``repr``, tags and parameter validation (``_parameter_constraints``
checked by ``_fit_context``) are scikit-learn's; the service never imports this module.
The class docstring lists the parameters in groups: k-means (``n_clusters`` ...
``callback``), the algorithm, the stream, and where it runs (``n_threads``, ``backend``).
"""


from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin, _fit_context

from nmbatch.engine._estimator_build import ModelBuildMixin
from nmbatch.engine._estimator_checks import (
    PARAMETER_CONSTRAINTS,
    check_callback,
    check_init,
    check_param_combinations,
    seed_sequence,
    spawn_seeds,
)
from nmbatch.engine._estimator_forget import ModelForgetMixin
from nmbatch.engine._estimator_pickle import PicklingMixin
from nmbatch.engine._estimator_use import ModelUseMixin
from nmbatch.engine._validation import as_sample_weight
from nmbatch.engine.algorithms import IterationStats
from nmbatch.engine.backend import RayBackend, ray_backend
from nmbatch.engine.hosting import LocalEngine, iterate, offer
from nmbatch.engine.metric import metric_rows
from nmbatch.engine.retention import catch_up_steps
from nmbatch.engine.state import ModelState
from nmbatch.engine.threads import with_kernel_threads

__all__ = ["Callback", "NestedMiniBatchKMeans", "RayBackend"]

#: ``callback(stats, state)``: called after every iteration; ``True`` stops ``fit``.
Callback = Callable[[IterationStats, ModelState], bool | None]


class NestedMiniBatchKMeans(
    ModelUseMixin,
    ModelBuildMixin,
    ModelForgetMixin,
    PicklingMixin,
    ClusterMixin,
    TransformerMixin,
    BaseEstimator,
):
    """K-means clustering by Nested Mini-Batch K-Means (``nmbatch``).

    See the module docstring for the idea.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of centroids ``k``. Must not exceed the number of samples given to ``fit``.
    metric : {"euclidean", "cosine"}, default="euclidean"
        ``"cosine"``: spherical k-means. Every input (``fit``, ``partial_fit``,
        ``predict``, ``transform``, ``score``) is divided by its norm first (a zero row
        is a ``ValueError`` naming it), ``cluster_centers_`` are unit vectors (each the
        direction of its cluster's sum), and ``inertia_``, ``score`` and ``transform``
        measure the cosine dissimilarity ``1 - cos`` (its sum, minus its sum, each
        centroid's); the seeding picks unit rows (k-means++ then samples by ``1 - cos``).
        The Ray backend runs ``"euclidean"`` only.
    init : str or array of shape (n_clusters, n_features), default="auto"
        One of ``"auto"``, ``"k-means++"``, ``"k-means++.sub"``, ``"k-means||"``,
        ``"afk-mc2"``, ``"random"``, ``"first"`` (``nmbatch.engine.seeding.SEEDINGS``),
        or the initial centroids themselves. The methods choose rows of the first batch (``b_0``
        rows of the shuffled data; ``random_state`` seeds the choice) inside the first
        ``fit`` step, so their time counts (docs/library.md has a table, measured in
        docs/benchmarks/seeding.md). ``"auto"``: greedy k-means++ on
        ``max(5000, 16 k)`` rows of the first batch while its work is at most ``6e9``
        float32 multiply-adds (``k <= 128`` at ``d = 784``, ``k <= 256`` at
        ``d = 108``-``384``), else k-means++ with one trial per centroid on ``4 k`` rows
        (``engine/seeding``: ``auto_plan``; the rule and the measurements behind it, seeding
        inside the clock, are in docs/benchmarks/seeding.md).
        ``"k-means++.sub"``: greedy k-means++ on ``4 k`` uniform rows of the first batch.
        ``"k-means++"``: greedy k-means++ (``2 + ln k`` trials per centroid) on the whole
        first batch, ``b_0 k (2 + ln k)`` distances (0.2 s at ``k = 50``; 25 s at
        ``k = 1,024``): the best start, worth its cost at small ``k`` or for long fits.
        ``"random"``: ``k`` distinct uniform rows, no cost; fastest on MNIST, but on data
        with dense regions (image patches) the fit from it stayed 3-8% above the best
        energy. ``"first"``: the first ``k`` rows (the paper's protocol; the
        distribution of ``"random"``). ``"k-means||"``: k-means‖ (Bahmani et al. 2012;
        ``l = 2k``, 5 rounds, weighted k-means++ on the candidates). ``"afk-mc2"``:
        AFK-MC² (Bachem et al. 2016; chains of 200, ``100 k^2`` distances).
    max_iter : int, default=300
        Maximum number of iterations of one ``fit`` call.
    batch_size : int, default=5000
        Initial batch size ``b_0`` (nested algorithms: at least ``20 k``) or the fixed
        mini-batch size (``mbatch``, ``mbatch.remove``). Capped at the number of samples.
    random_state : int, numpy.random.RandomState, numpy.random.Generator or None, default=None
        Source of all randomness (the shuffle of the store and the seeding). An int makes
        ``fit`` reproducible.
    rho : float, default=100.0
        Doubling threshold: the nested batch doubles (``b <- min(2b, N)``) when, for every
        cluster, the standard error of its centroid is more than ``rho`` times the distance
        the centroid just moved. Where the first batch is raised to ``20 k`` the test
        takes ``min(rho, 1)`` and half of the clusters need to pass (the median moved
        cluster decides; ``engine/algorithms/growth.py``). Large values (the paper uses
        100) keep the batch small for longer. Used by ``nmbatch`` and ``nmbatch.deact``.
    callback : callable ``callback(stats, state) -> bool | None`` or None, default=None
        Called after every iteration with what the step did (``IterationStats``: iteration,
        batch size, assignments changed, distances computed, ...) and the model it left
        (``ModelState``: centroids ``(k, d)`` float32, counts ``(k,)`` int64, ``b``, ``N``,
        the energy estimate; read-only, copy an array to keep it). In ``fit`` it runs before
        the fitted attributes are set; returning ``True`` (exactly ``True``, so a function
        that returns a count or a string does not stop by accident) ends the fit after that
        iteration, which then describes the model as it stands, as ``max_iter`` would. In
        ``partial_fit`` it runs after each iteration, once the fitted attributes are set,
        and its return value is ignored. An exception it raises propagates. Not part of the
        model: ``partial_fit`` accepts a new callback. It is pickled with the estimator, so an
        estimator to pickle needs a module-level function (or None), not a lambda.
    algorithm : str, default="nmbatch"
        One of ``nmbatch.engine.ALGORITHMS``: ``"nmbatch"``, ``"nmbatch.deact"`` (bound test
        off), ``"mbatch"`` (Sculley's mini-batch k-means), ``"mbatch.remove"`` (mini-batch with
        removal of old votes), ``"lloyd"`` and ``"elkan"`` (exact full-batch algorithms).
    bounds : {"auto", "full", "group", "hamerly"}, default="auto"
        Lower bounds each sample keeps (``nmbatch``): one per centroid (4k bytes per sample),
        one per group of about ten centroids, or one; ``auto``: full while k <= max(d, 256)
        or the batch's bounds fit in 1 GiB, then group. The centroids are the same; memory
        and speed differ.
    relocate_empty : bool, default=True
        After each update, a cluster left without samples takes the batch's sample farthest
        from its own centroid (its vote moved exactly; as scikit-learn relocates empty
        clusters). False keeps an empty cluster's centroid where it was (the paper's
        protocol). mbatch and mbatch.remove never relocate.
    swap_clusters : {"auto"} or bool, default="auto"
        After each update (``nmbatch``), the cluster cheapest to merge into its nearest
        neighbour leaves its place to split the cluster whose 2-means split gains most, when
        the gain exceeds the cost, so the batch's energy falls (a local-search swap; votes
        move exactly; ``nmbatch.engine.algorithms.swap``). It lets a window follow a
        distribution that moves: clusters of the old one no longer hold centroids while the
        new one is crowded under too few, and at large ``k`` it leaves the fixed points
        where the exact peers stop (docs/bench/large-k/). ``"auto"``: on with ``retention``
        ``"window"`` or ``"age"`` and when ``20 * n_clusters > batch_size`` (the first batch
        sized to ``k``), off otherwise (the paper's algorithm, as at ``k = 50``).
        The Ray backend makes no swaps.
    retention : {"all", "window", "age", "reservoir"}, default="all"
        Which samples of the stream ``partial_fit`` keeps (``nmbatch.engine.retention``):
        all (``max_samples``, if set, is a capacity: a chunk that would pass it raises a
        ``ValueError``), the last ``max_samples`` (``window``), those given less than
        ``max_age_seconds`` ago (``age``, optionally also at most ``max_samples``; the time of
        a chunk is ``partial_fit``'s ``now`` or ``time.time()``), or a uniform random sample of
        ``max_samples`` of all (``reservoir``, Vitter's algorithm R). The model is then the
        k-means of the retained samples. ``fit`` clusters all of its ``X``; the policy applies
        from the end of the fit (its rows are the first of the stream). Not with ``mbatch``,
        which cannot forget exactly.
    max_samples : int or None, default=None
        Size of the window or the reservoir, or the capacity; at least ``n_clusters``.
    max_age_seconds : float or None, default=None
        Age limit of ``retention="age"``.
    catch_up : {"auto"} or int, default="auto"
        Further iterations ``partial_fit`` may run after the chunk's own, each only while
        the one before reassigned more than 1% of the batch (cluster swaps included) or
        relocated an empty cluster: after the stream changes, the
        model catches up with the k-means of what it retains within a few chunks, then runs
        one iteration per chunk again. ``"auto"``: 3 with ``retention`` ``"window"`` or
        ``"age"``, 0 otherwise (one iteration per call).
    n_threads : int or None, default=None
        Threads of the kernels during ``fit``, ``partial_fit``, ``predict``, ``transform``
        and ``score``; BLAS gets one while iterating (as in scikit-learn's k-means) and
        ``n_threads`` otherwise (``nmbatch.engine.threads``). None: every core the process
        may use (as scikit-learn counts them). The model does not depend on it, bit for bit.
        With the Ray backend: the threads of each shard's kernels (None: all of its node's).
    backend : {"local", "ray"}, RayBackend or None, default="local"
        Where ``fit`` runs: here (``"local"`` or None), or on Ray actors as the given
        ``nmbatch.engine.RayBackend(address=..., n_shards=...)`` says (``"ray"``:
        ``RayBackend()``, two shards on the Ray of this process or a local one;
        ``nmbatch[ray]``; ``nmbatch.engine.distributed``): the same model for the same
        ``random_state``. The Ray backend runs ``algorithm="nmbatch"`` with
        ``retention="all"``; ``partial_fit`` runs locally.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features), float32
    labels_ : ndarray of shape (n_samples,), int64
        Nearest centroid of each sample of the last ``fit`` (or the last ``partial_fit``
        chunk), in the order of the input; equal to ``predict`` on the same samples.
    inertia_ : float
        Sum of squared distances of those samples to their nearest centroid (cosine: of
        their cosine dissimilarities ``1 - cos``).
    n_iter_ : int
        Iterations run since the model was started by ``fit`` or the first ``partial_fit``.
    batch_size_ : int
        Batch size ``b`` of the last iteration: the nested batch (``nmbatch``,
        ``nmbatch.deact``), the mini-batch (``mbatch``, ``mbatch.remove``) or ``N`` (``lloyd``,
        ``elkan``).
    n_samples_seen_ : int
        Samples given to ``fit`` and ``partial_fit`` since the model was started (with
        ``retention="all"``, the store's ``N``).
    n_samples_retained_ : int
        Samples the store holds, ``N``.
    n_features_in_ : int
        Number of features ``d``.

    Examples
    --------
    >>> import numpy as np
    >>> from nmbatch.engine import NestedMiniBatchKMeans
    >>> rng = np.random.default_rng(0)
    >>> means = np.array([[0.0, 0.0], [0.0, 5.0], [5.0, 5.0]])
    >>> X = np.concatenate([m + 0.1 * rng.standard_normal((200, 2)) for m in means])
    >>> km = NestedMiniBatchKMeans(n_clusters=3, batch_size=64, random_state=0).fit(X)
    >>> centers = km.cluster_centers_[np.lexsort(km.cluster_centers_.T[::-1])]
    >>> np.round(centers).astype(int).tolist()
    [[0, 0], [0, 5], [5, 5]]
    >>> bool((km.labels_ == km.predict(X)).all()), km.n_samples_seen_
    (True, 600)

    The same model built from a stream, one chunk at a time:

    >>> stream = NestedMiniBatchKMeans(n_clusters=3, batch_size=64, random_state=0)
    >>> for chunk in np.array_split(rng.permutation(X), 6):
    ...     stream = stream.partial_fit(chunk)
    >>> stream.n_samples_seen_, stream.n_iter_
    (600, 6)

    Watching the fit and stopping it early with a callback:

    >>> seen = []
    >>> def watch(stats, state):
    ...     seen.append((stats.iteration, state.batch_size))
    ...     return stats.iteration == 2
    >>> km = NestedMiniBatchKMeans(n_clusters=3, batch_size=64, random_state=0, callback=watch)
    >>> km.fit(X).n_iter_, seen
    (2, [(1, 64), (2, 64)])

    References
    ----------
    Newling, J. and Fleuret, F. (2016). Nested Mini-Batch K-Means. Advances in Neural
    Information Processing Systems 29 (NIPS 2016), pp. 1352-1360.
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = PARAMETER_CONSTRAINTS

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        metric: str = "euclidean",
        init: str | np.ndarray = "auto",
        max_iter: int = 300,
        batch_size: int = 5000,
        random_state: int | np.random.RandomState | np.random.Generator | None = None,
        rho: float = 100.0,
        callback: Callback | None = None,
        algorithm: str = "nmbatch",
        bounds: str = "auto",
        relocate_empty: bool = True,
        swap_clusters: bool | str = "auto",
        retention: str = "all",
        max_samples: int | None = None,
        max_age_seconds: float | None = None,
        catch_up: int | str = "auto",
        n_threads: int | None = None,
        backend: str | RayBackend | None = "local",
    ) -> None:
        self.n_clusters = n_clusters
        self.metric = metric
        self.init = init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.random_state = random_state
        self.rho = rho
        self.callback = callback
        self.algorithm = algorithm
        self.bounds = bounds
        self.relocate_empty = relocate_empty
        self.swap_clusters = swap_clusters
        self.retention = retention
        self.max_samples = max_samples
        self.max_age_seconds = max_age_seconds
        self.catch_up = catch_up
        self.n_threads = n_threads
        self.backend = backend

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags: an unsupervised clusterer and transformer of dense input
        whose ``transform`` returns float64."""
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags

    # -- fitting ----------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=True)
    @with_kernel_threads
    def fit(
        self, X: object, y: object = None, sample_weight: object = None
    ) -> NestedMiniBatchKMeans:
        """Cluster ``X`` (shape ``(n, d)``, any real dtype); ``y`` is ignored.

        ``sample_weight``: ``(n,)`` (or a scalar), each weight ``>= 0`` and finite, else
        ``ValueError``; None: every weight 1. A sample of weight ``w`` votes ``w`` times
        (``S(j) += w x``, ``v(j) += w``): the model of ``w`` copies of it (docs/design.md,
        "Sample weights"); a weight of 0 keeps the sample out of every sum (all zero:
        ``ValueError``).

        Runs iterations until the algorithm converges, ``max_iter`` is reached or
        ``callback`` returns ``True``. On a ``ValueError`` (bad parameter, bad ``X``,
        ``n_clusters > n``), or an exception of ``callback``, the estimator is left exactly
        as it was.
        """
        check_param_combinations(self.get_params())
        X32 = metric_rows(self._check_X(X, reset=True), self.metric)
        n, d = X32.shape
        k = int(self.n_clusters)
        if n < k:
            raise ValueError(f"n_samples={n} should be >= n_clusters={k}.")
        weights = as_sample_weight(sample_weight, n)
        if weights is not None and not weights.any():
            raise ValueError("sample_weight is zero for every sample: nothing to cluster")
        init = check_init(self.init, k, d)
        store_seed, algo_seed, policy_seed = spawn_seeds(seed_sequence(self.random_state), 3)
        policy = self._make_retention(policy_seed)
        admission = policy.admit(n)  # a capacity below n refuses the fit
        ray = ray_backend(self.backend)
        if ray is not None:  # nmbatch.engine.distributed, imported only here
            from nmbatch.engine.distributed.fit import fit_estimator

            return fit_estimator(self, X32, init, store_seed, algo_seed, policy, ray, weights)

        # X32 in a uniformly random order; rows are copied as the batch reaches them, so
        # the first step runs after b_0 rows are copied, not n (NestedBatchStore.load).
        store = self._make_store(d, store_seed, n)
        store.load(X32, checked=True, weights=weights)
        algo = self._make_algorithm(store, init, algo_seed)
        callback = self.callback
        for _ in range(int(self.max_iter)):
            stats = algo.step()
            stop = callback is not None and callback(stats, algo.state(stats)) is True
            if stats.converged or stop:
                break
        store.finish_loading()  # the store no longer reads X32 (the caller's array)

        self._store, self._algorithm, self._algo_seed = store, algo, algo_seed
        self._retention = policy
        self._partial_fit_key = self._fit_key()
        self.__dict__.pop("_pickled_samples", None)
        self.__dict__.pop("_pickled_ids", None)
        self.n_features_in_ = d
        self._publish(algo, stats, store, X32, weights)
        # The fitted model is of all rows; the policy keeps what it admits from now on.
        if admission.keep.shape[0] < n:
            algo.retire(ids=np.setdiff1d(np.arange(n), admission.ids))
            self._count_samples(store)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    @with_kernel_threads
    def partial_fit(
        self,
        X: object,
        y: object = None,
        sample_weight: object = None,
        *,
        now: float | None = None,
    ) -> NestedMiniBatchKMeans:
        """Offer ``X`` (shape ``(m, d)``) to the retention policy, then run one iteration
        (and up to ``catch_up`` more while each reassigns over 1% of the batch or
        relocates).

        The policy retires what leaves (votes taken back exactly) and appends what enters
        (``now``: the chunk's time in seconds, for ``retention="age"``; default
        ``time.time()``). The first call (or the first after ``fit``'s model was
        unpickled) starts the model. While the store holds fewer than ``n_clusters``
        samples no iteration runs. ``labels_`` and ``inertia_`` then describe the chunk
        ``X`` (``inertia_`` weighted); ``callback``, if set, is called after the iteration.
        ``sample_weight``: as in :meth:`fit`; stored with the rows, so a retired sample
        takes its weighted vote back. On a ``ValueError`` nothing is stored and the
        estimator is unchanged.
        """
        started = "_store" in self.__dict__ or "_pickled_samples" in self.__dict__
        if not started:
            check_param_combinations(self.get_params())
            X32 = metric_rows(self._check_X(X, reset=True), self.metric)
            weights = as_sample_weight(sample_weight, X32.shape[0])
            d = X32.shape[1]
            init = check_init(self.init, self.n_clusters, d)
            store_seed, algo_seed, policy_seed = spawn_seeds(seed_sequence(self.random_state), 3)
            policy = self._make_retention(policy_seed)
            store = self._make_store(d, store_seed, max(4096, len(X32)))
            algo = self._make_algorithm(store, init, algo_seed)
            host = LocalEngine.around(store, algo)
            offer(policy, host, X32, now, weights)  # a capacity below the chunk: unchanged
            self._store, self._algorithm, self._algo_seed = store, algo, algo_seed
            self._retention = policy
            self._partial_fit_key = self._fit_key()
            self.n_features_in_ = d
        else:
            if self._fit_key() != self._partial_fit_key:
                raise ValueError(
                    "n_clusters, metric, algorithm, rho, batch_size or the retention changed "
                    "since the model was started; call fit() to start a new model."
                )
            check_callback(self.callback)
            X32 = metric_rows(self._check_X(X, reset=False), self.metric)
            weights = as_sample_weight(sample_weight, X32.shape[0])
            if "_pickled_samples" in self.__dict__:
                self._resume_after_unpickling()
            store, algo = self._store, self._algorithm
            host = LocalEngine.around(store, algo)
            offer(self._retention, host, X32, now, weights)
        self._count_samples(store)

        def publish(state: ModelState) -> None:  # the fitted attributes, then the callback
            assert state.stats is not None
            self._publish(algo, state.stats, store, X32, weights)
            if self.callback is not None:
                self.callback(state.stats, state)

        iterate(host, publish, catch_up=catch_up_steps(self.catch_up, self.retention))
        return self
