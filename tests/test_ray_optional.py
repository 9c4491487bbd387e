"""Ray is optional: the single-machine engine, the estimator and the service never
import it; ``backend=RayBackend()`` with no cluster starts a local Ray for the fit and stops it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(code: str, tmp_path: Path) -> str:
    """``code`` in a fresh interpreter outside the checkout; its stdout."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
        check=True, timeout=300,
    ).stdout  # fmt: skip


def test_the_engine_and_the_estimator_do_not_import_ray(tmp_path: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "import nmbatch.engine, nmbatch.engine.estimator, nmbatch.engine.distributed\n"
        "import nmbatch.engine.distributed.fit, nmbatch.engine.distributed.shard\n"
        "from nmbatch.engine import NestedMiniBatchKMeans\n"
        "X = np.random.default_rng(0).normal(size=(300, 2))\n"
        "NestedMiniBatchKMeans(n_clusters=3, batch_size=50, random_state=0).fit(X)\n"
        "print('ray' in sys.modules)\n"
    )
    assert run(code, tmp_path).strip() == "False"


def test_a_fit_with_no_cluster_starts_a_local_ray_and_stops_it(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    code = (
        "import numpy as np, ray\n"
        "from nmbatch.engine import NestedMiniBatchKMeans, RayBackend\n"
        "X = np.random.default_rng(0).normal(size=(600, 2))\n"
        # The Ray backend makes no cluster swaps: the same model as a local fit without.
        "params = dict(n_clusters=3, batch_size=50, random_state=0, swap_clusters=False)\n"
        "est = NestedMiniBatchKMeans(**params, backend=RayBackend(n_shards=2)).fit(X)\n"
        "local = NestedMiniBatchKMeans(**params).fit(X)\n"
        "print(ray.is_initialized(), (est.cluster_centers_ == local.cluster_centers_).all())\n"
    )
    assert run(code, tmp_path).strip().splitlines()[-1] == "False True"
