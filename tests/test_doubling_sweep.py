"""benchmarks/doubling_sweep.py: the held-out energy and the levels it reports."""

from __future__ import annotations

import numpy as np

from benchmarks.doubling_sweep import levels, run_setting, validation_energy
from tests.testkit import blobs


def test_validation_energy_is_the_mean_nearest_squared_distance() -> None:
    rng = np.random.default_rng(0)
    V = rng.normal(size=(50, 4)).astype(np.float32)
    C = rng.normal(size=(6, 4)).astype(np.float32)
    brute = ((V[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(2)
    assert np.isclose(validation_energy(V, C), brute.min(axis=1).mean(), rtol=1e-9)


def test_levels_are_the_first_step_at_or_below_each_level() -> None:
    run = {"seconds": [1.0, 2.0, 3.0, 4.0], "energy": [110.0, 104.0, 100.9, 100.4]}
    assert levels(run, 100.0) == {"5%": 2.0, "2%": 3.0, "1%": 3.0, "0.5%": 4.0,
                                  "final": 0.4}
    assert levels({"seconds": [1.0], "energy": [103.0]}, 100.0)["1%"] is None


def test_the_rule_changes_when_the_batch_doubles_at_a_k_sized_first_batch() -> None:
    X = blobs(12_000, 6, 60, seed=5, spread=2.5)
    train, test = X[:10_000], X[10_000:]
    kw = dict(max_steps=200, max_seconds=60.0, batch_size=300)  # 20 k > 300: sized to k
    paper = run_setting(train, test, 60, float("inf"), 0.0, **kw)
    median = run_setting(train, test, 60, 1.0, 0.5, **kw)
    assert paper["batch_size"][0] == median["batch_size"][0] == 20 * 60
    assert paper["batch_size"] != median["batch_size"]
    # The median rule doubles no later: at every step its batch is at least as large.
    for a, b in zip(paper["batch_size"], median["batch_size"], strict=False):
        assert b >= a
    for run in (paper, median):
        assert run["converged"] and run["batch_size"][-1] == len(train)
        assert len(run["seconds"]) == len(run["energy"]) == len(run["batch_size"])


def test_bound_mode_and_dense_fraction_change_the_speed_not_the_run() -> None:
    """Every bound mode and revisit path decides the same nearest centroids: the same
    batches and held-out energies, bit for bit."""
    X = blobs(6_000, 5, 80, seed=2, spread=2.5)
    train, test = X[:5_000], X[5_000:]
    kw = dict(max_steps=12, max_seconds=60.0, batch_size=300)
    base = run_setting(train, test, 80, 1.0, 0.5, **kw)
    for bounds, fraction in (("group", 0.0), ("group", 1.0), ("full", 0.0), ("hamerly", None)):
        run = run_setting(train, test, 80, 1.0, 0.5, bounds=bounds, dense_fraction=fraction, **kw)
        assert run["batch_size"] == base["batch_size"]
        assert run["energy"] == base["energy"]
