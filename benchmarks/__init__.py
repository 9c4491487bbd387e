"""The benchmarks of nmbatch, run from a checkout of the repository (not installed).

The wheel installs ``nmbatch`` alone; this folder is imported as ``benchmarks`` from the
repository's root (``python -m benchmarks --help``; ``nmbatch bench`` runs the same when
it finds a checkout). The benchmarks import :mod:`nmbatch`; nothing in :mod:`nmbatch`
imports them but ``nmbatch bench``, which only calls :func:`benchmarks.cli.main`.

The engine's benchmarks:

- ``python -m benchmarks``: time to energy of the paper's Results section against the
  peers (``cli`` picks the benchmark, ``options`` its options and data, ``paper`` the
  run, ``threads`` several thread counts, ``large_k`` several ``k`` with ``memory`` per
  sample, ``drift`` with ``drift_peers`` and ``drift_report`` the drifting streams);
  ``datasets`` and ``mnist`` (the data), ``protocol`` (shuffles, E_V curves, E*_s,
  medians), ``ours``, ``peers`` and ``ray_runner`` (one runner per algorithm),
  ``report`` (results.json, results.md, curves.png), ``machine`` (the CPU, BLAS and
  library versions a report names), ``process`` (thread pools, memory, children's
  environment), ``faiss_worker`` (faiss in a subprocess);
- ``python -m benchmarks.phases`` (with ``phases_report``): where a fit's time goes;
- ``python -m benchmarks.distributed`` (with ``distributed_model``): the Ray backend;
- ``python -m benchmarks.bounds_memory``, ``doubling_sweep``, ``fit_timing``,
  ``estimator_hashes``, ``bench_compare``, ``window_lag``, ``metric_cost``: single
  measurements.

The service's benchmarks: ``python -m benchmarks.loadtest`` (ingestion rate, ``/assign``
latency), ``python -m benchmarks.soak`` (memory over a long run, capacity),
``python -m benchmarks.two_models``, ``python -m benchmarks.redis_bytes`` and
``python -m benchmarks.log_read_bytes`` (what the sample log costs Redis).
"""
