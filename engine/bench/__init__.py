"""The benchmark of the paper's Results section: ``python -m nmbatch.engine.bench --help``.

Modules: ``datasets`` (the data), ``protocol`` (shuffles, E_V curves, E*_s, medians),
``ours`` and ``peers`` (one runner per algorithm), ``report`` (results.json, results.md,
curves.png), ``cli`` (the command), ``faiss_worker`` (faiss in a subprocess).
"""
