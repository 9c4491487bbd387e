"""Entry point of ``python -m engine.bench``."""

from engine.bench.cli import main

raise SystemExit(main())
