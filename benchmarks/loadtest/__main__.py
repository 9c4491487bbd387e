"""Entry point of ``python -m benchmarks.loadtest``."""

from benchmarks.loadtest.cli import main

raise SystemExit(main())
