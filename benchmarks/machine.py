"""The machine a benchmark ran on, as results.md names it: CPU, SIMD, BLAS, versions.

No file system paths: the BLAS libraries are named by file name only.
"""

from __future__ import annotations

import os
import platform
from typing import Any

__all__ = ["machine_info"]


def _cpu_model() -> tuple[str, str]:
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine()):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value
    except OSError:
        pass
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl") if f in flags.split()]
    return model, ",".join(simd)


def machine_info() -> dict[str, Any]:
    """CPU model, cores, SIMD flags, the BLAS/OpenMP libraries loaded (threadpoolctl) and
    the versions of the libraries that matter. No file system paths."""
    import numba
    import numpy
    import scipy
    import sklearn
    import threadpoolctl

    try:
        import faiss

        faiss_version = faiss.__version__
    except ImportError:  # pragma: no cover - faiss is a bench dependency
        faiss_version = "not installed"
    model, simd = _cpu_model()
    libs = []
    for lib in threadpoolctl.threadpool_info():
        libs.append({
            "library": os.path.basename(lib.get("filepath", "")),
            "user_api": lib.get("user_api"),
            "internal_api": lib.get("internal_api"),
            "version": lib.get("version"),
            "architecture": lib.get("architecture"),
            "threading_layer": lib.get("threading_layer"),
            "num_threads": lib.get("num_threads"),
        })
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        affinity = os.cpu_count()
    return {
        "cpu": model,
        "simd": simd,
        "cores": os.cpu_count(),
        "cores_available": affinity,
        "python": platform.python_version(),
        "versions": {
            "numpy": numpy.__version__, "numba": numba.__version__,
            "scikit-learn": sklearn.__version__, "faiss": faiss_version,
            "scipy": scipy.__version__, "threadpoolctl": threadpoolctl.__version__,
        },
        "numba_threading_layer": _numba_layer(),
        "blas": libs,
    }


def _numba_layer() -> str:
    import numba

    try:
        return str(numba.threading_layer())
    except ValueError:  # no parallel kernel has run yet
        return str(numba.config.THREADING_LAYER)
