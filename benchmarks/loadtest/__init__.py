"""Load benchmark of the HTTP service: ingestion rate, ``/assign`` latency, soak, memory.

Runs the real server (``python -m nmbatch``: one uvicorn process, its embedded
``redis-server``, the worker iterating all along on ``NMBATCH_WORKER_THREADS``
(``--worker-threads``, default 1), access log off) and drives it over loopback from separate client
processes. The clients are small asyncio programs speaking HTTP/1.1 over raw keep-alive
sockets, with every request encoded before the clock starts, so they take little of the
shared cores. Each phase (ingestion of npy, octet-stream or JSON at full speed;
``/assign`` while ingesting; a soak) runs on a fresh server after a warm-up;
:mod:`benchmarks.loadtest.phases` describes them.

Results go to ``--out``: ``loadtest.json`` (everything, with per-second timelines and
resource samples) and ``loadtest.md`` (machine, versions, command, tables, targets).
Run from the repository's root (the package is not installed with the wheel)::

    python -m benchmarks.loadtest --out bench-results/loadtest            # every phase
    python -m benchmarks.loadtest --out bench-results/lt --phases npy,assign --phase-seconds 5

Modules: ``spec`` (what a phase is), ``client`` (request bytes, the asyncio HTTP/1.1
client, the client processes), ``probes`` (``/proc``: RSS and CPU time of processes,
machine load, the machine's description), ``server`` (the server under test and its
resource sampler), ``phases`` (the phases and the runner of one), ``summary`` (rates,
latency distributions, memory check, targets), ``report`` (``loadtest.md`` and
``loadtest.json``), ``cli`` (the command).
"""
