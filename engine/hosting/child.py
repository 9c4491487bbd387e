"""The model hosted in a child process: :class:`EngineProcess`.

The child is a fresh interpreter (``spawn``): nothing of the parent is copied into it.
It builds the model as :class:`~.local.LocalEngine` does and answers the
:class:`~.protocol.EngineHost` calls: rows go to it as raw ``float32`` bytes, without
waiting (the pipe keeps them in order), with their sample weights as raw ``float64``
bytes when they have any; ``step()``, ``restore()``, ``rows_of()``, ``weights_of()``,
``forget()`` and ``lookup()`` wait for its reply, the :class:`ModelState` record as the
algorithm made it (pickled).

Why a process (the service's default, ``NMBATCH_WORKER_PROCESS``): the server's event
loop then shares its GIL only with threads that mostly wait (the worker thread waits on
a pipe); the child runs at a lower scheduling priority (:func:`lower_priority`) without
the risk a low-priority *thread* runs, of being parked by the OS while it holds the GIL
the event loop needs; and a child killed by the OOM killer (it holds the store: the
biggest process) or crashed leaves the parent up, to rebuild it. The process costs a
copy of each batch through the pipe and a second or two more at start (a fresh
interpreter); the ``/assign`` latency with it is in ``docs/bench/load/loadtest.md``.

The child exits when told to, or when the pipe's other end closes (the parent is
gone), and it asks Linux to kill it if the parent dies (``PR_SET_PDEATHSIG``). If it
dies, the next call raises :class:`EngineProcessError` (the service's worker then
starts a new one, replays its log and restores the centroids it served last).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import struct
import sys
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np

from nmbatch.engine._validation import as_sample_weight
from nmbatch.engine.state import ModelState, SampleLookup

from .driver import carry_out
from .heap import HeapTrimmer
from .local import build
from .protocol import NO_IDS, EngineConfig

__all__ = ["START_TIMEOUT", "EngineProcess", "EngineProcessError", "lower_priority"]

log = logging.getLogger(__name__)

# Commands are 8 bytes, so the float32 rows after them stay aligned (an unaligned array
# would be another type signature for numba: a compilation in the child).
_APPEND, _STEP, _RESTORE, _STOP = b"APPEND\0\0", b"STEP\0\0\0\0", b"RESTORE\0", b"STOP\0\0\0\0"
_FEED, _ROWS, _WEIGHTS = b"FEED\0\0\0\0", b"ROWS\0\0\0\0", b"WEIGHTS\0"
_FORGET, _LOOKUP = b"FORGET\0\0", b"LOOKUP\0\0"  # then the ids, int64
_OP = 8
_RESTORE_HEADER = struct.Struct("<qqq")  # rows of centroids, batch size, iteration
# FEED: rows appended, ids retired, retire_before, flags (1: ids in any order; 2: weighted);
# then the appended rows' ids (int64), the retired ids (int64), if weighted the appended
# rows' weights (float64), the appended rows (float32): every part stays aligned.
_FEED_HEADER = struct.Struct("<qqqq")
START_TIMEOUT = 120.0
"""Seconds the child may take to start (import numpy and numba, load the kernels)."""


class EngineProcessError(RuntimeError):
    """The engine's child process failed or is gone."""


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


def lower_priority(config: EngineConfig) -> None:
    """Make this (the child) process yield the CPU to the HTTP side, before any kernel.

    - niceness ``config.nice``;
    - with ``config.idle``, the ``SCHED_IDLE`` class where the OS has it: the child runs
      only on CPU time no task of a normal class wants, so a request that wakes the event
      loop preempts it at once, but on a machine saturated by other programs it gets no
      CPU at all and the model stops. The service uses a niceness alone by default
      (``NMBATCH_ENGINE_NICE``; measured against ``SCHED_IDLE`` in
      ``docs/operations/processes.md``). Safe in the child, which holds no lock the
      server needs; the worker *thread* never gets it (it would hold the GIL);
    - ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it: OpenMP's threads
      (numba's ``omp`` layer) sleep at the end of a parallel region instead of spinning,
      and so leave the cores to the server. Read by the OpenMP runtime when it loads,
      at the engine's first parallel kernel, after this.
    """
    if config.nice > 0:
        with contextlib.suppress(OSError):
            os.nice(config.nice)
    if config.idle and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _serve(conn: Connection, config: EngineConfig, parent_pid: int) -> None:
    """The child's main: build the engine, then answer commands until told to stop."""
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        return
    lower_priority(config)
    # Imported here: the parent does not need threadpoolctl's state or numba's threads.
    from nmbatch.engine.threads import kernel_threads

    with kernel_threads(config.threads):  # the kernels on config.threads, BLAS on one
        store, algo = build(config)
        conn.send(algo.state())  # the initial state: the child is ready
        d = config.dim
        trimmer = HeapTrimmer()
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                return  # the parent is gone
            op, payload = message[:_OP], memoryview(message)[_OP:]
            try:
                if op == _APPEND:
                    store.append(np.frombuffer(payload, dtype=np.float32).reshape(-1, d))
                    continue  # appends are not answered
                if op == _FEED:
                    m, r, before, flags = _FEED_HEADER.unpack_from(payload)
                    at = _FEED_HEADER.size
                    ids = np.frombuffer(payload, np.int64, m, at)
                    retire_ids = np.frombuffer(payload, np.int64, r, at + 8 * m)
                    at += 8 * (m + r)
                    weights = None
                    if flags & 2:
                        weights = np.frombuffer(payload, np.float64, m, at)
                        at += 8 * m
                    X = np.frombuffer(payload, np.float32, m * d, at)
                    carry_out(algo, X.reshape(m, d), ids, retire_ids, before,
                              any_order=bool(flags & 1), weights=weights)  # fmt: skip
                    continue  # nor are feeds
                if op == _ROWS:
                    conn.send(store.rows_of(np.frombuffer(payload, dtype=np.int64)))
                elif op == _FORGET:  # (found, state): the state after the deletion
                    found = algo.forget(np.frombuffer(payload, dtype=np.int64))
                    conn.send((found, algo.state()))
                elif op == _LOOKUP:
                    conn.send(algo.lookup(np.frombuffer(payload, dtype=np.int64)))
                elif op == _WEIGHTS:
                    conn.send(store.weights_of(np.frombuffer(payload, dtype=np.int64)))
                elif op == _STEP:
                    conn.send(algo.state(algo.step()))
                    trimmer.maybe()
                elif op == _RESTORE:
                    rows, b, iteration = _RESTORE_HEADER.unpack_from(payload)
                    C = np.frombuffer(payload[_RESTORE_HEADER.size :], dtype=np.float32)
                    algo.restore(C.reshape(rows, d), b, iteration)
                    conn.send(algo.state())
                elif op == _STOP:
                    return
                else:
                    raise ValueError(f"unknown command {bytes(op)!r}")
            except Exception as exc:  # reported to the parent, which fails the worker
                conn.send({"error": f"{type(exc).__name__}: {exc}"})
                return


# -- the parent's side --------------------------------------------------------------------
def _stream_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` as ``(m,)`` int64 stream ids, each >= 0, else ``ValueError``."""
    query = np.ascontiguousarray(np.asarray(ids).ravel(), dtype=np.int64)
    if query.shape[0] and query.min() < 0:
        raise ValueError(f"stream ids are >= 0, got {query.min()}")
    return query


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
        self._k = config.k
        try:
            self.state = self._reply(START_TIMEOUT)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def ready(self) -> bool:
        return self.state.initialized or self.store.n_samples >= self._k

    def feed(
        self,
        X: np.ndarray,
        ids: np.ndarray,
        *,
        n_after: int,
        retire_ids: np.ndarray = NO_IDS,
        retire_before: int = 0,
        any_order: bool = False,
        weights: np.ndarray | None = None,
    ) -> None:
        X = np.ascontiguousarray(X, dtype=np.float32)
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        retire_ids = np.ascontiguousarray(retire_ids, dtype=np.int64)
        if X.ndim != 2 or X.shape[1] != self.store.dim or ids.shape != (X.shape[0],):
            raise ValueError(f"rows of shape {X.shape} with {ids.shape[0]} ids for dim "
                             f"{self.store.dim}")  # fmt: skip
        w = b""
        if weights is not None:  # checked here: the child would end on a bad weight
            checked = as_sample_weight(weights, X.shape[0], name="weights")
            if checked is not None:
                w = checked.data.cast("B")
        flags = int(any_order) | (2 if len(w) else 0)
        header = _FEED_HEADER.pack(X.shape[0], retire_ids.shape[0], int(retire_before), flags)
        rows = X.data.cast("B") if X.size else b""
        self._send(_FEED, header, ids.data.cast("B"), retire_ids.data.cast("B"), w, rows)
        self.store._n = int(n_after)
        self.state = dataclasses.replace(self.state, converged=False)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        return self._call(_ROWS, np.ascontiguousarray(ids, dtype=np.int64).tobytes(), np.ndarray)

    def forget(self, ids: np.ndarray) -> np.ndarray:
        """Delete by stream id in the child (``EngineHost.forget``); ``ValueError`` for an
        id below 0 (checked here: the child ends at any error)."""
        query = _stream_ids(ids)
        found, self.state = self._call(_FORGET, query.tobytes(), tuple)
        self.store._n -= int(np.count_nonzero(found))
        return found

    def lookup(self, ids: np.ndarray) -> SampleLookup:
        return self._call(_LOOKUP, _stream_ids(ids).tobytes(), SampleLookup)

    def weights_of(self, ids: np.ndarray) -> np.ndarray:
        payload = np.ascontiguousarray(ids, dtype=np.int64).tobytes()
        return self._call(_WEIGHTS, payload, np.ndarray)

    def step(self) -> ModelState:
        self.state = self._call(_STEP, b"")
        return self.state

    def restore(self, centroids: np.ndarray, batch_size: int, iteration: int) -> ModelState:
        C = np.ascontiguousarray(centroids, dtype=np.float32)
        header = _RESTORE_HEADER.pack(C.shape[0], int(batch_size), int(iteration))
        self.state = self._call(_RESTORE, header + C.tobytes())
        return self.state

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

    def _send(self, op: bytes, *payload: bytes | memoryview) -> None:
        """Send the command ``op`` and its payload (joined, one copy)."""
        try:
            self._conn.send_bytes(b"".join((op, *payload)))
        except (OSError, ValueError) as exc:
            raise EngineProcessError(f"the engine process is gone: {exc}") from None

    def _call(self, op: bytes, payload: bytes, kind: type = ModelState) -> Any:
        self._send(op, payload)
        return self._reply(None, kind)

    def _reply(self, timeout: float | None, kind: type = ModelState) -> Any:
        """The child's answer: a ``kind`` (a state, rows), or ``{"error": message}``
        (raised here)."""
        ready = wait([self._conn, self.process.sentinel], timeout)
        if self._conn in ready:
            try:
                reply = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise EngineProcessError(f"the engine process is gone: {exc!r}") from None
            if not isinstance(reply, kind):
                raise EngineProcessError(f"the engine process failed: {reply['error']}")
            return reply
        if not ready:
            raise EngineProcessError(f"the engine process did not answer within {timeout} s")
        raise EngineProcessError(f"the engine process exited with code {self.process.exitcode}")
