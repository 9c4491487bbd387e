"""Entry point of ``python -m tools.loadtest``."""

from tools.loadtest.cli import main

raise SystemExit(main())
