"""Tuning of the server process: kernels loaded up front, a frozen heap, a nice worker.

Warm-up: before the first request, every numba kernel of the engine and of the JSON
parser is loaded (:func:`nmbatch.engine.warmup.warm_up`), so no request and no iteration
waits for a compilation.

Heap freeze: the server process (``python -m nmbatch``) then freezes the heap
(``gc.collect(); gc.freeze()``): the modules, the app and the kernels' objects leave the
cyclic garbage collector's view. Without it, each collection of the oldest generation
walks them all while holding the GIL, a stall of every request in flight and the worst
``/assign`` latencies of the load benchmark (figures: ``docs/benchmarks/service.md``, "Service load
benchmark", and ``docs/bench/load/``).

Worker thread: named ``nmbatch-worker`` for the OS and, when the engine runs in the
thread itself, given a lower priority (:data:`WORKER_NICE`), so the event loop wins the
CPU whenever it has a request to serve.
"""

from __future__ import annotations

import gc
import logging
import os
import threading

from nmbatch.engine.warmup import warm_up
from nmbatch.service.jsonfast import parse_json_matrix
from nmbatch.service.metrics import ServiceMetrics

__all__ = ["WORKER_NICE", "freeze_heap", "tune_worker_thread", "warm_up_kernels"]

log = logging.getLogger("service")

WORKER_NICE = 10
"""Default niceness of the engine's process, or of the worker thread when the engine runs
in it (``NMBATCH_ENGINE_NICE``): the HTTP side wins the CPU when both want it."""


def warm_up_kernels() -> float:
    """Load the numba kernels of the engine and of the JSON parser; returns seconds."""
    seconds = warm_up()
    parse_json_matrix(b'{"vectors": [[1.0, -2.5e-3], [3, 4E2]]}')
    return seconds


def freeze_heap(metrics: ServiceMetrics) -> None:
    """Collect, then move every live object out of the garbage collector's generations.

    The number of frozen objects goes to ``metrics.gc_frozen_objects``.
    """
    gc.collect()
    gc.freeze()
    metrics.gc_frozen_objects.set(gc.get_freeze_count())
    log.info("heap frozen: %d objects out of the garbage collector's scans",
             gc.get_freeze_count())  # fmt: skip


def tune_worker_thread(model: str, nice: int) -> None:
    """Give the worker thread of ``model`` the niceness ``nice`` and the OS name (Linux).

    The worker's kernels run without the GIL and would take a whole core; on a small
    machine the event loop thread must win the CPU whenever it has a request to serve
    (a loop thread preempted while holding the GIL stalls every thread). Threads the
    worker starts later inherit the value. The OS thread name ``nmbatch-worker`` shows
    it in ``top -H`` and ``/proc``. Elsewhere, or if refused, nothing changes.
    """
    if not hasattr(os, "setpriority"):
        return
    for thread in threading.enumerate():
        tid = thread.native_id
        if thread.name != f"nmbatch-worker-{model}" or tid is None:
            continue
        try:
            if nice > 0:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            with open(f"/proc/self/task/{tid}/comm", "w") as comm:
                comm.write("nmbatch-worker")
        except OSError as exc:
            log.warning("could not lower the worker thread's priority: %s", exc)
