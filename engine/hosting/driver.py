"""The streaming loop, once: admit, feed, step, publish.

Every streaming model runs the same four steps per chunk of the stream:

1. **admit**: the retention policy answers the chunk's ``m`` rows with an
   :class:`~nmbatch.engine.retention.Admission` (which rows enter under which stream ids,
   which stored ones leave; :func:`admit`);
2. **feed**: the host carries the admission out, the retirements first (votes taken back
   exactly), then the append (:func:`offer` on an :class:`~.protocol.EngineHost`;
   every host does it with :func:`retire_then_append`);
3. **step**: iterations while the host is ready, the chunk's own and up to ``catch_up``
   more while each calls for another (:func:`iterate`);
4. **publish**: after each iteration, the caller's ``publish(state)``.

The callers differ only in what they pass: ``NestedMiniBatchKMeans.partial_fit`` (a
:class:`~.local.LocalEngine` around its own store and algorithm, the chunk's time
``now``, ``catch_up`` from its parameters, ``publish`` setting the fitted attributes and
calling ``callback``); the service's worker (any host, rows or
:class:`~nmbatch.engine.rows.SourceRows` read from its log, the entry's time, one
iteration per turn of its loop, ``publish`` to its model board, no iteration while the
model is :func:`settled`); the Ray coordinator is fed through its host
(:class:`~.ray.RayEngine`) by the worker's loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nmbatch.engine.retention import Admission, RetentionPolicy, wants_catch_up
from nmbatch.engine.rows import SourceRows
from nmbatch.engine.state import ModelState

from .protocol import NO_IDS, EngineHost

__all__ = [
    "Publish",
    "admit",
    "carry_out",
    "feed",
    "iterate",
    "offer",
    "retire_then_append",
    "settled",
]

#: ``publish(state)``: sees the model after each iteration (``state.stats`` set).
Publish = Callable[[ModelState], object]

Rows = np.ndarray | SourceRows


# -- admit ----------------------------------------------------------------------------------
def admit(
    policy: RetentionPolicy, X: Rows, now: float | None = None
) -> tuple[Rows, Admission]:
    """Offer the ``m`` rows of ``X`` (``(m, d)`` float32, or the :class:`SourceRows`
    naming them) to ``policy`` at ``now`` (seconds; None: the policy's clock); returns the
    rows that enter (``X`` itself when all do) and the :class:`Admission`. A
    :class:`~nmbatch.engine.retention.CapacityError` leaves the policy unchanged."""
    adm = policy.admit(X.shape[0], now)
    rows = X if adm.keep.shape[0] == X.shape[0] else X[adm.keep]
    return rows, adm


# -- feed -----------------------------------------------------------------------------------
def retire_then_append(
    retire: Callable[[np.ndarray, int], object],
    append: Callable[[Any, np.ndarray], object],
    rows: Rows,
    ids: np.ndarray,
    retire_ids: np.ndarray = NO_IDS,
    retire_before: int = 0,
) -> None:
    """Carry an admission out on a model: ``retire(retire_ids, retire_before)`` if it
    retires anything (ids ``(r,)`` int64, every id below ``retire_before``), then
    ``append(rows, ids)`` if it admits any row (``(m, d)`` float32 or named, ``(m,)``
    int64 stream ids). Retiring first keeps the store within the policy's bound."""
    if retire_before > 0 or retire_ids.shape[0]:
        retire(retire_ids, retire_before)
    if rows.shape[0]:
        append(rows, ids)


def carry_out(
    algo: Any,
    rows: np.ndarray,
    ids: np.ndarray,
    retire_ids: np.ndarray = NO_IDS,
    retire_before: int = 0,
    *,
    any_order: bool = False,
    weights: np.ndarray | None = None,
) -> None:
    """:func:`retire_then_append` on ``algo`` (a ``KMeansAlgorithm``, whose ``retire``
    takes the votes back) and its store (``any_order``: ``ids`` not necessarily
    increasing; a retained set restored in its own order; ``weights``: ``(m,)`` sample
    weights of ``rows``, None: 1)."""
    retire_then_append(
        lambda these, before: algo.retire(ids=these, before=before),
        lambda X, these: algo.store.append(X, ids=these, any_order=any_order,
                                           weights=weights),
        rows, ids, retire_ids, retire_before,
    )  # fmt: skip


def offer(
    policy: RetentionPolicy,
    host: EngineHost,
    X: Rows,
    now: float | None = None,
    weights: np.ndarray | None = None,
) -> Admission:
    """Admit the rows of ``X`` (:func:`admit`) and feed the admission to ``host``
    (``EngineHost.feed``, ``n_after`` the policy's count); returns the admission.
    ``weights`` ``(m,)`` float64 or None: the rows' sample weights (those of the admitted
    rows go with them; the policy admits rows, whatever their weight)."""
    rows, adm = admit(policy, X, now)
    kwargs = {}
    if weights is not None:
        kwargs["weights"] = weights if adm.keep.shape[0] == X.shape[0] else weights[adm.keep]
    host.feed(rows, adm.ids, n_after=policy.retained, retire_ids=adm.retire_ids,
              retire_before=adm.retire_before, **kwargs)  # fmt: skip
    return adm


def feed(
    policy: RetentionPolicy, algo: Any, X: np.ndarray, now: float | None = None
) -> Admission:
    """:func:`offer` straight on an algorithm (a ``KMeansAlgorithm``), with no host: the
    rows of ``X`` (``(m, d)`` float32, checked) admitted and carried out (:func:`carry_out`).
    A :class:`~nmbatch.engine.retention.CapacityError` leaves everything unchanged."""
    rows, adm = admit(policy, X, now)
    carry_out(algo, rows, adm.ids, adm.retire_ids, adm.retire_before)
    return adm


# -- step and publish -------------------------------------------------------------------------
def settled(host: EngineHost) -> bool:
    """True when ``host``'s model converged and no sample waits outside its batch (an
    iteration would change nothing)."""
    state = host.state
    return state.converged and host.store.n_samples == state.batch_size


def iterate(host: EngineHost, publish: Publish, *, catch_up: int = 0) -> int:
    """Run one iteration of ``host`` and up to ``catch_up`` more, each only while the one
    before calls for it (:func:`~nmbatch.engine.retention.wants_catch_up`), all while
    ``host.ready()``; ``publish(state)`` after each. Returns the iterations run."""
    budget, n = 1 + int(catch_up), 0
    while budget and host.ready():
        budget -= 1
        state = host.step()
        n += 1
        publish(state)
        stats = state.stats
        assert stats is not None
        if not wants_catch_up(stats.n_changed, stats.batch_size, stats.n_relocated):
            break
    return n
