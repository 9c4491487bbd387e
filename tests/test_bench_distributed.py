"""The distributed benchmark (``python -m benchmarks.distributed``): the cost
model's arithmetic by hand, and a quick run end to end on a real local Ray."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import distributed_model as model


def constants(**over: float) -> dict:
    c = {
        "k": 10, "d": 4, "n": 1000, "threads": 1, "shard_bytes_per_row": 100.0,
        "merge_seconds_per_shard": 1e-5, "bound_mode": "full",
        "local": {"rounds_per_level": {"100": 3, "200": 2, "400": 5},
                  "seconds_per_new_row": 2e-6, "seconds_per_revisited_row": 1e-6,
                  "batch_at_1pc": 200, "steps": 10, "steps_to_1pc": 5},
        "shards": {"1": {"overhead_per_round": 1e-3}},
    }  # fmt: skip
    c.update(over)
    return c


def test_round_bytes_is_c_and_p_out_and_every_cluster_back() -> None:
    assert model.round_bytes(3, 10, 4) == 3 * (4 * 40 + 80) + 3 * (8 * 40 + 240)


def test_the_cost_model_adds_up_by_hand() -> None:
    c = constants()
    n, P = 800, 8
    rows = model.cost_table(c, n, (1, P))
    one, eight = rows
    # Levels 100, 200, 400, 800; the middle levels take the median (3) rounds, the last 5.
    assert one["levels"] == 4 and one["rounds"] == 3 + 3 + 3 + 5
    t_new, t_rev = 2e-6, 1e-6
    by_hand = (
        (100 * t_new + 2 * 100 * t_rev)
        + (100 * t_new + 100 * t_rev + 2 * 200 * t_rev)
        + (200 * t_new + 200 * t_rev + 2 * 400 * t_rev)
        + (400 * t_new + 400 * t_rev + 4 * 800 * t_rev)
    )
    assert one["seconds_to_converge"] == pytest.approx(by_hand)
    fixed = 1e-3 + model.LATENCY + P * 1e-5 + model.round_bytes(P, 10, 4) / model.BANDWIDTH
    assert eight["fixed_seconds_per_round"] == pytest.approx(fixed)
    assert eight["round_seconds_full_batch"] == pytest.approx(fixed + math.ceil(n / P) * t_rev)
    assert eight["memory_gib_per_node"] == pytest.approx(n / P * 100 / 2**30)
    # To 1%: the levels up to the batch of 200.
    assert one["seconds_to_1pc"] == pytest.approx(
        (100 * t_new + 2 * 100 * t_rev) + (100 * t_new + 100 * t_rev + 2 * 200 * t_rev)
    )
    assert eight["seconds_to_1pc"] > one["seconds_to_1pc"]  # small batches: fixed cost
    lim = model.limits(c, n)
    assert lim["nodes_fastest_to_converge"] >= 1 and lim["nodes_compute_below_half"] >= 1


def test_a_quick_run_writes_the_tables(tmp_path) -> None:
    pytest.importorskip("ray")
    from benchmarks import distributed

    out = tmp_path / "dist"
    assert distributed.main([
        "--quick", "--datasets", "blobs", "--seeds", "1", "--budget", "0.5", "--shards", "2",
        "--reference-seconds", "5", "--out", str(out),
    ]) == 0  # fmt: skip
    doc = json.loads((out / "distributed.json").read_text())
    algos = doc["runs"]["blobs"]["algorithms"]
    assert set(algos) == {"nmbatch", "ray.2"}
    notes = algos["ray.2"]["notes"]
    assert notes["round_bytes"] > 0 and notes["setup_seconds"] > 0 and notes["n_lost"] == 0
    one = doc["constants"]["shards"]["2"]
    assert one["same_rounds_as_local"] and one["same_centroids_as_local"]
    assert all(a + b <= one["formula_bytes"] for a, b in one["round_bytes"])
    assert [r["nodes"] for r in doc["cost_model"]] == list(model.NODES)
    text = (out / "distributed.md").read_text()
    assert "| ray.2 |" in text and "Cost model" in text and "stops scaling" in text
    assert (out / "distributed.png").stat().st_size > 0
    assert (out / "blobs" / "results.md").exists()
