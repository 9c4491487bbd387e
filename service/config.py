"""Settings of the clustering service, read from ``NMBATCH_*`` environment variables.

One :class:`Settings` object is built at start-up (``Settings()`` reads the environment)
and handed to :func:`service.main.create_app`; nothing else in the service reads the
environment. Every field is documented in the settings table of
``docs/configuration.md`` (a test checks it).
"""

from __future__ import annotations

import ipaddress
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from nmbatch.service import cgroups

__all__ = ["Settings", "default_worker_threads"]


def _loopback(host: str) -> bool:
    """True if ``host`` names only the loopback interface (``127.0.0.0/8``, ``::1``,
    ``localhost``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_worker_threads(root: Path = Path("/")) -> int:
    """All cores but one (at least 1), so the worker never starves the HTTP side.

    The cores are those of the CPU affinity, capped by the container's CPU quota (its
    cgroup's v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``, :func:`cgroups.cpu_quota`)
    rounded up: a quota of 2.5 CPUs counts 3 cores, so 2 threads. ``root`` stands for
    ``/`` (tests).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroups.cpu_quota(root)
    if quota is not None:
        cores = min(cores, math.ceil(quota[0]))
    return max(1, cores - 1)


class Settings(BaseSettings):
    """Service settings; environment variable ``NMBATCH_<FIELD>`` sets field ``<field>``."""

    # hide_input_in_errors: a refused value (an API key too short ...) is never echoed in
    # the error message, which ends up in logs.
    model_config = SettingsConfigDict(
        env_prefix="NMBATCH_",
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
        # No setting is infinite or NaN (NMBATCH_RHO=inf, a max_age_seconds of NaN ...):
        # refused here, and in PUT /models/{name} (ModelSpec) with a 422.
        allow_inf_nan=False,
    )

    # -- model ---------------------------------------------------------------------------
    model: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
        description="Model name; Redis keys are prefixed 'nmbatch:{model}:'.",
    )
    k: int = Field(8, ge=1, le=100_000, description="Number of clusters.")
    dim: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Dimension; unset: fixed by the first accepted batch and kept in Redis.",
    )
    rho: float = Field(100.0, gt=0, description="Batch doubling threshold of nmbatch.")
    batch_size: int = Field(5000, ge=1, description="Initial nested batch size b.")
    seed: int | None = Field(
        None, ge=0, lt=2**63, description="Seed of the store shuffle and the init."
    )
    init: Literal["k-means++", "first", "given"] = Field(
        "k-means++",
        description="Initialisation of the centroids on the first batch; given: the "
        "centroids the model was seeded with (NMBATCH_INIT_FILE, or init in PUT "
        "/models/{name}), published as its first version.",
    )
    init_file: Path | None = Field(
        None,
        description="A .npy file of (NMBATCH_K, dim) initial centroids for the default "
        "model (implies NMBATCH_INIT=given): kept in Redis at its first start, so a "
        "restart seeds it the same way; ignored once a re-clustering changed k.",
    )
    metric: Literal["euclidean", "cosine"] = Field(
        "euclidean",
        description="euclidean: k-means; cosine: spherical k-means (every vector normalised "
        "to unit length on ingestion and in /assign, a zero vector refused with 422; unit "
        "centroids; /assign answers the similarity too). Fixed when the model is created. "
        "Not with NMBATCH_RAY_ADDRESS.",
    )
    retention: Literal["all", "window", "age", "reservoir"] = Field(
        "all",
        description="Which samples the model keeps: all (up to the capacity "
        "NMBATCH_MAX_SAMPLES, then 507), window (the last NMBATCH_MAX_SAMPLES accepted), "
        "age (those accepted in the last NMBATCH_MAX_AGE_SECONDS), reservoir (a uniform "
        "random sample of NMBATCH_MAX_SAMPLES of all ever accepted).",
    )
    max_samples: int | None = Field(
        None,
        ge=1,
        description="Retention all: the capacity (POST /samples answers 507 beyond, storing "
        "nothing); unset: half the memory this process may use (cgroup limit, else MemTotal) "
        "over the bytes per vector of the engine and the embedded Redis "
        "(service.storage.capacity). Window and reservoir: their size (required). Age: an "
        "optional cap (oldest leave first; unset: the memory-derived capacity).",
    )
    max_age_seconds: float | None = Field(
        None,
        gt=0,
        description="Retention age: a sample leaves the model this many seconds after it "
        "was accepted (by Redis's clock; required with age, refused with the others).",
    )

    # -- named models (PUT /models/{name}) ------------------------------------------------
    max_models: int = Field(
        16,
        ge=0,
        le=1000,
        description="Most named models (PUT /models/{name}) besides NMBATCH_MODEL; a PUT "
        "creating one more is refused (409 too-many-models).",
    )
    model_max_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="Memory one named model may fill (its samples in the engine and the "
        "embedded Redis, plus its centroids); a PUT whose max_samples would not fit is "
        "refused (422 model-too-large), and a model without max_samples gets the capacity "
        "this fits. Unset: half the memory (as NMBATCH_MAX_SAMPLES) over NMBATCH_MAX_MODELS "
        "+ 1.",
    )

    # -- HTTP ----------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address uvicorn binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port uvicorn listens on.")
    max_body_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted (413 above); enforced by Content-Length and "
        "while the body streams in.",
    )
    max_vectors: int = Field(100_000, ge=1, description="Most vectors in one request (413 above).")
    max_dim: int = Field(
        65_536,
        ge=1,
        le=1_000_000,
        description="Largest dimension the first batch may fix when NMBATCH_DIM is unset "
        "(422 above).",
    )
    body_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="Longest time to receive a whole request body (408 after it); stops clients "
        "that trickle a body from holding a request open.",
    )
    max_concurrent_requests: int = Field(
        128,
        ge=1,
        description="Most requests in flight at once (/healthz and /readyz not counted); one "
        "more is answered 503 too-many-requests with Retry-After.",
    )
    max_inflight_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="Most body bytes all requests in flight may hold together (a declared "
        "Content-Length is reserved before the body is read); past it 503 "
        "body-budget-exhausted with Retry-After. Unset: twice NMBATCH_MAX_BODY_BYTES.",
    )
    write_shed_lag_ms: float = Field(
        5.0,
        ge=0,
        description="Writes are shed before reads slow down: while a read came within the "
        "last second and either the event loop runs more than this many milliseconds behind "
        "with another write in flight, or the model's worker is behind this process's appends "
        "by more than its hand-off holds, a POST of samples is answered 503 overloaded with "
        "Retry-After, its body not read. 0: never shed.",
    )
    max_connections: int = Field(
        1024,
        ge=1,
        description="Most open HTTP connections; one more is closed as soon as it is accepted.",
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="Longest time a connection may take to send a request's headers (from "
        "its opening, or from the previous answer); then 408 and the connection is closed.",
    )
    log_level: str = Field("info", description="uvicorn log level.")
    tracing: Literal["off", "otlp", "console"] = Field(
        "off",
        description="OpenTelemetry traces of the requests and the worker's steps (needs "
        "nmbatch[otel]): otlp sends them by OTLP over HTTP (OTEL_EXPORTER_OTLP_ENDPOINT "
        "...), console prints them; off: none (service.tracing).",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log lines on stderr: text, or json (one JSON object per line with the "
        "time, level, logger, message, request id and model; service.logs).",
    )
    access_log: bool = Field(
        True,
        description="uvicorn's access log, one line per request; turn it off under heavy load.",
    )
    api_key: SecretStr | None = Field(
        None,
        min_length=16,
        description="One API key with scope admin on every model: writes and model creation "
        "and deletion need 'Authorization: Bearer <key>' (never logged or shown in the "
        "settings' repr).",
    )
    api_keys: SecretStr | None = Field(
        None,
        description="Scoped API keys: entries '<key> <scope> [<model pattern> ...]' separated "
        "by ';' or new lines; scope read, write or admin (docs/operations/security.md).",
    )
    api_key_file: Path | None = Field(
        None,
        description="File of API key entries as NMBATCH_API_KEYS, one per line (a line with "
        "only a key: admin); keeps the keys out of the process environment.",
    )
    api_key_reads: bool = Field(
        False,
        description="With API keys set, reads (centroids, assign, stats, models, metrics) need "
        "a key too (scope read or above); healthz and readyz stay open.",
    )
    allow_anonymous: bool = Field(
        False,
        description="Start without any API key on an address other than loopback (refused "
        "otherwise): anyone who reaches the port may write, create and delete models.",
    )
    idempotency_seconds: float = Field(
        86_400.0, gt=0, description="How long an Idempotency-Key of POST /samples is kept."
    )
    idempotency_max_keys: int = Field(
        100_000,
        ge=1,
        le=10_000_000,
        description="Most Idempotency-Keys kept per model; past it the oldest are forgotten "
        "first (a retry of a forgotten key is stored again). Each takes at most "
        "IDEMPOTENCY_RECORD_BYTES of Redis, counted in the embedded Redis's maxmemory.",
    )

    # -- Redis ---------------------------------------------------------------------------
    redis_url: str | None = Field(
        None,
        repr=False,  # may hold a password
        description="Redis to use, e.g. redis://:password@host:6379/0, or with TLS "
        "rediss://:password@host:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.crt; "
        "unset: start an embedded redis-server child.",
    )
    data_dir: Path = Field(
        Path("./data"), description="Data folder of the embedded Redis (append-only file)."
    )
    appendfsync: Literal["everysec", "always"] = Field(
        "everysec", description="fsync policy of the embedded Redis's append-only file."
    )
    embedded_redis_port: int = Field(
        0, ge=0, le=65535, description="Port of the embedded Redis on 127.0.0.1 (0: free one)."
    )

    # -- worker --------------------------------------------------------------------------
    snapshot_seconds: float = Field(
        5.0, gt=0, description="Seconds between centroid snapshots written to Redis."
    )
    poll_seconds: float = Field(
        0.5, gt=0, description="Seconds between polls of the sample log for other writers."
    )
    keep_versions: int = Field(
        32,
        ge=0,
        le=10_000,
        description="Most published versions a model keeps in Redis (GET /versions, "
        "?version=, pins): each snapshot written is kept, the oldest unpinned forgotten "
        "first; 0 keeps none.",
    )
    keep_versions_bytes: int = Field(
        64 << 20,
        ge=0,
        description="Most bytes of Redis a model's kept versions take (each at most 1.25 "
        "(4 k d + 13 k) + 1792 bytes); the count kept is the lower of NMBATCH_KEEP_VERSIONS "
        "and what fits in these bytes.",
    )
    events_keep: int = Field(
        1000,
        ge=0,
        le=100_000,
        description="Most events a model keeps in Redis for GET /events and its "
        "Last-Event-ID replay (each at most 1 KiB of data); 0 writes none.",
    )
    events_max_connections: int = Field(
        100,
        ge=0,
        description="Most GET /events streams this server serves at once (past it: 503).",
    )
    events_heartbeat_seconds: float = Field(
        15.0, gt=0, description="Seconds without an event before GET /events sends a comment."
    )
    drift_window: int = Field(
        1000,
        ge=0,
        le=1_000_000,
        description="The newest samples the drift figure measures (0: no drift figure).",
    )
    drift_alarm: float = Field(
        2.0,
        ge=0,
        description="Drift figure at or above which a drift event is sent (again only "
        "once it fell below); 0: never.",
    )
    worker_lock_seconds: float = Field(
        10.0,
        gt=0,
        description="Expiry of the Redis lock that makes one process the model's worker.",
    )
    redis_retry_seconds: float = Field(
        1.0, gt=0, description="Retry-After of 503 answers while Redis is unreachable."
    )
    worker_threads: int = Field(
        default_factory=default_worker_threads,
        ge=1,
        description="BLAS / numba threads of the worker (default: all cores but one, the "
        "cores capped by the container's CPU quota, cgroup v2 or v1).",
    )
    worker_process: bool = Field(
        True,
        description=(
            "Run the worker's store and iterations in a child process (own GIL, lower "
            "priority), not in the worker thread."
        ),
    )
    engine_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="Niceness of the engine (its child process; the worker thread without "
        "one): below the HTTP side, which wins the CPU when both want it, yet a guaranteed "
        "share of it on a machine saturated by other programs.",
    )
    engine_sched_idle: bool = Field(
        False,
        description="Run the engine's child process in Linux's SCHED_IDLE class instead: "
        "only on CPU time nothing else wants; on a saturated machine the model stops.",
    )

    # -- choosing k (POST /sweep) ---------------------------------------------------------
    sweep_max_rows: int = Field(
        20_000,
        ge=100,
        le=10_000_000,
        description="Most retained samples a sweep fits on (a uniform sample of them; 20% "
        "held out to score each k).",
    )
    sweep_max_ks: int = Field(12, ge=1, le=64, description="Most values of k in one sweep.")
    sweep_max_k: int = Field(
        1024, ge=1, le=100_000, description="Largest k a sweep may fit."
    )

    # -- Ray cluster (issue 14) ------------------------------------------------------------
    ray_address: str | None = Field(
        None,
        description="Ray cluster the worker's engine runs on (the head's host:port, as `ray "
        "start --address` takes it): a coordinator in the worker and "
        "NMBATCH_RAY_SHARDS shard actors on the nodes, fed from the Redis log (needs "
        "nmbatch[ray]; every retention). Unset: the single-machine engine.",
    )
    ray_shards: int = Field(
        2,
        ge=1,
        le=4096,
        description="Shard actors of the model on the Ray cluster (with NMBATCH_RAY_ADDRESS).",
    )

    @property
    def has_keys(self) -> bool:
        """True if any API key source is set (NMBATCH_API_KEY, _KEYS or _KEY_FILE)."""
        return any(v is not None for v in (self.api_key, self.api_keys, self.api_key_file))

    @model_validator(mode="before")
    @classmethod
    def _init_file_means_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("init_file") and "init" not in data:
            return {**data, "init": "given"}
        return data

    @model_validator(mode="after")
    def _init_file_is_given(self) -> Settings:
        if self.init_file is not None and self.init != "given":
            raise ValueError(
                f"NMBATCH_INIT_FILE seeds the model with its centroids, but NMBATCH_INIT = "
                f"{self.init}: unset one of them"
            )
        return self

    @model_validator(mode="after")
    def _no_open_service_on_the_network(self) -> Settings:
        if not self.has_keys and not self.allow_anonymous and not _loopback(self.host):
            raise ValueError(
                f"NMBATCH_HOST = {self.host} is not a loopback address and no API key is set: "
                "anyone who reaches the port could write, create and delete models. Set "
                "NMBATCH_API_KEY, NMBATCH_API_KEYS or NMBATCH_API_KEY_FILE, or "
                "NMBATCH_ALLOW_ANONYMOUS=true to run open on purpose"
            )
        return self

    @model_validator(mode="after")
    def _retention_holds_k_samples(self) -> Settings:
        if self.max_samples is not None and self.max_samples < self.k:
            what = "capacity" if self.retention == "all" else f"{self.retention} size"
            raise ValueError(
                f"NMBATCH_MAX_SAMPLES = {self.max_samples} is below NMBATCH_K = {self.k}: the "
                f"model's {what} could never hold the k samples its first iteration needs"
            )
        if self.retention in ("window", "reservoir") and self.max_samples is None:
            raise ValueError(
                f"NMBATCH_RETENTION = {self.retention} needs NMBATCH_MAX_SAMPLES (its size, an "
                f"integer >= NMBATCH_K = {self.k})"
            )
        if self.retention == "age" and self.max_age_seconds is None:
            raise ValueError("NMBATCH_RETENTION = age needs NMBATCH_MAX_AGE_SECONDS (> 0)")
        if self.retention != "age" and self.max_age_seconds is not None:
            raise ValueError(
                f"NMBATCH_MAX_AGE_SECONDS is only used by NMBATCH_RETENTION = age, not "
                f"{self.retention}"
            )
        return self

    @property
    def inflight_body_budget(self) -> int:
        """Bytes the bodies in flight may hold together (``max_inflight_body_bytes``,
        default twice ``max_body_bytes``)."""
        if self.max_inflight_body_bytes is not None:
            return self.max_inflight_body_bytes
        return 2 * self.max_body_bytes

    @property
    def key_prefix(self) -> str:
        """Prefix of every Redis key of this model: ``nmbatch:{model}:``."""
        return f"nmbatch:{self.model}:"
