"""How far behind the event loop runs: the wait a request arriving now would have.

Every request of the server process runs on one event loop; what delays a callback
delays a ``GET /assign`` answer by as much: other requests' work on the loop (a body's
chunks, parsing, sending to Redis), a thread holding the GIL (the worker, the thread
pool), and the cores taken by other processes. :class:`LoopLag` measures it the way a
request meets it: a callback scheduled every :data:`TICK_SECONDS` records how late it
runs (``loop.time()`` minus the time it was due).

:attr:`LoopLag.lag` is a decaying peak of those delays (seconds): a late tick sets it,
and it halves every :data:`HALF_LIFE_SECONDS` while the ticks are on time, so it says
"the loop was that late within the last tenths of a second".
:class:`nmbatch.service.admission.AdmissionControl` sheds writes on it. Cost: one timer
callback every :data:`TICK_SECONDS` (a few microseconds).
"""

from __future__ import annotations

import asyncio

__all__ = ["HALF_LIFE_SECONDS", "TICK_SECONDS", "LoopLag"]

TICK_SECONDS = 0.005
"""Period of the measuring callback."""
HALF_LIFE_SECONDS = 0.05
"""Time over which :attr:`LoopLag.lag` halves while the loop keeps time."""
_DECAY = 0.5 ** (TICK_SECONDS / HALF_LIFE_SECONDS)


class LoopLag:
    """The lag of ``loop``, measured from :meth:`start` until the loop closes or :meth:`stop`.

    Attributes
    ----------
    lag : float
        Decaying peak of the recent delays of the measuring callback, in seconds.
    peak : float
        Largest single delay seen since the start (for tests and logs).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lag = 0.0
        self.peak = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> LoopLag:
        """Schedule the first tick; returns self."""
        self._due = self.loop.time() + TICK_SECONDS
        self._handle = self.loop.call_at(self._due, self._tick)
        return self

    def stop(self) -> None:
        """Cancel the next tick."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now = self.loop.time()
        late = max(0.0, now - self._due)
        self.lag = max(late, self.lag * _DECAY)
        self.peak = max(self.peak, late)
        self._due = now + TICK_SECONDS
        self._handle = self.loop.call_at(self._due, self._tick)
