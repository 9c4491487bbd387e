"""The window-lag tool: a tiny run end to end, and its lag accounting.

The end-to-end test runs ``python -m benchmarks.window_lag`` in-process on a window of 3,000
samples of d = 8 for half a second of streaming in both modes, checks the three outputs,
and recomputes every publication's lag from the columns the tool wrote: what has arrived
by the publication (whole entries), what has left the window (one old sample per sample
fed, once the window is full) and the prefix ``b``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.window_lag import COLUMNS, Clock, MixtureStream, lag_at, main

CFG = {"window": 100, "rate": 10.0, "entry": 5}


def test_lag_at_counts_whole_entries() -> None:
    # By t = 2.0 s, 20 samples of the timed stream have come: 4 entries of 5.
    lag = lag_at(2.0, b=100, n_retired=15, newest=114, cfg=CFG, cycle=0.5)
    # ids [0, 120) arrived, 15 left, 100 in the prefix: 5 behind, 5 came per 0.5 s.
    assert lag["behind"] == 5
    assert lag["lag_it"] == pytest.approx(1.0)
    # id 114 is in entry 2 (ids 110..114), which arrived at 15 / 10 = 1.5 s.
    assert lag["lag_s"] == pytest.approx(0.5)
    # An entry not yet complete has not arrived: at 2.49 s still 4 entries.
    assert lag_at(2.49, 100, 15, 114, CFG, 0.5)["behind"] == 5
    # A prefix holding everything arrived is not behind; a prefilled sample came before 0.
    assert lag_at(2.0, 105, 15, 119, CFG, 0.5)["behind"] == 0
    assert lag_at(0.25, 100, 0, 99, CFG, 0.25)["lag_s"] == pytest.approx(0.25)


def test_clock_does_not_count_paused_time() -> None:
    clock = Clock()
    with clock.paused():
        time.sleep(0.05)
    assert clock.now() < 0.04


def test_mixture_stream_rows_and_drift() -> None:
    still = MixtureStream(d=6, n_true=3, window=1000, drift=0.0, seed=1)
    X = still.rows(0, 50)
    assert X.shape == (50, 6) and X.dtype == np.float32
    moving = MixtureStream(d=6, n_true=3, window=1000, drift=2.0, seed=1)
    # The means move 2 noise deviations per window along unit directions.
    assert np.linalg.norm(1000 * moving.way, axis=1) == pytest.approx([2.0] * 3, rel=1e-5)


def test_tiny_run_writes_outputs_and_accounts_lag(tmp_path: Path) -> None:
    W, R, E = 3000, 30_000.0, 300
    argv = ["--out", str(tmp_path), "--k", "3", "--modes", "engine", "top-up", "--window",
            str(W), "--d", "8", "--rate", str(R), "--duration", "0.5", "--entry", str(E),
            "--batch-size", "500", "--warm-seconds", "3"]  # fmt: skip
    doc = main(argv)
    assert {p.name for p in tmp_path.iterdir()} == {"results.json", "results.md", "lag.png"}
    assert json.loads((tmp_path / "results.json").read_text())["command"] == doc["command"]
    md = (tmp_path / "results.md").read_text()
    assert doc["command"] in md and doc["machine"]["cpu"] in md and "![lag](lag.png)" in md
    assert [(r["k"], r["mode"]) for r in doc["runs"]] == [(3, "engine"), (3, "top-up")]
    for r in doc["runs"]:
        c = {name: np.asarray(r["columns"][name]) for name in COLUMNS}
        s = r["summary"]
        assert s["iterations"] == len(c["t"]) > 0 and r["fed"] == c["rows"].sum()
        assert (c["rows"] % E == 0).all() and (c["N"] == W).all() and (c["b"] <= c["N"]).all()
        assert r["retained"] == W and s["bytes_per_sample"] > 4 * 8
        # Recompute the lag: arrived (whole entries) - retired (one per row fed) - b.
        arrived = W + (c["t"] * R).astype(np.int64) // E * E
        retired = np.cumsum(c["rows"])
        assert (c["behind"] == np.maximum(arrived - retired - c["b"], 0)).all()
        assert (c["backlog"] == arrived - W - retired).all() and (c["backlog"] >= 0).all()
        cycle = np.diff(np.concatenate([[0.0], c["t"]]))
        assert c["lag_it"] == pytest.approx(c["behind"] / (R * cycle))
        assert (c["lag_s"] > 0).all()
        assert s["lag_it"]["max"] == pytest.approx(c["lag_it"].max())
        assert s["windows_passed"] == pytest.approx(r["fed"] / W)
    top_up = doc["runs"][1]
    assert top_up["warm"]["b"] == W
    # The prefix held every sample at every publication: behind are only the entries
    # that came after the feed.
    assert top_up["summary"]["b_equals_N"] == 1.0
