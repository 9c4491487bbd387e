"""``python -m benchmarks.first_step``: fit's time to its first step, by phase."""

from __future__ import annotations

import json

import numpy as np

from benchmarks import first_step
from tests.testkit import blobs


def test_the_phases_add_up_to_the_first_step_and_the_wrappers_go_away():
    from nmbatch.engine import NestedMiniBatchKMeans
    from nmbatch.engine.store import NestedBatchStore

    load, check = NestedBatchStore.load, NestedMiniBatchKMeans._check_X
    X = blobs(4000, 6, 8, seed=0)
    r = first_step.first_step_run(X, 8, steps=3, batch_size=500)
    assert r["b0"] == 500 and r["n"] == 4000 and r["d"] == 6
    assert all(r[p] >= 0 for p in first_step.PHASES[:-1]) and r["store"] > 0
    total = sum(r[p] for p in first_step.PHASES)
    assert abs(total - r["first_step"]) < 1e-9
    assert r["first_step"] <= r["step3"] <= r["fit"]
    assert NestedBatchStore.load is load and NestedMiniBatchKMeans._check_X is check


def test_unit384_rows_have_norm_one():
    rng = np.random.default_rng(0)
    fake = {"train": rng.integers(0, 255, (300, 20)), "test": rng.integers(0, 255, (50, 20))}
    Y = first_step.unit384(fake, n=400, dim=16)
    assert Y.shape == (400, 16) and Y.dtype == np.float32 and Y.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1), 1.0, rtol=1e-5)


def test_main_writes_json_a_table_and_a_plot(tmp_path):
    rng = np.random.default_rng(1)
    data = tmp_path / "tiny.npz"
    np.savez(data, train=blobs(3000, 10, 5, seed=2) + 50.0, test=rng.random((100, 10)))
    args = ["--data", str(data), "--dataset", "mnist", "--k", "5", "--seeds", "2",
            "--steps", "2", "--label", "here", "--out", str(tmp_path / "out")]  # fmt: skip
    assert first_step.main(args) == 0
    out = tmp_path / "out"
    runs = [json.loads(s) for s in (out / "runs.jsonl").read_text().splitlines()]
    assert [(r["label"], r["dataset"], r["k"], r["seed"]) for r in runs] == [
        ("here", "mnist", 5, 0), ("here", "mnist", 5, 1)]
    table = (out / "first-step.md").read_text()
    assert "| here | mnist | 5 | 2 |" in table
    assert (out / "first-step.png").stat().st_size > 0
