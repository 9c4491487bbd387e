"""Hash the models the estimator fits, to show that a change leaves them bit for bit.

``NestedMiniBatchKMeans(n_clusters=k, init=init, random_state=seed).fit(train)`` with one
BLAS thread, for init ``first``, ``k-means++`` and ``auto`` (the default) and seeds 0,
1, 2; one line per fit: init, seed, ``n_iter_``, ``batch_size_``, ``inertia_``, the first
16 hex digits of the SHA-256 of ``cluster_centers_`` and ``labels_``, and the fit's wall
time (the first includes the kernels' compilation). Run it on two commits and compare
the columns but the last::

    python -m benchmarks.estimator_hashes --data data/mnist.npz --k 50 \\
        > docs/bench/large-k/k50-old-vs-new/hashes-swap-auto.txt
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from nmbatch.engine import NestedMiniBatchKMeans


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.estimator_hashes", description=__doc__)
    p.add_argument("--data", type=Path, required=True, help="an .npz with the key train")
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)
    train = np.ascontiguousarray(np.load(args.data)["train"], dtype=np.float32)
    print(f"# NestedMiniBatchKMeans(n_clusters={args.k}, init=init, random_state=seed)"
          f".fit({args.data.name} train), one BLAS thread")  # fmt: skip
    print("# columns: init seed n_iter_ batch_size_ inertia_ "
          "sha256(cluster_centers_.tobytes() + labels_.tobytes())[:16] wall time")  # fmt: skip
    with threadpool_limits(1):
        for init in ("first", "k-means++", "auto"):
            for seed in range(args.seeds):
                t0 = time.perf_counter()
                est = NestedMiniBatchKMeans(n_clusters=args.k, init=init, random_state=seed)
                est.fit(train)
                wall = time.perf_counter() - t0
                digest = hashlib.sha256(
                    est.cluster_centers_.tobytes() + est.labels_.tobytes()
                ).hexdigest()[:16]
                print(init, seed, est.n_iter_, est.batch_size_, f"{est.inertia_:.6e}", digest,
                      f"{wall:.2f}s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
