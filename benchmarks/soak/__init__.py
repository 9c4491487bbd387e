"""Soak and capacity benchmark of the HTTP service: memory over a long run, 507 at capacity.

Starts the real server (``python -m nmbatch`` with its embedded ``redis-server``, access
log off, the settings given), optionally inside a cgroup-v1 memory cgroup with a limit
(``--memory-limit``: a size, or ``auto``: a little above what the capacity's samples
cost by ``service/storage/capacity.py``), posts ``.npy`` batches of ``float32`` vectors
at a paced rate (or back to back) up to a total, while single-vector ``GET /assign`` runs
paced at 1,000 requests/s, and records every second the resident memory of the server
with its engine process, of ``redis-server``, Redis's ``used_memory``, the cgroup's usage,
``/readyz`` and ``/stats``. Afterwards it waits for the engine to hold the log, reads
the log back to check that nothing acknowledged was lost, reads the cgroup's and the
kernel's OOM counters, and judges the run against the issue's targets.

Results go to ``--out``: ``soak.json`` (everything), ``soak.md`` (rendered from it) and
``soak.png`` (memory, samples, ``/assign`` latency and CPU over time). Run from the
repository's root, as root when a memory cgroup is asked for (the commands of the
committed runs in ``docs/bench/soak/``)::

    python -m benchmarks.soak --out docs/bench/soak/capacity --max-samples 5000000 \\
        --memory-limit auto --rate 110000 --total 20000000 --after-full-seconds 120 \\
        --restart-check
    python -m benchmarks.soak --out docs/bench/soak/window --retention window \\
        --max-samples 2000000 --total 50000000 --rate 110000 --restart-check

Modules: ``cgroup`` (the memory cgroup, the kernel's OOM lines), ``settings`` (the
service's settings, the capacity model, the cgroup's limit, the code's version),
``service`` (the server under test), ``traffic`` (the paced client processes),
``sampling`` (process-tree RSS and the per-second sampler), ``analysis`` (rates, latency
slices, memory after a window, checks), ``run`` (one run start to end), ``report``
(``soak.md``, ``soak.json``), ``plot`` (``soak.png``), ``cli`` (the command).
"""
