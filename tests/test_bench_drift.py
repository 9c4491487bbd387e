"""The drift benchmark: quick run end to end, the streams' order and shifts, the peers' rules.

The end-to-end test runs ``python -m benchmarks --drift --quick`` in-process on a
small fake MNIST (labels and all) and checks the three outputs; the others check the
stream generators, the numpy re-implementation of Spark's decay rule against the formula
computed by hand, and the numba replay of river's rule against river itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import cli
from benchmarks.drift import gaussian_stream, mnist_stream
from benchmarks.drift_peers import (
    METHODS,
    SparkDecay,
    make_method,
    river_check,
    river_halflife,
    spark_decay_factor,
)
from benchmarks.drift_report import energy, reference, target_lines


def _fake_mnist(path: Path, n: int = 3000, n_test: int = 600, d: int = 64) -> Path:
    """An npz in MNIST's layout: uint8 rows whose brightness depends on the digit."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 10, n).astype(np.uint8)
    yt = rng.integers(0, 10, n_test).astype(np.uint8)

    def img(labels: np.ndarray) -> np.ndarray:
        base = (labels[:, None] * 20 + rng.integers(0, 40, (labels.size, d))).astype(np.uint8)
        return base

    np.savez(path, train=img(y), train_labels=y, test=img(yt), test_labels=yt)
    return path


def test_quick_run_writes_json_markdown_and_plot(tmp_path: Path) -> None:
    data = _fake_mnist(tmp_path / "mnist.npz")
    out = tmp_path / "out"
    assert cli.main(["--drift", "--quick", "--data", str(data), "--out", str(out)]) == 0
    run = json.loads((out / "drift.json").read_text())
    assert [s["name"] for s in run["streams"]] == ["stationary", "abrupt", "gradual", "mnist"]
    for s in run["streams"]:
        assert set(s["vectors_per_s"]) == set(METHODS)
        assert all(v > 0 for v in s["vectors_per_s"].values())
        assert s["checkpoints"] and s["checkpoints"][-1]["position"] == s["n"]
        for c in s["checkpoints"]:
            assert set(c["above_pct"]) == set(METHODS)
            assert all(math.isfinite(v) for v in c["above_pct"].values())
            assert c["reference"]["source"] in ("nmbatch.window", "k-means++")
        assert any(c["target_applies"] for c in s["checkpoints"])
        check = s["river_check"]
        if check["available"]:
            assert check["max_abs_diff_vs_replay"] < 1e-9
    md = (out / "drift.md").read_text()
    assert "python -m benchmarks --drift --quick" in md
    assert "## Target check" in md and "spark-decay (numpy re-implementation)" in md
    assert "CPU:" in md
    assert (out / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_variants_are_the_window_without_swaps_or_catching_up() -> None:
    rows = np.random.default_rng(0).normal(size=(600, 3)).astype(np.float32)
    swaps, catch_up = {}, {}
    names = ("nmbatch.window", "nmbatch.window.noswap", "nmbatch.window.nocatchup", "nmbatch.age")
    for name in names:
        m = make_method(name, k=4, window=400, chunk=200, rate=1000.0, seed=0)
        assert m.name == name
        for start in range(0, 600, 200):
            m.update(rows[start : start + 200], start / 1000.0)
        swaps[name] = m.est._algorithm.swap
        catch_up[name] = m.est.catch_up
        assert m.diagnostics()["retained"] == 400
    assert [swaps[n] for n in names] == [True, False, True, True]
    assert [catch_up[n] for n in names] == ["auto", "auto", 0, "auto"]


def _near(rows: np.ndarray, means: np.ndarray, tol: float) -> bool:
    """Every row within ``tol`` of some row of ``means``."""
    d = np.linalg.norm(rows[:, None, :] - means[None], axis=2)
    return bool((d.min(1) < tol).all())


def test_abrupt_stream_moves_every_cluster_at_the_change() -> None:
    W, c = 1000, 100
    s = gaussian_stream(
        "abrupt", k=4, dim=8, window=W, chunk=c, every=W // 2, n_test=50, seed=3, std=1e-3
    )
    A, B = s.extra["means_before"], s.extra["means_after"]
    assert s.n == 6 * W and s.changes == ((3 * W, 3 * W),)
    before, after = s.rows(3 * W - c, 3 * W), s.rows(3 * W, 3 * W + c)
    assert _near(before, A, 0.1) and not _near(before, B, 0.1)
    assert _near(after, B, 0.1) and not _near(after, A, 0.1)
    assert _near(s.heldout(3 * W), A, 0.1) and _near(s.heldout(3 * W + 1), B, 0.1)
    np.testing.assert_array_equal(s.rows(0, c), s.rows(0, c))  # reproducible
    assert not s.target_applies(4 * W - 1) and s.target_applies(4 * W)
    assert not s.target_applies(W - 1) and s.target_applies(W)


def test_gradual_stream_moves_the_means_linearly() -> None:
    W, c = 1000, 100
    s = gaussian_stream(
        "gradual", k=4, dim=8, window=W, chunk=c, every=W // 2, n_test=50, seed=4, std=1e-3
    )
    A, B = s.extra["means_before"], s.extra["means_after"]
    assert s.changes == ((2 * W, 4 * W),)
    assert _near(s.rows(2 * W - c, 2 * W), A, 0.1)
    mid = s.rows(3 * W, 3 * W + 1)  # f = 1/2 exactly at 3W
    assert _near(mid, (A + B) / 2, 0.1)
    assert _near(s.heldout(3 * W + 1), (A + B) / 2, 0.1)
    assert _near(s.rows(4 * W, 4 * W + c), B, 0.1)
    quarter = s.extra["fraction"](np.array([2.5 * W]))
    assert quarter[0] == pytest.approx(0.25)
    assert not s.target_applies(3 * W) and not s.target_applies(5 * W - 1)
    assert s.target_applies(5 * W)
    stat = gaussian_stream(
        "stationary", k=4, dim=8, window=W, chunk=c, every=W, n_test=5, seed=4, std=1e-3
    )
    assert stat.changes == () and _near(stat.rows(stat.n - c, stat.n), A, 0.1)


def test_mnist_stream_order_is_low_digits_then_high_then_all(tmp_path: Path) -> None:
    path = _fake_mnist(tmp_path / "m.npz", n=500, n_test=200)
    s = mnist_stream(path, k=4, window=100, chunk=50, every=50, seed=0)
    with np.load(path) as f:
        y, yt, train = f["train_labels"], f["test_labels"], f["train"]
    order, (e0, e1, e2) = s.extra["order"], s.extra["phase_ends"]
    low, high = np.flatnonzero(y <= 4), np.flatnonzero(y >= 5)
    assert (e0, e1, e2) == (low.size, low.size + high.size, 2 * y.size) == (e0, e1, s.n)
    assert sorted(order[:e0]) == list(low) and sorted(order[e0:e1]) == list(high)
    assert sorted(order[e1:]) == list(range(y.size))  # all of train, shuffled
    assert not np.array_equal(order[e1:], np.arange(y.size))
    np.testing.assert_array_equal(s.rows(10, 20), train[order[10:20]].astype(np.float32))
    assert s.changes == ((e0, e0), (e1, e1))
    assert s.heldout(e0).shape[0] == np.count_nonzero(yt <= 4)
    assert s.heldout(e0 + 1).shape[0] == np.count_nonzero(yt >= 5)
    assert s.heldout(s.n).shape[0] == yt.size


def test_spark_decay_matches_the_formula_by_hand() -> None:
    a = math.exp(math.log(0.5) / 2.0)
    assert spark_decay_factor(2.0) == pytest.approx(a) and a**2 == pytest.approx(0.5)
    m = SparkDecay(2, 2.0, seed=0, centers=np.array([[0.0], [10.0]]), weights=np.array([2, 3]))
    m.update(np.array([[1.0], [2.0], [9.0]], dtype=np.float32), 0.0)
    w0, w1 = 2 * a**3 + 2, 3 * a**3 + 1  # decayed by a^(3 points), plus the counts
    l0, l1 = 2 / w0, 1 / w1
    np.testing.assert_allclose(m.weights, [w0, w1], rtol=1e-12)
    np.testing.assert_allclose(
        m.centroids(), [[(1 - l0) * 0 + l0 * 1.5], [(1 - l1) * 10 + l1 * 9]], rtol=1e-12
    )


def test_spark_decay_splits_a_dying_cluster() -> None:
    a = spark_decay_factor(4.0)
    m = SparkDecay(2, 4.0, seed=0, centers=np.array([[0.0], [100.0]]), weights=np.array([1, 0]))
    m.update(np.array([[1.0]]), 0.0)
    w = a + 1.0
    x = 1.0 / w  # (1 - lambda) 0 + lambda 1, lambda = 1 / w
    np.testing.assert_allclose(m.weights, [w / 2, w / 2], rtol=1e-12)
    p = 1e-14 * max(abs(x), 1.0)
    np.testing.assert_allclose(m.centroids().ravel(), [x + p, x - p], rtol=0, atol=1e-15)


def test_river_replay_is_river_and_halflife_matches_the_window() -> None:
    k, W = 4, 800
    step = river_halflife(k, W)
    assert (1 - step) ** (W / (2 * k)) == pytest.approx(0.5)
    pytest.importorskip("river")
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((300, 5)) + rng.integers(0, 3, (300, 1)) * 4).astype(np.float32)
    got = river_check(X, 100, k, W, seed=0)
    assert got["available"] and got["samples"] == 300
    assert got["max_abs_diff_vs_replay"] == 0.0


def test_energy_and_reference() -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 3)).astype(np.float32)
    C = rng.standard_normal((4, 3))
    brute = np.mean([min(float(np.sum((x - c) ** 2)) for c in C) for x in X.astype(np.float64)])
    assert energy(X, C) == pytest.approx(brute, rel=1e-9)
    ref = reference(X, 4, C, seed=0, inits=1)
    assert ref["source"] in ref["window_energy"]
    assert ref["window_energy"][ref["source"]] == min(ref["window_energy"].values())
    assert energy(X, ref["centers"]) <= energy(X, C) + 1e-9


def test_target_lines_say_met_and_not_met() -> None:
    def stream(pcts: list[float], rate_seconds: float) -> dict:
        return {
            "name": "s",
            "vectors_per_s": {"nmbatch.window": 1000 / rate_seconds},
            "checkpoints": [
                {"position": i, "target_applies": i > 0, "above_pct": {"nmbatch.window": p}}
                for i, p in enumerate(pcts)
            ],
        }

    run = {
        "target": {"above_pct": 1.0, "vectors_per_s": 100.0},
        "streams": [stream([50.0, 0.5, 0.2], 1.0), stream([0.0, 3.0], 100.0)],
    }
    first, second = target_lines(run)
    assert "**met** (worst +0.50%" in first and "rate >= 100/s: **met**" in first
    assert "**not met**" in second and "first at 1" in second and "(10 vectors/s)" in second
