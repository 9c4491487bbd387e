"""The Python client, under its former name: :mod:`nmbatch_client`, re-exported.

The client is its own distribution (``nmbatch-client``, the repository's ``client/``
folder), which the server's distribution ships as well. ``from nmbatch.service.client
import Client`` (and ``from service.client import ...`` from a checkout) give the very
classes of :mod:`nmbatch_client`; its modules are ``nmbatch_client.retry``,
``nmbatch_client.cli`` ... Names are imported on first use, as there.
"""

from __future__ import annotations

from typing import Any

import nmbatch_client

__all__ = list(nmbatch_client.__all__)


def __getattr__(name: str) -> Any:
    return getattr(nmbatch_client, name)
