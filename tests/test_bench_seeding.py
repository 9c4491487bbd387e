"""The seeding benchmark (``python -m benchmarks.seeding``) end to end on tiny data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.testkit import blobs

REPO = Path(__file__).resolve().parents[1]


def test_seeding_benchmark_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    X = blobs(3000, 6, 12, seed=0)
    np.savez(tmp_path / "tiny.npz", train=X[:2500], test=X[2500:])
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.seeding", "--data", str(tmp_path / "tiny.npz"),
         "--ks", "5,20", "--seeds", "2", "--budget", "0.5", "--batch-size", "200",
         "--methods", "auto,k-means++,k-means++.sub,k-means||,afk-mc2,random,kpp.sub4.t1",
         "--out", str(out)],
        cwd=REPO, env=dict(os.environ, MPLBACKEND="Agg"), capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("tiny-k5.json", "tiny-k20.json", "seeding.json", "seeding.md", "seeding.png"):
        assert (out / name).is_file(), name
    doc = json.loads((out / "seeding.json").read_text())
    assert [(r["dataset"], r["k"]) for r in doc["runs"]] == [("tiny", 5), ("tiny", 20)]
    for run in doc["runs"]:
        assert len(run["runs"]) == 2
        summary = run["summary"]
        assert set(summary) == {"auto", "k-means++", "k-means++.sub", "k-means||", "afk-mc2",
                                "random", "kpp.sub4.t1"}
        for row in summary.values():
            assert row["seed_seconds"] >= 0 and set(row["time_to"]) == {
                "0.05", "0.02", "0.01", "0.005"}
        for curves in (r["curves"] for r in run["runs"]):
            for c in curves.values():
                # times include the seeding: the first evaluation comes after it
                assert c["seconds"][0] >= c["notes"]["seed_seconds"]
                assert c["seconds"] == sorted(c["seconds"])
    md = (out / "seeding.md").read_text()
    assert "k-means\\|\\|" in md and "| init | seeding |" in md


def test_a_variant_is_k_means_plus_plus_on_its_rows_with_its_trials() -> None:
    from benchmarks.seeding import variant_rows
    from nmbatch.engine.seeding import kmeans_plusplus, kmeans_plusplus_subsample

    X = blobs(2000, 5, 30, seed=2)
    got = variant_rows("kpp.sub4.t1", X, 30, np.random.default_rng(1))
    want = kmeans_plusplus_subsample(X, 30, np.random.default_rng(1), 4, trials=1)
    np.testing.assert_array_equal(got, want)
    got = variant_rows("kpp.full", X, 30, np.random.default_rng(1))
    np.testing.assert_array_equal(got, kmeans_plusplus(X, 30, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="not a k-means\\+\\+ variant"):
        variant_rows("kpp.half", X, 30, np.random.default_rng(1))
