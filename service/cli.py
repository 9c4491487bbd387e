"""``nmbatch serve``: run the HTTP service with command-line overrides of its settings.

The command line (``nmbatch/cli.py``) parses the options (``--host``, ``--port``,
``--redis-url``, ``--k``, ``--set NAME=VALUE``); this module turns them into
``NMBATCH_*`` variables, checked against ``Settings``, and runs ``python -m nmbatch`` in
this process. Importing it loads neither FastAPI nor numpy.

The service reads its settings from the environment in every way it starts (``python -m
nmbatch``, Docker, ``nmbatch serve``), so a flag is an environment variable set for this
run: flag over environment over default. pydantic-settings' CLI source is not used: it
would import pydantic for every ``nmbatch`` command's parser, name the field ``k``
``-k`` only, and write its own help (``{int,null}``, ``(default: null)``).
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["ENV_PREFIX", "ServeError", "run_serve", "serve_environment"]

ENV_PREFIX = "NMBATCH_"


class ServeError(Exception):
    """A bad ``--set`` (not NAME=VALUE, or no such setting): one line, exit status 2."""


def serve_environment(args: argparse.Namespace) -> dict[str, str]:
    """The ``NMBATCH_*`` variables that ``serve``'s options set, checked against Settings.

    Raises ``ServeError`` for a ``--set`` name that is not a field of
    ``nmbatch.service.config.Settings``.
    """
    from nmbatch.service.config import Settings  # pydantic only: no FastAPI

    fields = set(Settings.model_fields)
    values: dict[str, str] = {}
    for name in ("host", "port", "redis_url", "k"):
        value = getattr(args, name)
        if value is not None:
            values[name] = str(value)
    for item in args.overrides:
        name, sep, value = item.partition("=")
        name = name.strip().lower().replace("-", "_")
        if name.startswith(ENV_PREFIX.lower()):
            name = name[len(ENV_PREFIX) :]
        if not sep or not name:
            raise ServeError(f"--set expects NAME=VALUE, got {item!r}")
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise ServeError(f"--set {name}: no such setting (known: {known})")
        values[name] = value
    return {ENV_PREFIX + name.upper(): value for name, value in values.items()}


def run_serve(args: argparse.Namespace) -> int:
    """Run ``python -m nmbatch`` in this process with the option overrides in the environment.

    Returns the service's exit status.
    """
    import runpy

    os.environ.update(serve_environment(args))
    saved_argv = sys.argv[:]
    sys.argv = [saved_argv[0] if saved_argv else "nmbatch"]  # the service must not see our options
    try:
        runpy.run_module("nmbatch", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved_argv
    return 0
