"""Entry point of ``python -m nmbatch.engine.bench``."""

from nmbatch.engine.bench.cli import main

raise SystemExit(main())
