"""The worker's states: its role among the processes serving a model, and its phase.

Both are ``StrEnum``: their values are what ``/readyz``, ``/stats`` and the logs show,
and a value compares equal to its string.

Roles (decided by the lease in Redis, :mod:`nmbatch.service.worker.lease`)::

    STARTING --begin(), lease taken--> WORKER
    STARTING --begin(), lease held elsewhere--> STANDBY
    STANDBY --lease taken (free, expired, or its holder gone)--> WORKER
    WORKER --lease found taken by another process--> STANDBY

Phases (what the thread does; ``STANDBY`` while in that role)::

    STARTING -> WAITING_FOR_DIMENSION -> STARTING_ENGINE -> REPLAYING
             -> ITERATING <-> CONVERGED | WAITING_FOR_SAMPLES
    an engine process that died: back to WAITING_FOR_DIMENSION (a new engine, replay)
    any phase -> STOPPED (stop()) or FAILED (an error other than Redis being away)
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Phase", "Role"]


class Role(StrEnum):
    """Whether this process runs the model's iterations."""

    STARTING = "starting"
    """Before :meth:`Worker.begin` decided."""
    WORKER = "worker"
    """Holds the lease: iterates, publishes, writes snapshots."""
    STANDBY = "standby"
    """Serves the worker's snapshots and takes the lease when it is free."""


class Phase(StrEnum):
    """What the worker thread is doing."""

    STARTING = "starting"
    STANDBY = "standby"
    WAITING_FOR_DIMENSION = "waiting-for-dimension"
    STARTING_ENGINE = "starting-engine"
    REPLAYING = "replaying"
    ITERATING = "iterating"
    CONVERGED = "converged"
    WAITING_FOR_SAMPLES = "waiting-for-samples"
    STOPPED = "stopped"
    FAILED = "failed"
