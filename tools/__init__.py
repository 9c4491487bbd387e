"""Programs that are neither the engine nor the service, run from a checkout.

They are not installed with the wheel: run them from the repository's root, for example
``python -m tools.loadtest --help`` (the load benchmark of the HTTP service). They may
import :mod:`nmbatch`; nothing in :mod:`nmbatch` imports them.
"""
