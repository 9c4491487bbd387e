"""What a phase of the load benchmark is: :class:`PhaseSpec` (who sends what, how long).

:mod:`benchmarks.loadtest.phases` defines the phases and runs them;
:mod:`benchmarks.loadtest.summary` summarises one by its spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PhaseSpec"]


@dataclass
class PhaseSpec:
    """One phase: who sends what, for how long."""

    name: str
    seconds: float
    ingest_kinds: list[str] = field(default_factory=list)
    ingest_rate: float | None = None  # vectors/s in total; None: as fast as possible
    assign_rate: float | None = None  # requests/s; None: no /assign client
    sample_every: float = 1.0
