"""benchmarks.seed_endpoints: one fit per seed and seeding, its final held-out energy."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.seed_endpoints import heldout_energy, main, parse_variant
from tests.testkit import blobs


def test_variants_and_the_heldout_energy():
    assert parse_variant("4096:1") == (4096, 1) and parse_variant("500:g") == (500, None)
    V = np.array([[0.0, 0.0], [3.0, 4.0]], dtype=np.float32)
    C = np.array([[0.0, 0.0], [3.0, 0.0]], dtype=np.float32)
    assert heldout_energy(V, C) == (0.0 + 16.0) / 2


def test_one_line_per_fit_and_the_table(tmp_path):
    X = blobs(600, 3, 4, seed=2)
    np.savez(tmp_path / "d.npz", train=X[:500], test=X[500:])
    out = tmp_path / "out"
    assert main(["--dataset", "npz", "--data", str(tmp_path / "d.npz"), "--k", "4",
                 "--seeds", "1,2", "--variants", "40:1,500:g", "--out", str(out)]) == 0
    fits = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(f["seed"], f["variant"]) for f in fits] == [(1, "40:1"), (1, "500:g"),
                                                          (2, "40:1"), (2, "500:g")]
    assert min(f["rel"] for f in fits) == 0.0 and all(f["E"] > 0 for f in fits)
    table = (out / "results.md").read_text()
    assert "| 40:1 |" in table and "| 500:g |" in table and str(tmp_path) not in table
