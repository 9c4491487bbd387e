"""Priorities of the distributed store: distinct within a shard, mapped down when due.

A shard's priorities are distinct int64 in its residue class modulo the number of shards
(:mod:`.stream`); :func:`distinct` raises repeats, :func:`respread` gives new rows their
room back once the prefix threshold has risen far.
"""

from __future__ import annotations

import numpy as np

__all__ = ["distinct", "respread"]


def distinct(priority: np.ndarray, stride: int) -> np.ndarray:
    """``priority`` ``(n,)`` int64 with repeats raised by ``stride`` until none is left:
    of equal values, the one of lowest index keeps it (a shard's rows come before its
    queue, and are distinct: they never move). A repeat has a chance of about ``n^2 / 2^63``."""
    priority = priority.copy()
    while True:
        order = np.argsort(priority, kind="stable")
        ranked = priority[order]
        repeat = np.flatnonzero(ranked[1:] == ranked[:-1]) + 1
        if not repeat.shape[0]:
            return priority
        priority[order[repeat]] += stride


def respread(priority: np.ndarray, tau: int, tau_new: int, levels: int, stride: int) -> np.ndarray:
    """``priority`` ``(n,)`` int64 mapped so that the prefix ``{p < tau}`` lands in
    ``[0, levels * stride)`` and the rest keeps its gaps above ``tau_new``.

    ``p < tau``: ``q = p // stride`` scaled to ``floor(q * levels / (tau // stride + 1))``
    (monotone: float64 rounding is), then ``q' * stride + p % stride``; ``p >= tau``:
    lowered by ``tau - tau_new`` rounded down to a multiple of ``stride``. Order is kept
    (prefix rows may tie: they hold their votes, their order no longer matters), every
    value keeps its residue modulo ``stride``, and ``#{p' < tau_new} = #{p < tau}`` when
    ``tau_new >= 2 * levels * stride`` (room for the raises of ties by ``stride``).
    """
    priority = np.asarray(priority, dtype=np.int64)
    stride = int(stride)
    low = priority < tau
    q = priority[low] // stride
    scale = levels / float(tau // stride + 1)
    q_new = np.minimum(np.floor(q.astype(np.float64) * scale).astype(np.int64), levels - 1)
    out = priority - (int(tau) - int(tau_new)) // stride * stride
    out[low] = q_new * stride + priority[low] % stride
    return out
