"""What the client's calls return: centroids, assignments, the outcome of a push.

The arrays are read-only: :class:`Centroids` may be the very object an earlier call
returned (the service answered ``304 Not Modified``), so nobody may change it in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Assignment", "Centroids", "PushResult", "follow_cluster"]


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class Centroids:
    """One published version of the model (``GET /centroids``).

    Attributes
    ----------
    version : int
        Centroid version; it grows with every update.
    centroids : ndarray of shape (k, d), float32
        The centroids, exactly as the service holds them.
    counts : ndarray of shape (k,), int64 (float64 for a model fed sample weights)
        ``v(j)``: samples of the nested batch assigned to each centroid (the sum of
        their weights when samples were pushed with weights).
    n_samples : int
        Samples the model holds (``N``).
    n_ingested : int
        Samples ever accepted into the model's log.
    batch_size : int
        The nested batch size ``b``.
    iteration : int
        Iterations run so far.
    converged : bool
        No centroid moved in the last iteration over all ``N`` samples.
    retention : str
        The service's retention policy (``all``, ``window``, ...).
    updated_at : str
        Time of this version, ISO 8601 UTC.
    etag : str or None
        The answer's ``ETag``, sent back in ``If-None-Match``.
    """

    version: int
    centroids: np.ndarray
    counts: np.ndarray
    n_samples: int
    n_ingested: int
    batch_size: int
    iteration: int
    converged: bool
    retention: str
    updated_at: str
    etag: str | None = None

    @property
    def k(self) -> int:
        """Number of clusters."""
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        """Dimension ``d``."""
        return int(self.centroids.shape[1])

    @classmethod
    def from_document(cls, document: dict[str, Any], etag: str | None) -> Centroids:
        """From the JSON document of ``GET /centroids``.

        The service writes float32 values in their shortest decimal form, so the float32
        array rebuilt here equals the service's bit for bit.
        """
        k, dim = int(document["k"]), int(document["dim"])
        centroids = np.asarray(document["centroids"], dtype=np.float64).astype(np.float32)
        return cls(
            version=int(document["version"]),
            centroids=_frozen(centroids.reshape(k, dim)),
            counts=_frozen(_counts(document["counts"]).reshape(k)),
            n_samples=int(document["n_samples"]),
            n_ingested=int(document["n_ingested"]),
            batch_size=int(document["batch_size"]),
            iteration=int(document["iteration"]),
            converged=bool(document["converged"]),
            retention=str(document["retention"]),
            updated_at=str(document["updated_at"]),
            etag=etag,
        )


@dataclass(frozen=True)
class Assignment:
    """Nearest centroids of a batch (``POST /assign``, in one or more requests).

    Attributes
    ----------
    labels : ndarray of shape (n,), int64
        Index of each vector's nearest centroid (ties: the lowest index).
    distances : ndarray of shape (n,), float64
        Euclidean distance of each vector to it.
    version : int
        Centroid version of the last request.
    versions : tuple of int
        The distinct versions used, ascending: more than one when the batch took several
        requests and the centroids changed in between.
    similarities : ndarray of shape (n,), float64, or None
        Under a cosine model (``metric="cosine"``), the cosine similarity of each vector
        to its centroid (``1 - d^2 / 2`` of the unit vectors); None under Euclidean.
    """

    labels: np.ndarray
    distances: np.ndarray
    version: int
    versions: tuple[int, ...]
    similarities: np.ndarray | None = None


@dataclass(frozen=True)
class PushResult:
    """The outcome of :meth:`Client.push`.

    Attributes
    ----------
    accepted : int
        Vectors the service acknowledged (all of them: a refusal raises).
    n_samples : int or None
        Samples in the model's log after the last request (None: nothing was sent).
    requests : int
        ``POST /samples`` requests acknowledged (one per chunk).
    replayed : int
        Of those, answered from an earlier identical request (``Idempotent-Replayed``):
        stored once, by that earlier request.
    retries : int
        Requests repeated after no answer or a "not now" answer (503, ...).
    idempotency_key : str
        The key prefix; chunk ``[start, stop)`` was sent as ``"{key}:{start}-{stop}"``.
    ids : tuple of str, or None
        Every row's sample id, in row order: the ids sent (an integer as its decimal
        string), else those the service assigned (``"<log entry id>-<row>"``); the ids
        ``sample`` and ``delete_samples`` take. None if an answer carried none (the
        replay of a request stored by a service before ids existed).
    """

    accepted: int
    n_samples: int | None
    requests: int
    replayed: int
    retries: int
    idempotency_key: str
    ids: tuple[str, ...] | None = None


def _counts(values: list[Any]) -> np.ndarray:
    """``counts`` of a centroids document: int64 counts, or float64 sums of weights (a
    weighted model's, which the service sends as JSON numbers with a fraction)."""
    if all(isinstance(v, int) for v in values):
        return np.asarray(values, dtype=np.int64)
    return np.asarray(values, dtype=np.float64)


def follow_cluster(
    versions: Sequence[Mapping[str, Any]], cluster: int, version: int
) -> dict[int, int | None]:
    """Where cluster ``cluster`` of kept version ``version`` is in the later kept
    versions, by the ``identities`` each carries (``versions``: the ``versions`` of a
    ``GET /versions`` document, :meth:`Client.versions`).

    Returns ``{version: index}`` from ``version`` on: the index that holds the cluster's
    samples in each version (the same index while nothing happened to it; the cluster it
    joined after a swap merged it), None once it ended (it lost every sample; its index
    may since name a relocated cluster). Stops before the first version whose
    identities are not against the version before it (a version kept before identities
    were, or one the bound forgot in between): past it the answer is not known.
    """
    found: dict[int, int | None] = {version: cluster}
    current: int | None = cluster
    previous = version
    for row in sorted(versions, key=lambda r: r["version"]):
        if row["version"] <= version:
            continue
        identities = row.get("identities")
        if identities is None or identities["since"] != previous:
            break
        if current is not None:
            moved = {old: new for old, new in identities["matching"]}
            current = moved.get(current, current)
        found[row["version"]] = current
        previous = row["version"]
    return found
