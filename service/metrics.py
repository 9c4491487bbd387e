"""Prometheus metrics of one app, and the middleware timing its requests.

Each app owns its :class:`ServiceMetrics` (a private ``CollectorRegistry``), so several
apps in one process (tests) do not collide. ``GET /metrics`` renders that registry.

A model's series carry its name in the label ``model`` (:data:`MODEL_METRICS`): each
running model, the default one and the named ones, gets a view of the app's metrics
(:meth:`ServiceMetrics.for_model`, a :class:`ModelMetrics`) whose attributes are its own
series, and the series leave ``/metrics`` when the model stops here (deleted, here or by
another process: :meth:`ServiceMetrics.remove_model`). The label takes at most as many
values as the app runs models, ``NMBATCH_MAX_MODELS`` + 1. The rest (the request
histogram, Redis errors by caller, the heap freeze) belongs to the process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "KNOWN_METHODS",
    "MODEL_METRICS",
    "UNMATCHED",
    "ModelMetrics",
    "RequestTimingMiddleware",
    "RouteLabel",
    "ServiceMetrics",
    "method_label",
    "status_label",
]

KNOWN_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE")
)
"""The ``method`` label values besides ``other`` (RFC 9110's methods and PATCH)."""
UNMATCHED = "unmatched"
"""The ``route`` label of a request no route template matched."""

MODEL_METRICS = (
    "samples_ingested", "samples_rejected", "iterations", "iteration_seconds",
    "batch_size", "samples_in_store", "engine_bytes", "samples_retired",
    "samples_accepted_ever", "log_trimmed", "log_bytes", "max_samples",
    "distances_computed", "distances_skipped", "skipped_share", "centroid_version",
    "converged", "snapshot_age", "redis_up", "is_worker", "engine_restarts",
    "worker_failures", "drift",
)  # fmt: skip
"""The attributes of :class:`ServiceMetrics` whose series are one model's: their first
label is ``model``."""

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


MODEL = ("model",)


class ServiceMetrics:
    """The service's metrics, all prefixed ``nmbatch_``: the app's families (those of
    :data:`MODEL_METRICS` labelled by model), of which :meth:`for_model` gives one
    model's series."""

    def __init__(self) -> None:
        self.model: str | None = None  # a ModelMetrics' model
        self._last_snapshot: float | None = None
        self.registry = CollectorRegistry()
        r = self.registry
        self.samples_ingested = Counter(
            "nmbatch_samples_ingested",
            "Samples accepted by POST /samples here",
            labelnames=MODEL,
            registry=r,
        )
        self.samples_rejected = Counter(
            "nmbatch_samples_rejected_requests",
            "POST /samples requests refused, by problem type",
            ["model", "problem"],
            registry=r,
        )
        self.iterations = Counter(
            "nmbatch_iterations",
            "nmbatch iterations run by the worker",
            labelnames=MODEL,
            registry=r,
        )
        self.iteration_seconds = Histogram(
            "nmbatch_iteration_seconds",
            "Wall time of one worker iteration",
            buckets=_LATENCY_BUCKETS,
            labelnames=MODEL,
            registry=r,
        )
        self.batch_size = Gauge(
            "nmbatch_batch_size", "Nested batch size b", labelnames=MODEL, registry=r
        )
        self.samples_in_store = Gauge(
            "nmbatch_samples_in_store",
            "Samples N in the worker's store",
            labelnames=MODEL,
            registry=r,
        )
        self.engine_bytes = Gauge(
            "nmbatch_engine_bytes",
            "Memory of the worker engine's arrays: store at capacity, bounds, labels, norms "
            "(0 without an engine here)",
            labelnames=MODEL,
            registry=r,
        )
        self.samples_retired = Gauge(
            "nmbatch_samples_retired",
            "Samples retired from the worker's store by the retention policy since its "
            "engine started",
            labelnames=MODEL,
            registry=r,
        )
        self.drift = Gauge(
            "nmbatch_drift",
            "Drift figure: mean dissimilarity of the newest NMBATCH_DRIFT_WINDOW samples to "
            "the served centroids over the served model's energy per retained sample (NaN "
            "before the first measure)",
            labelnames=MODEL,
            registry=r,
        )
        self.samples_accepted_ever = Gauge(
            "nmbatch_samples_accepted_ever",
            "Samples ever accepted into the model's log (by any process)",
            labelnames=MODEL,
            registry=r,
        )
        self.log_trimmed = Counter(
            "nmbatch_log_entries_trimmed",
            "Log entries trimmed from Redis because all their samples left the model",
            labelnames=MODEL,
            registry=r,
        )
        self.log_bytes = Gauge(
            "nmbatch_log_bytes",
            "Redis memory of the model's sample log and retained base (MEMORY USAGE)",
            labelnames=MODEL,
            registry=r,
        )
        self.max_samples = Gauge(
            "nmbatch_max_samples",
            "Capacity: most samples the model holds (0 until the dimension is known)",
            labelnames=MODEL,
            registry=r,
        )
        self.distances_computed = Counter(
            "nmbatch_distances_computed",
            "Sample-centroid distances computed",
            labelnames=MODEL,
            registry=r,
        )
        self.distances_skipped = Counter(
            "nmbatch_distances_skipped",
            "Sample-centroid distances skipped by bounds",
            labelnames=MODEL,
            registry=r,
        )
        self.skipped_share = Gauge(
            "nmbatch_distances_skipped_ratio",
            "Share of distance computations skipped by the bounds (cumulative)",
            labelnames=MODEL,
            registry=r,
        )
        self.centroid_version = Gauge(
            "nmbatch_centroid_version",
            "Version of the published centroids",
            labelnames=MODEL,
            registry=r,
        )
        self.converged = Gauge(
            "nmbatch_converged",
            "1 when b = N and no assignment changed",
            labelnames=MODEL,
            registry=r,
        )
        self.snapshot_age = Gauge(
            "nmbatch_snapshot_age_seconds",
            "Seconds since the last snapshot was written to Redis (-1: none yet)",
            labelnames=MODEL,
            registry=r,
        )
        self.redis_up = Gauge(
            "nmbatch_redis_up",
            "1 while the worker thread reaches Redis, 0 while it backs off",
            labelnames=MODEL,
            registry=r,
        )
        self.redis_errors = Counter(
            "nmbatch_redis_unavailable",
            "Redis calls that failed because Redis was unavailable, by caller",
            ["where"],
            registry=r,
        )
        self.is_worker = Gauge(
            "nmbatch_is_worker",
            "1 if this process is the model's worker (holds the lease), 0 if standby",
            labelnames=MODEL,
            registry=r,
        )
        self.engine_restarts = Counter(
            "nmbatch_engine_restarts",
            "Times the worker rebuilt its engine process after it died",
            labelnames=MODEL,
            registry=r,
        )
        self.worker_failures = Counter(
            "nmbatch_worker_failures",
            "Unexpected errors of the worker; after each it waits (1 s doubling to 60 s) and "
            "rebuilds its engine from the log",
            labelnames=MODEL,
            registry=r,
        )
        self.gc_frozen_objects = Gauge(
            "nmbatch_gc_frozen_objects",
            "Objects moved out of the garbage collector's scans at start-up (gc.freeze)",
            registry=r,
        )
        self.request_seconds = Histogram(
            "nmbatch_request_seconds",
            "HTTP request latency",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def for_model(self, model: str) -> ModelMetrics:
        """The series of ``model`` (created at zero, ``redis_up`` at 1)."""
        return ModelMetrics(self, model)

    def remove_model(self, model: str) -> None:
        """Remove every series of ``model`` from the registry (it stopped here)."""
        for name in MODEL_METRICS:
            getattr(self, name).remove_by_labels({"model": model})

    def snapshot_written(self) -> None:
        """Record that a snapshot has just been stored."""
        self._last_snapshot = time.monotonic()

    def _snapshot_age(self) -> float:
        last = self._last_snapshot
        return -1.0 if last is None else time.monotonic() - last


class _ModelLabels:
    """A family with labels after ``model``, its model given: ``.labels(problem)``.

    Each series is made once and kept here: after :meth:`ServiceMetrics.remove_model`, a
    request still in flight for the model counts in a series no longer exported, and
    never makes it again."""

    def __init__(self, family: Any, model: str) -> None:
        self.family = family
        self.model = model
        self._series: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = self.family.labels(self.model, *values)
        return series


class ModelMetrics(ServiceMetrics):
    """One model's view of the app's :class:`ServiceMetrics`: the attributes of
    :data:`MODEL_METRICS` are its series (``samples_rejected`` takes the problem only),
    the others the app's. What the worker, the use cases and the start-up of a model
    are handed."""

    def __init__(self, families: ServiceMetrics, model: str) -> None:  # no new registry
        self.model = model
        self._last_snapshot = None
        self.registry = families.registry
        self.redis_errors = families.redis_errors
        self.gc_frozen_objects = families.gc_frozen_objects
        self.request_seconds = families.request_seconds
        for name in MODEL_METRICS:
            family = getattr(families, name)
            bound = (
                _ModelLabels(family, model) if name == "samples_rejected" else family.labels(model)
            )
            setattr(self, name, bound)
        self.snapshot_age.set_function(self._snapshot_age)
        self.redis_up.set(1)


@dataclass(frozen=True)
class RouteLabel:
    """A stand-in for ``scope["route"]`` where no Starlette route matched or where the
    label must differ from the matched route's template: :class:`RequestTimingMiddleware`
    reads only its ``path`` (the ``route`` label)."""

    path: str


def method_label(method: str) -> str:
    """The ``method`` label of a request: the method if in :data:`KNOWN_METHODS`, else
    ``other`` (uvicorn accepts any token as a method: each new one would be a series
    kept for the life of the process)."""
    return method if method in KNOWN_METHODS else "other"


def status_label(status: int) -> str:
    """The ``status`` label: the code (``"202"``) when it is a valid HTTP status
    (100-599), else ``other``."""
    return str(status) if 100 <= status <= 599 else "other"


class RequestTimingMiddleware:
    """Pure ASGI middleware observing each HTTP request's latency in ``request_seconds``.

    Every label comes from a small closed set, so no request can add series without
    bound (each series lives as long as the process, in ``/metrics`` and the
    dashboard's data): ``method`` is one of :data:`KNOWN_METHODS` or ``other``,
    ``route`` the matched route's path template (``/samples``,
    ``/models/{name}/samples``) or :data:`UNMATCHED`, ``status`` the answer's code.
    At most ``10 x (routes + 1) x (status codes the service answers)`` series.
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None)
            if not isinstance(template, str) or not template:
                template = UNMATCHED
            self.metrics.request_seconds.labels(
                method_label(scope["method"]), template, status_label(status)
            ).observe(time.perf_counter() - start)
