"""How many threads the engine's kernels and BLAS use.

numba's thread count is per calling thread (``numba.set_num_threads``); BLAS's is per
process (threadpoolctl). :func:`thread_limits` sets both for the duration of a call and
restores them after, so an estimator's ``n_threads`` holds for its own calls only (BLAS
aside, which has one pool per process). The results never depend on the count
(:mod:`nmbatch.engine.kernels.parallel`); only the time does.

While the algorithms iterate (:func:`kernel_threads`: ``fit``, ``partial_fit``, the
benchmark, the service's engine) the kernels run on ``n`` threads and BLAS on one, as
scikit-learn's k-means does. Each step alternates BLAS products with numba kernels, and
OpenBLAS's idle threads spin for a while after every product: with BLAS on ``n`` threads
they take the cores from the kernels that follow. Measured on MNIST, k = 50, 2 cores, 8
fits each (median seconds): kernels and BLAS at 2 threads 1.90-2.26, kernels at 2 and
BLAS at 1 1.63-1.66, everything at 1 thread 2.21-2.61. At k = 50 the products are a few
percent of a step. ``predict``, ``transform`` and ``score`` (one large product, one
kernel) give BLAS ``n`` threads too.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar

import numba

__all__ = [
    "available_cores",
    "check_threads",
    "kernel_threads",
    "thread_limits",
    "with_kernel_threads",
    "with_threads",
]

_controller: Any = None  # threadpoolctl's view of the loaded BLAS libraries, made once

F = TypeVar("F", bound=Callable[..., Any])


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota.

    scikit-learn and threadpoolctl count the same way (``os.sched_getaffinity``, then the
    quota of the container's CPU controller, v2 ``cpu.max`` or v1 ``cfs_quota_us``).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, int(quota + 0.999)))
    return max(1, cores)


def _cgroup_cpu_quota() -> float | None:
    """CPUs allowed by the cgroup's quota (None: no quota, or no cgroup file)."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def check_threads(n_threads: object) -> None:
    """Raise ``ValueError`` unless ``n_threads`` is None or an int >= 1."""
    if n_threads is None:
        return
    if isinstance(n_threads, bool) or not isinstance(n_threads, numbers.Integral) or n_threads < 1:
        raise ValueError(f"n_threads must be None or an int >= 1, got {n_threads!r}")


@contextmanager
def thread_limits(n_threads: int | None, *, blas_threads: int | None = None) -> Iterator[int]:
    """Run the block with ``n_threads`` numba threads (this thread) and BLAS threads.

    ``None``: every available core (:func:`available_cores`). numba cannot exceed the pool
    it started with (``NUMBA_NUM_THREADS``, all cores by default). ``blas_threads``: BLAS's
    count if not ``n_threads``. Yields the count used.
    """
    global _controller
    check_threads(n_threads)
    n = available_cores() if n_threads is None else int(n_threads)
    before = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    try:
        if _controller is None:
            from threadpoolctl import ThreadpoolController

            _controller = ThreadpoolController()
        with _controller.limit(limits=blas_threads or n, user_api="blas"):
            yield n
    finally:
        numba.set_num_threads(before)


def kernel_threads(n_threads: int | None) -> Any:
    """:func:`thread_limits` for iterating: kernels on ``n_threads``, BLAS on one."""
    return thread_limits(n_threads, blas_threads=1)


def with_threads(method: F) -> F:
    """Decorate an estimator method to run under ``thread_limits(self.n_threads)``."""

    @wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with thread_limits(getattr(self, "n_threads", None)):
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


def with_kernel_threads(method: F) -> F:
    """Decorate an estimator method to run under ``kernel_threads(self.n_threads)``."""

    @wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with kernel_threads(getattr(self, "n_threads", None)):
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]
