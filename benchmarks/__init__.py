"""The benchmark of the paper's Results section: ``python -m benchmarks --help``.

Modules: ``datasets`` (the data), ``mnist`` (MNIST downloaded once, checked, cached),
``protocol`` (shuffles, E_V curves, E*_s, medians), ``ours`` and ``peers`` (one runner
per algorithm), ``report`` (results.json, results.md, curves.png), ``machine`` (the CPU,
BLAS and library versions a report names), ``cli`` (the command), ``faiss_worker``
(faiss in a subprocess).
"""
