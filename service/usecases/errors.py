"""The refusals of the application layer: one exception class per reason.

The use cases (:mod:`~nmbatch.service.usecases.serving`,
:mod:`~nmbatch.service.usecases.catalog`) and the model registry
(:mod:`nmbatch.service.models.manager`) raise these when they refuse a request: each
carries the facts of the refusal as attributes (the numbers a client needs to act on it)
and a plain-words :attr:`DomainError.detail`, and nothing of HTTP. Which status, problem
``type``, title and headers each one is answered with is decided in one place, the table
of :mod:`nmbatch.service.problems` (:data:`~nmbatch.service.problems.DOMAIN_PROBLEMS`).

Storage's own errors (:mod:`nmbatch.service.storage.errors`) are translated into these
by the use case that calls storage (:func:`~nmbatch.service.usecases.serving.ingest`):
whether a full log is a backlog or a full store depends on the model's retention, which
storage does not know.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CentroidsPendingError",
    "DefaultModelError",
    "DimensionTooLargeError",
    "DomainError",
    "DuplicateSampleIdError",
    "IdempotencyKeyReusedError",
    "InvalidInitError",
    "InvalidModelEntryError",
    "LogBacklogError",
    "ModelCannotStartError",
    "ModelConflictError",
    "ModelDeletedError",
    "ModelNotOwnedError",
    "ModelTooLargeError",
    "NotEnoughSamplesError",
    "SamplesUnavailableError",
    "StoreFullError",
    "SweepBusyError",
    "SweepRefusedError",
    "TooManyEventStreamsError",
    "TooManyModelsError",
    "UnknownModelError",
    "UnknownSampleError",
    "VersionNotKeptError",
    "WrongDimensionError",
    "ZeroVectorError",
]


class DomainError(Exception):
    """A use case refused the request; :attr:`detail` says why, in plain words."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# -- samples in ----------------------------------------------------------------------
class WrongDimensionError(DomainError):
    """Vectors of ``got_dim`` coordinates for a model of dimension ``expected_dim``
    (a batch of another dimension fixed the model's dimension first)."""

    def __init__(self, expected_dim: int, got_dim: int, detail: str) -> None:
        super().__init__(detail)
        self.expected_dim = expected_dim
        self.got_dim = got_dim


class ZeroVectorError(DomainError):
    """Under ``metric="cosine"`` vector ``row`` (its index in the request, the first such
    one) is zero: it has no direction. ``outcome`` says what became of the request
    (nothing of it is stored, or assigned)."""

    def __init__(self, row: int, outcome: str) -> None:
        super().__init__(
            f"vector {row} is a zero vector: it has no direction, and this model "
            f"(metric=cosine) clusters directions; {outcome}"
        )
        self.row = row


class IdempotencyKeyReusedError(DomainError):
    """The ``Idempotency-Key`` already stored a request with other vectors."""


class UnknownSampleError(DomainError):
    """No sample of model ``model`` has id ``sample_id`` (never stored, deleted, or gone
    from the model and its log)."""

    def __init__(self, model: str, sample_id: str) -> None:
        super().__init__(
            f"model '{model}' has no sample {sample_id!r} (never stored, deleted, or retired "
            "by the retention and trimmed from the log)"
        )
        self.model = model
        self.sample_id = sample_id


class SamplesUnavailableError(DomainError):
    """Requests about single samples (lookup, deletion) of model ``model`` cannot be
    served now: its worker runs in another process, is starting or replaying, or Redis is
    away. Nothing was deleted unless the detail says so; retry shortly."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(f"samples of model '{model}' cannot be looked up or deleted now: "
                         f"{why}; retry shortly")  # fmt: skip
        self.model = model


class DuplicateSampleIdError(DomainError):
    """Sample id ``sample_id`` of the request is already a sample id of model ``model``
    (ids are unique per model); nothing of the request is stored."""

    def __init__(self, model: str, sample_id: str) -> None:
        super().__init__(
            f"sample id {sample_id!r} is already a sample of model '{model}' (ids are unique "
            "per model); nothing of this request was stored"
        )
        self.model = model
        self.sample_id = sample_id


class StoreFullError(DomainError):
    """The append would pass the model's capacity (or the memory of its Redis): nothing
    of the ``rejected`` rows is stored.

    Attributes
    ----------
    setting : str
        What to raise to store more (``NMBATCH_MAX_SAMPLES``, or a named model's
        ``max_samples``).
    max_samples : int
        The model's capacity.
    n_samples : int
        Samples in the log when the append was refused.
    rejected : int
        Rows of the refused batch.
    """

    def __init__(
        self, detail: str, *, setting: str, max_samples: int, n_samples: int, rejected: int
    ) -> None:
        super().__init__(detail)
        self.setting = setting
        self.max_samples = max_samples
        self.n_samples = n_samples
        self.rejected = rejected


class LogBacklogError(DomainError):
    """The embedded Redis's memory is full while the retention (not ``all``) has rows to
    trim: a moment's backlog, the same ``rejected`` rows fit shortly."""

    def __init__(self, detail: str, *, n_samples: int, rejected: int) -> None:
        super().__init__(detail)
        self.n_samples = n_samples
        self.rejected = rejected


# -- centroids out ------------------------------------------------------------------
class NotEnoughSamplesError(DomainError):
    """No centroids yet: ``n_samples`` stored, ``k`` needed (``needed`` more)."""

    def __init__(self, n_samples: int, k: int) -> None:
        super().__init__(
            f"no centroids yet: {n_samples} samples stored, k = {k} are needed before the "
            f"first iteration; send {k - n_samples} more"
        )
        self.needed = k - n_samples
        self.n_samples = n_samples
        self.k = k


class CentroidsPendingError(DomainError):
    """Enough samples (``n_samples`` of ``k``) are stored; the first iteration runs."""

    needed = 0  # no more samples are needed, only time

    def __init__(self, n_samples: int, k: int) -> None:
        super().__init__(
            f"{n_samples} samples stored; the first centroids are being computed, retry shortly"
        )
        self.n_samples = n_samples
        self.k = k


# -- the models ---------------------------------------------------------------------
class UnknownModelError(DomainError):
    """No model is named ``model``."""

    def __init__(self, model: str) -> None:
        super().__init__(f"no model named '{model}': create it with PUT /models/{model}")
        self.model = model


class ModelDeletedError(DomainError):
    """Model ``model`` was deleted (or deleted and created again) while a request that
    had picked it was in flight; nothing of the request was stored."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"model '{model}' was deleted while this request was in flight; nothing was "
            "stored"
        )
        self.model = model


class ModelNotOwnedError(DomainError):
    """Model ``model`` is another service's default model, or was created by another
    service (another ``NMBATCH_MODEL``) or holds data no registered model owns: this
    service may not create, replace or delete it. ``detail`` says which."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(detail)
        self.model = model


class InvalidModelEntryError(DomainError):
    """Model ``model``'s registry entry does not validate (written by hand, or by another
    version); its data is kept, the model is not started until the entry is fixed or the
    model deleted."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(
            f"the registry entry of model '{model}' is not valid ({why}); its data is "
            f"kept: fix the entry, or DELETE /models/{model}?confirm={model}"
        )
        self.model = model


class ModelConflictError(DomainError):
    """Model ``model`` exists with other settings (``current``, None if unknown)."""

    def __init__(self, model: str, current: dict[str, Any] | None) -> None:
        super().__init__(
            f"model '{model}' exists with other settings; DELETE it first (its data goes "
            "with it) or PUT its current settings"
        )
        self.model = model
        self.current = current


class ModelCannotStartError(DomainError):
    """Model ``model`` is registered but cannot start here (Redis holds its data with
    another ``k`` or dimension, Redis unreachable ...); ``detail`` says why."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(detail)
        self.model = model


class TooManyModelsError(DomainError):
    """``count`` named models exist, as many as ``max_models`` allows."""

    setting = "NMBATCH_MAX_MODELS"

    def __init__(self, count: int, max_models: int) -> None:
        super().__init__(
            f"{count} named models exist, NMBATCH_MAX_MODELS = {max_models}; delete one "
            "or raise the setting"
        )
        self.count = count
        self.max_models = max_models


class DimensionTooLargeError(DomainError):
    """A model of dimension ``dim``, above ``max_dim``."""

    setting = "NMBATCH_MAX_DIM"

    def __init__(self, dim: int, max_dim: int) -> None:
        super().__init__(f"dim = {dim} is above NMBATCH_MAX_DIM = {max_dim}")
        self.dim = dim
        self.max_dim = max_dim


class ModelTooLargeError(DomainError):
    """Model ``model``'s samples and centroids would not fit the memory one model may take.

    Attributes
    ----------
    model : str
        The model's name.
    setting : str
        The spec's setting that asked for too much (``max_samples``, else ``k``).
    required_bytes : int
        The memory the model would need.
    limit_bytes : int
        The memory one model may take.
    max_samples_fitting : int
        The samples that memory holds.
    """

    limit_setting = "NMBATCH_MODEL_MAX_BYTES"

    def __init__(
        self,
        detail: str,
        *,
        model: str,
        setting: str,
        required_bytes: int,
        limit_bytes: int,
        max_samples_fitting: int,
    ) -> None:
        super().__init__(detail)
        self.model = model
        self.setting = setting
        self.required_bytes = required_bytes
        self.limit_bytes = limit_bytes
        self.max_samples_fitting = max_samples_fitting


class DefaultModelError(DomainError):
    """Model ``model`` is the service's default one: it cannot be deleted."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"'{model}' is the service's default model (NMBATCH_MODEL); it cannot be "
            "deleted through the API"
        )
        self.model = model


# -- seeding, re-clustering, choosing k -------------------------------------------------
class InvalidInitError(DomainError):
    """The initial centroids given for model ``model`` cannot seed it: ``fault`` names
    what is wrong (``shape``: not ``(k, dim)``; ``values``: not finite, not numbers;
    ``zero-row``: a zero row under cosine, ``row`` its index; ``missing``: ``init=given``
    without centroids; ``unsupported``: the model cannot take them). Nothing is created."""

    def __init__(self, model: str, fault: str, detail: str, row: int | None = None) -> None:
        super().__init__(f"init of model '{model}': {detail}; nothing was created")
        self.model = model
        self.fault = fault
        self.row = row


class SweepRefusedError(DomainError):
    """A re-clustering or a sweep of model ``model`` cannot run: ``setting`` names the
    bound or the setting in the way (``ks``, ``k``, ``max_samples`` ...); nothing changed."""

    def __init__(self, model: str, setting: str, detail: str) -> None:
        super().__init__(detail)
        self.model = model
        self.setting = setting


class SweepBusyError(DomainError):
    """Another sweep runs in this process (one at a time: each takes a core for seconds);
    retry shortly."""

    def __init__(self) -> None:
        super().__init__("another sweep of k runs in this process (one at a time); retry "
                         "when it is done")  # fmt: skip


# -- kept versions -------------------------------------------------------------------
class VersionNotKeptError(DomainError):
    """Version ``version`` of model ``model`` is not kept (never snapshotted, or forgotten
    past the bound): it can be neither read nor pinned. ``kept`` lists the kept ones."""

    def __init__(self, model: str, version: int, kept: list[int], bound: int) -> None:
        listed = (
            f"versions {kept[0]} to {kept[-1]} ({len(kept)} kept)" if kept
            else "no version yet"
        )  # fmt: skip
        super().__init__(
            f"version {version} of model '{model}' is not kept: it keeps {listed}, at most "
            f"{bound} (NMBATCH_KEEP_VERSIONS, NMBATCH_KEEP_VERSIONS_BYTES); a version is kept "
            "when it is snapshotted (every NMBATCH_SNAPSHOT_SECONDS); GET versions lists them"
        )
        self.model = model
        self.version = version
        self.kept = kept


# -- events ----------------------------------------------------------------------------
class TooManyEventStreamsError(DomainError):
    """This server already serves ``max_streams`` event streams (``GET /events``)."""

    def __init__(self, max_streams: int) -> None:
        super().__init__(
            f"this server already serves {max_streams} event streams "
            "(NMBATCH_EVENTS_MAX_CONNECTIONS); try again later, or another server"
        )
        self.setting = "NMBATCH_EVENTS_MAX_CONNECTIONS"
        self.max_streams = max_streams
