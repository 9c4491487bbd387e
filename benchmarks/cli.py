"""``python -m benchmarks`` (and ``nmbatch bench`` from a checkout): which benchmark to run.

- ``--drift``: the drift benchmark (:mod:`benchmarks.drift`: streams that change, methods
  that forget; drift.json, drift.md and drift.png; its options: ``--drift --help``);
- ``--large-k``: the benchmark at several ``k`` into one folder, with memory per sample
  (:mod:`benchmarks.large_k`);
- ``--mode user``: the benchmark as users run it, the headline tables: every method with
  its own defaults and its own initialisation inside the clock (:mod:`benchmarks.usermode`;
  its options: ``--mode user --help``);
- otherwise (``--mode shared``, the default) the time-to-energy benchmark of the paper's
  Results section: one shared start, seeding outside the clock (:mod:`benchmarks.paper`;
  its options: :func:`benchmarks.options.build_parser`).

The arguments go on to the benchmark chosen unchanged (``--large-k`` and ``--mode M``
removed).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark that ``argv`` (default ``sys.argv[1:]``) names; its exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    mode, words = _pop_mode(words)
    if mode == "user":
        from benchmarks.usermode import main as user_main

        return user_main(words)
    if "--drift" in words:
        from benchmarks.drift import main as drift_main

        return drift_main(words)
    if "--large-k" in words:
        from benchmarks.large_k import main as large_k_main

        return large_k_main([a for a in words if a != "--large-k"])
    from benchmarks.paper import main as paper_main

    return paper_main(words)


def _pop_mode(words: list[str]) -> tuple[str, list[str]]:
    """``--mode user|shared`` (or ``--mode=...``) taken out of ``words``; default shared."""
    mode, rest = "shared", []
    it = iter(words)
    for w in it:
        if w == "--mode":
            mode = next(it, "")
        elif w.startswith("--mode="):
            mode = w.split("=", 1)[1]
        else:
            rest.append(w)
    if mode not in ("user", "shared"):
        raise SystemExit(f"--mode must be user or shared, got {mode!r}")
    return mode, rest
