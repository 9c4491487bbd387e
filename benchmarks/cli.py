"""``python -m benchmarks`` (and ``nmbatch bench`` from a checkout): which benchmark to run.

- ``--drift``: the drift benchmark (:mod:`benchmarks.drift`: streams that change, methods
  that forget; drift.json, drift.md and drift.png; its options: ``--drift --help``);
- ``--large-k``: the benchmark at several ``k`` into one folder, with memory per sample
  (:mod:`benchmarks.large_k`);
- otherwise the time-to-energy benchmark of the paper's Results section
  (:mod:`benchmarks.paper`; its options: :func:`benchmarks.options.build_parser`).

The arguments go on to the benchmark chosen unchanged (``--large-k`` removed).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark that ``argv`` (default ``sys.argv[1:]``) names; its exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if "--drift" in words:
        from benchmarks.drift import main as drift_main

        return drift_main(words)
    if "--large-k" in words:
        from benchmarks.large_k import main as large_k_main

        return large_k_main([a for a in words if a != "--large-k"])
    from benchmarks.paper import main as paper_main

    return paper_main(argv)
