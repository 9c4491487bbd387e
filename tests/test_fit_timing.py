"""``python -m benchmarks.fit_timing``: whole fits timed and hashed, one JSON line each."""

from __future__ import annotations

import json

from benchmarks import fit_timing


def test_fit_timing_records_identical_fits(tmp_path):
    args = ["--dataset", "blobs", "--max-train", "3000", "--seeds", "2", "--repeats", "2",
            "--k", "8", "--label", "here", "--out", str(tmp_path)]  # fmt: skip
    assert fit_timing.main(args) == 0
    lines = [json.loads(x) for x in (tmp_path / "fits.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    assert {r["label"] for r in lines} == {"here"}
    for seed in (0, 1):
        runs = [r for r in lines if r["seed"] == seed]
        assert len({r["sha256"] for r in runs}) == 1  # the same model twice
        assert all(r["steps"] >= 1 and r["seconds"] > 0 for r in runs)
