"""The benchmark process's set-up: thread pools, memory, and the environment of its children.

Every timed run (the k = 50 benchmark, the drift and large-k benchmarks, the memory and
faiss workers, the phase profiler, ``fit_timing``) calls these before its clock starts,
so every algorithm meets the same pools and the same already-backed memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CHECKOUT",
    "available_gib",
    "child_env",
    "keep_freed_memory",
    "limit_threads",
    "prefault_memory",
]

_LIMITERS: list[Any] = []  # keeps the threadpoolctl limiter alive for the process

# The repository checkout holding this package: on a child's PYTHONPATH, so that
# ``python -m benchmarks...`` runs whatever the parent's working directory.
CHECKOUT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with :data:`CHECKOUT` first on ``PYTHONPATH``, plus
    ``extra``: for child processes started as ``python -m benchmarks...``."""
    path = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def limit_threads(threads: int) -> None:
    """One thread count for every BLAS and OpenMP pool (threadpoolctl), numba and faiss.

    Imports the libraries first: threadpoolctl only limits pools already loaded.
    """
    import faiss
    import numba
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS so it is limited too)
    import sklearn.cluster  # noqa: F401  (loads scikit-learn's OpenMP runtime)
    from threadpoolctl import threadpool_limits

    import nmbatch.engine  # noqa: F401  (loads numba's threading layer users)

    _LIMITERS.append(threadpool_limits(limits=threads))
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    faiss.omp_set_num_threads(threads)


def available_gib() -> float:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB (4.0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 4.0


def keep_freed_memory() -> bool:
    """Make glibc serve large allocations from the heap and never hand freed memory back.

    On this kind of VM, memory the guest frees is soon returned to the host, and the next
    first touch of it is slow (about 1 s per GB); an algorithm that allocates large arrays
    (scikit-learn's fit copies ``X``) then pays a cost that depends on what ran in the
    seconds before. Keeping freed memory in the process makes every algorithm reuse
    already-backed pages after the warm-up. Returns whether it took effect (glibc only).
    """
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's mallopt parameter numbers
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, -1) == 1
    except (OSError, AttributeError):
        return False


def prefault_memory(gib: float) -> float:
    """Write ``gib`` GiB once and free it; returns the seconds it took.

    On a virtual machine the first write to a guest page the host has not backed yet is
    slow (here ~1 GB/s): whichever algorithm first allocates large arrays would pay for
    it at random (a 188 MB copy once took 1 s instead of 0.2 s). Touching memory once
    before timing lets every later allocation reuse pages the host has already backed.
    """
    t0 = time.perf_counter()
    if gib > 0:
        buf = np.ones(int(gib * 2**30) // 8)
        del buf
    return time.perf_counter() - t0
