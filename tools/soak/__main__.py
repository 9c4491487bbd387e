"""Entry point of ``python -m tools.soak``."""

from tools.soak.cli import main

raise SystemExit(main())
