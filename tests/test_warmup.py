"""``engine.warmup.warm_up`` reaches every numba kernel nmbatch and the lookups run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter: in the test process other tests have called the kernels.
_PROBE = textwrap.dedent(
    """
    import json, sys
    import numba
    import numpy as np
    from nmbatch.engine import algorithms, assign, metric, store
    from nmbatch.engine.kernels import (
        bounded, common, dense, exact, lookup, retire, seeding, update,
    )
    from nmbatch.engine import NestedBatchStore, energy, make_algorithm, nearest
    from nmbatch.engine.assign import nearest_one
    from nmbatch.engine.warmup import warm_up

    MODULES = (common, bounded, dense, update, lookup, retire, exact, seeding, assign,
               algorithms, store, metric)

    def signatures():
        out = {}
        for module in MODULES:
            for name in dir(module):
                f = getattr(module, name)
                if isinstance(f, numba.core.registry.CPUDispatcher):
                    out[f"{module.__name__}.{name}"] = len(f.signatures)
        return out

    before = signatures()
    seconds = warm_up()
    warmed = signatures()
    # Real work afterwards: another k and d, a growing store, doublings, both revisit
    # paths as the data pick them, a restore, retirements (nmbatch and lloyd), the lookups.
    rng = np.random.default_rng(1)
    X = (rng.standard_normal((40_000, 24)) * rng.random(24)).astype(np.float32)
    store = NestedBatchStore(24, seed=0)
    store.append(X[:20_000])
    algo = make_algorithm("nmbatch", store, 11, batch_size=1000, random_state=0)
    for i in range(40):
        algo.step()
        if i == 5:
            store.append(X[20_000:])
    algo.energy_estimate()
    algo.restore(algo.centroids, algo.batch_size, algo.iteration)
    algo.step()
    algo.retire(before=5_000)
    algo.retire(ids=store.ids()[::11])
    algo.step()
    # Relocation (and its exact distances): three equal initial centroids leave two empty.
    twins = make_algorithm("nmbatch", store, 3, init=np.repeat(X[:1], 3, axis=0))
    twins.step()
    assert twins.n_relocated == 2
    from nmbatch.engine.seeding import SEEDINGS, seed_rows
    for method in SEEDINGS:  # every seeding, the greedy kernel on its parallel path
        seed_rows(method, X[:6000], 13, np.random.default_rng(0))
    lloyd = make_algorithm("lloyd", store, 11)
    lloyd.step()
    # Spherical k-means: unit rows on ingestion, unit centroids.
    sphere = NestedBatchStore(24, seed=0, metric="cosine")
    sphere.append(X[:5_000])
    spherical = make_algorithm("nmbatch", sphere, 11, batch_size=1000, metric="cosine")
    for _ in range(5):
        spherical.step()
    lloyd.retire(before=8_000)
    nearest(X[:100], algo.centroids)
    nearest_one(X[0], algo.centroids)
    energy(X[:100], algo.centroids)
    after = signatures()
    json.dump({"before": before, "warmed": warmed, "after": after, "seconds": seconds},
              sys.stdout)
    """
)


def test_warm_up_leaves_nothing_to_compile_for_real_work() -> None:
    import json

    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    result = json.loads(out)
    before, warmed, after = result["before"], result["warmed"], result["after"]
    assert sum(before.values()) == 0, "kernels were loaded before the warm-up"
    assert sum(warmed.values()) >= 10
    assert after == warmed, {k: (warmed[k], after[k]) for k in after if after[k] != warmed[k]}
    assert result["seconds"] > 0
