"""The worker's engine (store and nmbatch), in the worker thread or in a child process.

The worker thread drives an engine through two small views, ``engine.store``
(``dim``, ``n_samples``, ``append``) and ``engine.algo`` (``ready()``, ``step()``,
``restore()``, ``energy_estimate()``, and the attributes ``centroids``, ``counts``,
``batch_size``, ``iteration``, ``converged``), the same names as the engine's own
``NestedBatchStore`` and ``NestedMiniBatch``. Two hosts provide them:

:class:`LocalEngine`
    The engine's objects themselves, in the worker thread (``NMBATCH_WORKER_PROCESS=false``).
:class:`EngineProcess`
    The engine in a child process (the default). The server's event loop then shares its
    GIL only with threads that mostly wait (the worker thread now waits on a pipe); the
    child runs at a lower scheduling priority without the risk a low-priority *thread*
    runs, of being parked by the OS while it holds the GIL the event loop needs; and a
    child killed by the OOM killer (it holds the store: the biggest process) or crashed
    leaves the HTTP side up, and the worker rebuilds it from the log. In the load
    benchmark (2 cores, 200,000 vectors/s ingested, 1,000 ``/assign``/s) the ``/assign``
    latency was the same either way (p99 3.9-4.9 ms); the process costs a copy of each
    batch through the pipe and ~1-2 s more at start (a fresh interpreter).

The child is a fresh interpreter (``spawn``): nothing of the server is copied into it.
Rows go to it as raw ``float32`` bytes, without waiting (the pipe keeps them in order);
``step()`` and ``restore()`` wait for its reply, which carries the state the views show.
It exits when told to, or when the pipe's other end closes (the server is gone), and it
asks Linux to kill it if the server dies (``PR_SET_PDEATHSIG``). If it dies, the next
call raises :class:`EngineProcessError`, and the worker starts a new one (it replays the
log and restores the centroids it served last).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import struct
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

import numpy as np

from nmbatch.engine import NestedBatchStore, make_algorithm
from nmbatch.engine.algorithms import IterationStats, KMeansAlgorithm

__all__ = ["EngineConfig", "EngineHost", "EngineProcess", "EngineProcessError", "LocalEngine"]

log = logging.getLogger(__name__)

# Commands are 8 bytes, so the float32 rows after them stay aligned (an unaligned array
# would be another type signature for numba: a compilation in the child).
_APPEND, _STEP, _RESTORE, _STOP = b"APPEND\0\0", b"STEP\0\0\0\0", b"RESTORE\0", b"STOP\0\0\0\0"
_OP = 8
_RESTORE_HEADER = struct.Struct("<qqq")  # rows of centroids, batch size, iteration
START_TIMEOUT = 120.0
"""Seconds the child may take to start (import numpy and numba, load the kernels)."""


class EngineProcessError(RuntimeError):
    """The engine's child process failed or is gone."""


@dataclass(frozen=True)
class EngineConfig:
    """What builds the engine: ``NestedBatchStore(dim, seed)`` and nmbatch on it.

    ``threads`` bounds BLAS and numba in the engine's process; ``nice`` is the
    niceness of the child process (0: unchanged; unused in the thread).
    """

    dim: int
    k: int
    init: str
    rho: float
    batch_size: int
    seed: int | None
    threads: int = 1
    nice: int = 0


class StoreView(Protocol):
    dim: int

    @property
    def n_samples(self) -> int: ...

    def append(self, X: np.ndarray) -> int: ...


class AlgoView(Protocol):
    centroids: np.ndarray
    counts: np.ndarray
    batch_size: int
    iteration: int
    converged: bool

    def ready(self) -> bool: ...

    def step(self) -> IterationStats: ...

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> None: ...

    def energy_estimate(self) -> float: ...


class EngineHost(Protocol):
    store: StoreView
    algo: AlgoView

    def close(self) -> None: ...


def _build(config: EngineConfig) -> tuple[NestedBatchStore, KMeansAlgorithm]:
    store = NestedBatchStore(config.dim, seed=config.seed)
    algo = make_algorithm(
        "nmbatch",
        store,
        config.k,
        init=config.init,
        rho=config.rho,
        batch_size=config.batch_size,
        random_state=config.seed,
    )
    return store, algo


class LocalEngine:
    """The engine's own objects, used from the calling thread."""

    def __init__(self, config: EngineConfig) -> None:
        self.store, self.algo = _build(config)

    def close(self) -> None:
        """Nothing to release."""


# -- the child process --------------------------------------------------------------------
def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it ends (best effort)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        with open("/proc/self/comm", "w") as comm:
            comm.write("nmbatch-engine")


def _state(algo: KMeansAlgorithm, store: NestedBatchStore, stats: IterationStats | None) -> dict:
    energy = algo.energy_estimate() if algo.iteration > 0 and algo.batch_size > 0 else None
    return {
        "stats": stats,
        "centroids": algo.centroids,  # new arrays after every step, pickled at once
        "counts": algo.counts,
        "batch_size": int(algo.batch_size),
        "iteration": int(algo.iteration),
        "converged": bool(algo.converged),
        "initialized": bool(algo.initialized),
        "n_samples": int(store.n_samples),
        "energy": energy,
    }


def _serve(conn: Connection, config: EngineConfig, parent_pid: int) -> None:
    """The child's main: build the engine, then answer commands until told to stop."""
    _die_with_parent()
    if os.getppid() != parent_pid:  # the server died before the line above took effect
        return
    if config.nice > 0:
        with contextlib.suppress(OSError):
            os.nice(config.nice)
    # Imported here: the parent does not need threadpoolctl's state or numba's threads.
    import numba
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=config.threads):
        numba.set_num_threads(min(config.threads, numba.config.NUMBA_NUM_THREADS))
        store, algo = _build(config)
        conn.send({"ready": True})
        d = config.dim
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                return  # the server is gone
            op, payload = message[:_OP], memoryview(message)[_OP:]
            try:
                if op == _APPEND:
                    store.append(np.frombuffer(payload, dtype=np.float32).reshape(-1, d))
                    continue  # appends are not answered
                if op == _STEP:
                    conn.send(_state(algo, store, algo.step()))
                elif op == _RESTORE:
                    rows, b, iteration = _RESTORE_HEADER.unpack_from(payload)
                    C = np.frombuffer(payload[_RESTORE_HEADER.size :], dtype=np.float32)
                    algo.restore(C.reshape(rows, d), b, iteration)
                    conn.send(_state(algo, store, None))
                elif op == _STOP:
                    return
                else:
                    raise ValueError(f"unknown command {bytes(op)!r}")
            except Exception as exc:  # reported to the parent, which fails the worker
                conn.send({"error": f"{type(exc).__name__}: {exc}"})
                return


# -- the parent's side --------------------------------------------------------------------
class _RemoteStore:
    def __init__(self, owner: EngineProcess, dim: int) -> None:
        self._owner = owner
        self.dim = dim
        self._n = 0

    @property
    def n_samples(self) -> int:
        return self._n

    def append(self, X: np.ndarray) -> int:
        """Send the rows of ``X`` (``(m, d)`` float32, finite) to the child; returns ``N``."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.dim:
            raise ValueError(f"rows of shape {X.shape} for a store of dimension {self.dim}")
        if X.shape[0]:
            self._owner._send(_APPEND, X.data.cast("B"))
            self._n += X.shape[0]
        return self._n


class _RemoteAlgo:
    def __init__(self, owner: EngineProcess, config: EngineConfig) -> None:
        self._owner = owner
        self.k = config.k
        self.centroids = np.zeros((config.k, config.dim), dtype=np.float32)
        self.counts = np.zeros(config.k, dtype=np.int64)
        self.batch_size = 0
        self.iteration = 0
        self.converged = False
        self.initialized = False
        self._energy: float | None = None

    def ready(self) -> bool:
        return self.initialized or self._owner.store.n_samples >= self.k

    def step(self) -> IterationStats:
        state = self._owner._call(_STEP, b"")
        self._take(state)
        return state["stats"]

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> None:
        C = np.ascontiguousarray(centroids, dtype=np.float32)
        header = _RESTORE_HEADER.pack(C.shape[0], int(batch_size), int(iteration))
        self._take(self._owner._call(_RESTORE, header + C.tobytes()))

    def energy_estimate(self) -> float:
        return float("nan") if self._energy is None else self._energy

    def _take(self, state: dict[str, Any]) -> None:
        self.centroids = state["centroids"]
        self.counts = state["counts"]
        self.batch_size = state["batch_size"]
        self.iteration = state["iteration"]
        self.converged = state["converged"]
        self.initialized = state["initialized"]
        self._energy = state["energy"]


class EngineProcess:
    """The engine in a ``spawn``-ed child process, driven from one thread.

    Raises :class:`EngineProcessError` if the child does not start within
    ``START_TIMEOUT`` seconds.
    """

    def __init__(self, config: EngineConfig) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_serve,
            args=(child_conn, config, os.getpid()),
            name="nmbatch-engine",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        self.store = _RemoteStore(self, config.dim)
        self.algo = _RemoteAlgo(self, config)
        try:
            self._reply(START_TIMEOUT)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def close(self, timeout: float = 10.0) -> None:
        """Ask the child to stop, then make sure it is gone."""
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self._conn.send_bytes(_STOP)
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(timeout)
        with contextlib.suppress(OSError):
            self._conn.close()

    def _send(self, op: bytes, payload: bytes | memoryview) -> None:
        try:
            self._conn.send_bytes(b"".join((op, payload)))
        except (OSError, ValueError) as exc:
            raise EngineProcessError(f"the engine process is gone: {exc}") from None

    def _call(self, op: bytes, payload: bytes) -> dict[str, Any]:
        self._send(op, payload)
        return self._reply(None)

    def _reply(self, timeout: float | None) -> dict[str, Any]:
        ready = wait([self._conn, self.process.sentinel], timeout)
        if self._conn in ready:
            try:
                state = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise EngineProcessError(f"the engine process is gone: {exc!r}") from None
            if "error" in state:
                raise EngineProcessError(f"the engine process failed: {state['error']}")
            return state
        if not ready:
            raise EngineProcessError(f"the engine process did not answer within {timeout} s")
        raise EngineProcessError(f"the engine process exited with code {self.process.exitcode}")
