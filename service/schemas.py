"""Pydantic models of every request and response body: the OpenAPI contract at ``/docs``.

Big numeric answers are serialised with orjson straight from numpy arrays (validating
millions of floats through pydantic would cost more than computing them); these models
still describe them exactly.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "FLOAT32_OVERFLOW",
    "AssignMany",
    "AssignOne",
    "Centroids",
    "DoublingOut",
    "Health",
    "KeptVersion",
    "Pin",
    "PinRequest",
    "Readiness",
    "SamplesAccepted",
    "Stats",
    "Sweep",
    "SweepPoint",
    "VectorsIn",
    "Versions",
    "vectors_schema",
]


FLOAT32_OVERFLOW = 3.4028235677973366e38
"""The smallest magnitude that rounds to an infinite ``float32`` (the largest finite one,
3.4028234663852886e38, plus half its spacing): a coordinate at or beyond it is refused
(``non-finite``), anything below is stored as a finite ``float32``."""


class VectorsIn(BaseModel):
    """JSON body of ``POST /samples`` and ``POST /assign``."""

    model_config = ConfigDict(extra="forbid")

    vectors: list[list[float]] = Field(
        description="n vectors of d finite numbers each (n >= 1).",
        examples=[[[0.0, 1.5, -2.0], [3.0, 0.25, 1.0]]],
    )


def vectors_schema(dim: int | None = None) -> dict[str, Any]:
    """JSON schema of :class:`VectorsIn`; with ``dim``, each vector has exactly ``dim`` numbers.

    The dimension is stated as ``minItems == maxItems == dim`` on the inner arrays (and
    the example has that many numbers), so a client reading the OpenAPI document knows
    the length a ``wrong-dimension`` problem would refuse.
    """
    schema = VectorsIn.model_json_schema()
    # What the service accepts, as far as JSON Schema says it: at least one vector of at
    # least one number, each within float32's range (beyond it a number is infinite).
    vectors = schema["properties"]["vectors"]
    vectors["minItems"] = 1
    vectors["items"].update(minItems=1)
    vectors["items"]["items"].update(
        exclusiveMinimum=-FLOAT32_OVERFLOW, exclusiveMaximum=FLOAT32_OVERFLOW
    )
    if dim is not None:
        vectors = schema["properties"]["vectors"]
        vectors["items"].update(minItems=dim, maxItems=dim)
        vectors["description"] = f"n vectors of {dim} finite numbers each (n >= 1)."
        if dim <= 16:
            vectors["examples"] = [[[0.5] * dim, [-1.0] * dim]]
        else:  # an example of a million numbers would only weigh the document down
            del vectors["examples"]
    return schema


class SamplesAccepted(BaseModel):
    """Answer of ``POST /samples``: the samples are in the Redis sample log."""

    accepted: int = Field(description="Vectors accepted from this request.")
    n_samples: int = Field(description="Total samples in the model's log afterwards.")
    ids: list[str] = Field(
        default_factory=list,
        description="Each accepted sample's id, in the order of the vectors: the ids sent "
        "(integers as decimal strings), else those the service assigned (`<log entry "
        "id>-<row>`). Empty for the replay of a request stored before ids existed.",
    )


class SampleInfo(BaseModel):
    """Where one sample stands (``GET /samples/{id}``)."""

    id: str = Field(description="The sample's id.")
    cluster: int = Field(description="Index of the centroid its row is nearest to now.")
    distance: float = Field(
        description="Euclidean distance to it (under metric=cosine, of the unit row)."
    )
    similarity: float | None = Field(
        None, description="Only under metric=cosine: 1 - distance^2 / 2."
    )
    retained: bool = Field(
        description="True: the sample is among the model's samples (a sample the "
        "retention retired, or a deleted one, is a 404)."
    )
    version: int = Field(description="The version served when it was answered.")


class DeleteSamples(BaseModel):
    """Body of ``POST /samples/delete``."""

    ids: list[str | int] = Field(
        min_length=1, max_length=10_000, description="The ids to delete (at most 10,000)."
    )


class SamplesDeleted(BaseModel):
    """Answer of ``POST /samples/delete``."""

    deleted: list[str] = Field(description="The ids deleted by this request.")
    not_found: list[str] = Field(
        description="The ids of no sample of the model (never stored, deleted before, or "
        "retired and trimmed)."
    )


class Centroids(BaseModel):
    """The published centroids and what describes them."""

    version: int = Field(description="Centroid version; increases with every update.")
    k: int = Field(description="Number of clusters.")
    dim: int = Field(description="Dimension d.")
    centroids: list[list[float]] = Field(description="k x d centroids (float32 values).")
    counts: list[int | float] = Field(
        description="v(j): prefix samples assigned to each centroid (the sum of their "
        "weights when samples were sent with weights)."
    )
    n_samples: int = Field(
        description="N: samples the centroids describe (those the retention policy kept)."
    )
    n_ingested: int = Field(
        description="Samples ever accepted into the model's log (>= n_samples; more once "
        "the retention policy has let samples go)."
    )
    retention: str = Field(description="NMBATCH_RETENTION: all, window, age or reservoir.")
    metric: str = Field(
        description="NMBATCH_METRIC: euclidean (k-means) or cosine (spherical k-means: the "
        "centroids are unit vectors, the directions of their clusters' sums)."
    )
    batch_size: int = Field(description="b: nested batch (prefix) size.")
    iteration: int = Field(description="Iterations run so far.")
    converged: bool = Field(
        description="b = N, and the last iteration changed no assignment and moved no centroid."
    )
    updated_at: str = Field(description="Time of this version, ISO 8601 UTC.")


class AssignOne(BaseModel):
    """Nearest centroid of one vector."""

    version: int = Field(description="Centroid version used.")
    cluster: int = Field(description="Index of the nearest centroid (ties: lowest).")
    distance: float = Field(
        description="Euclidean distance to it (under metric=cosine, of the vector "
        "normalised to unit length)."
    )
    similarity: float | None = Field(
        None,
        description="Only under metric=cosine: the cosine similarity of the vector and the "
        "centroid, 1 - distance^2 / 2 (the nearest centroid is the most similar one).",
    )


class AssignMany(BaseModel):
    """Nearest centroid of each vector of a batch."""

    version: int = Field(description="Centroid version used for every vector.")
    clusters: list[int] = Field(description="Index of the nearest centroid, per vector.")
    distances: list[float] = Field(
        description="Euclidean distance to it, per vector (under metric=cosine, of the "
        "vector normalised to unit length)."
    )
    similarities: list[float] | None = Field(
        None,
        description="Only under metric=cosine: the cosine similarity of each vector and "
        "its centroid, 1 - distance^2 / 2.",
    )


class Health(BaseModel):
    status: str = Field(examples=["ok"])


class Readiness(BaseModel):
    ready: bool
    redis: str = Field(
        description="'ok', or 'unavailable (<error class>)' (the details are in the "
        "service's log: this route is open, it shows no host, port or message)."
    )
    worker: str = Field(
        description="Worker phase: replaying, iterating, converged, ..., or 'failed' (the "
        "error is in the service's log)."
    )
    role: str = Field(
        description="'worker' (this process runs the model's iterations) or 'standby' "
        "(it serves the worker's snapshots and takes over if the worker dies)."
    )


class DoublingOut(BaseModel):
    """The nested batch grew from ``from_size`` to ``to_size`` after ``iteration``.

    ``from_b`` and ``to_b`` are the same numbers under the paper's name ``b``.
    """

    iteration: int
    from_b: int = Field(description="b before the doubling (same as from_size).")
    to_b: int = Field(description="b after it (same as to_size).")
    from_size: int = Field(description="Nested batch size before the doubling.")
    to_size: int = Field(description="Nested batch size after it (at most N).")
    at: str = Field(description="ISO 8601 UTC.")


class Stats(BaseModel):
    """The algorithm's course, in the paper's names."""

    phase: str = Field(description="Worker phase: replaying, iterating, converged, ...")
    role: str = Field(description="'worker' or 'standby' (see /readyz).")
    version: int | None = Field(description="Published centroid version (None: none yet).")
    b: int = Field(description="Nested batch (prefix) size (same as batch_size).")
    N: int = Field(description="Samples in the worker's store (same as n_samples).")
    batch_size: int = Field(description="b: nested batch (prefix) size, as in /centroids.")
    n_samples: int = Field(description="N: samples in the worker's store, as in /centroids.")
    n_logged: int = Field(
        description="Samples ever accepted into the Redis log (the worker may lag; with a "
        "retention other than all, more than the log holds now)."
    )
    iteration: int
    converged: bool
    energy: float | None = Field(
        description="Mean squared distance of the prefix samples to their centroid (under "
        "metric=cosine the mean cosine dissimilarity 1 - cos, half of it)."
    )
    distances_computed: int
    distances_skipped: int
    skipped_share: float | None = Field(
        description="Share of distance computations skipped by the bounds."
    )
    last_iteration_seconds: float | None
    doublings: list[DoublingOut]
    max_samples: int | None = Field(
        description="Capacity: most samples the model holds; POST /samples answers 507 "
        "beyond (None until the dimension is known)."
    )
    max_samples_source: str | None = Field(
        description="'setting' (NMBATCH_MAX_SAMPLES) or 'memory' (derived from the memory "
        "limit); None until the dimension is known."
    )
    max_samples_detail: str | None = Field(
        description="How the capacity was reached (memory, bytes per vector), in words."
    )
    retention: str = Field(description="NMBATCH_RETENTION: all, window, age or reservoir.")
    metric: str = Field(description="NMBATCH_METRIC: euclidean or cosine.")
    retained: int = Field(description="Samples the model keeps now (same as n_samples).")
    n_retired: int = Field(
        description="Samples the retention policy took out of this process's engine since "
        "it started (their votes removed exactly)."
    )
    drift: float | None = Field(
        None,
        description="Drift figure: the mean dissimilarity of the newest NMBATCH_DRIFT_WINDOW "
        "samples to the served centroids over the served model's energy per retained sample "
        "(about 1 on the data the model was fitted on; None before the first measure, or on "
        "a process that is not the worker).",
    )
    drift_alarm: float | None = Field(
        None, description="NMBATCH_DRIFT_ALARM: a drift event at or above it (None: off)."
    )
    n_ingested: int = Field(description="Samples ever accepted into the model's log.")
    log_entries: int | None = Field(
        description="Entries in the model's Redis log (after trimming and compaction)."
    )
    log_bytes: int | None = Field(
        description="Redis memory of the model's log and retained base (MEMORY USAGE, "
        "sampled); None where the command is not allowed."
    )
    engine_bytes: int = Field(
        description="Memory of this process's engine arrays (store at capacity, bounds, "
        "labels, norms) after the last step; 0 without an engine (a standby)."
    )
    redis_used_memory: int | None = Field(
        description="Redis's used_memory (INFO memory); None where INFO is not allowed."
    )
    redis_maxmemory: int | None = Field(
        description="Redis's maxmemory (0: no limit); None where INFO is not allowed."
    )
    pinned_version: int | None = Field(
        None,
        description="The version reads serve while pinned (POST pin); None: reads follow "
        "the newest (version).",
    )
    versions_kept: int = Field(
        0, description="Versions kept in Redis (GET versions), the pinned one included."
    )
    invalid_models: dict[str, str] = Field(
        default_factory=dict,
        description="Registry entries of named models that do not validate (name: why). "
        "Their models are not started and their data is kept (never purged for it); each "
        "still counts toward NMBATCH_MAX_MODELS until it is fixed or deleted.",
    )


VERSION_MAX = (1 << 53) - 1
"""Largest version number a request may name: every integer up to it is exact as a
double (a JSON number, a sorted set's score), so one above it is never taken for it."""


class Identities(BaseModel):
    """How a version's clusters relate to those of version ``since``."""

    since: int | None = Field(
        description="The version these facts are against: the previous snapshot, normally "
        "the previous kept version (None: the first model)."
    )
    relocated: list[int] = Field(
        description="Clusters of this version relocated since: empty, each took a sample "
        "far from every centroid (a new cluster under an old index)."
    )
    swapped: list[int] = Field(
        description="Clusters of this version given up by a swap since: merged into "
        "another, then given part of a split cluster (a new cluster under an old index)."
    )
    ended: list[int] = Field(description="Clusters of `since` that lost every sample.")
    matching: list[list[int | None]] = Field(
        description="[old, new] for each cluster of `since` not at its own index now (new "
        "null: ended); every other cluster i of `since` is i here."
    )


class KeptVersion(BaseModel):
    """One kept version: the snapshot it was, and what changed since the previous one."""

    version: int
    updated_at: str = Field(description="Time of this version, ISO 8601 UTC.")
    energy: float | None = Field(
        description="Mean squared distance of the prefix samples to their centroid then "
        "(None: not known)."
    )
    n_samples: int = Field(description="N: samples in the worker's store then.")
    n_ingested: int = Field(description="Samples ever accepted into the log then.")
    k: int
    dim: int
    batch_size: int = Field(description="b then.")
    iteration: int
    converged: bool
    pinned: bool = Field(description="True for the version reads serve while pinned.")
    changed: str = Field(
        description="What changed since the previous kept version, in words: iterations "
        "run, b, N, convergence, energy, clusters relocated or swapped."
    )
    identities: Identities | None = Field(
        description="Its clusters against the previous version's (None: a version kept "
        "before identities were)."
    )


class Versions(BaseModel):
    """The kept versions of a model, oldest first."""

    model: str
    versions: list[KeptVersion]
    pinned: int | None = Field(description="The pinned version (None: reads follow the newest).")
    newest: int | None = Field(description="The newest published version (None: none yet).")
    bound: int = Field(
        description="Most versions kept: the lower of NMBATCH_KEEP_VERSIONS and the versions "
        "NMBATCH_KEEP_VERSIONS_BYTES holds; the pinned one counts and is never forgotten."
    )


class PinRequest(BaseModel):
    """The body of ``POST /pin``."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=1, le=VERSION_MAX, description="A kept version (GET versions).")

    @field_validator("version", mode="before")
    @classmethod
    def _a_json_integer(cls, value: Any) -> Any:
        """A JSON integer (``3``, or ``3.0`` as JSON Schema counts it), never a string or
        a boolean (which pydantic's lax mode would take for one)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a JSON integer")
        return value


class Pin(BaseModel):
    """The pin after ``POST`` or ``DELETE /pin``."""

    model: str
    pinned: int | None = Field(description="The pinned version (None: reads follow the newest).")
    served: int | None = Field(description="The version reads serve now (None: none yet).")


class SweepPoint(BaseModel):
    """One k of a sweep."""

    k: int
    heldout_energy: float = Field(description="Mean dissimilarity (squared distance; 1 - "
                                  "cos under cosine) of the held-out samples.")  # fmt: skip
    train_energy: float
    silhouette: float | None = Field(description="On at most 2,000 held-out samples.")
    n_iter: int
    seconds: float


class Sweep(BaseModel):
    """The answer of ``POST /sweep``: per k, the scores; the recommended k and its rule."""

    model: str
    points: list[SweepPoint]
    recommended_k: int | None = Field(description="By `rule`; None when it finds none.")
    rule: str
    n_retained: int = Field(description="Retained samples read (the log and base).")
    n_train: int = Field(description="Samples each k was fitted on (a uniform sample).")
    n_heldout: int = Field(description="Samples held out (20%) to score each k.")
    n_silhouette: int
    metric: str
    seconds: float
