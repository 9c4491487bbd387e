"""``benchmarks.bench_compare``: before/after tables of benchmark runs, pooled over runs."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_compare import main


def write_run(folder: Path, times: dict[str, float | None]) -> Path:
    folder.mkdir(parents=True)
    result = {"algorithms": {"nmbatch": {"time_to": times, "final_rel": 0.001}}}
    (folder / "results.json").write_text(json.dumps(result))
    return folder


def test_runs_are_pooled_per_side_and_compared(tmp_path: Path) -> None:
    old1 = write_run(tmp_path / "old", {"0.05": 1.0, "0.02": 2.0, "0.01": 4.0, "0.005": None})
    old2 = write_run(tmp_path / "old-2", {"0.05": 3.0, "0.02": 2.0, "0.01": 6.0, "0.005": 8.0})
    new1 = write_run(tmp_path / "new", {"0.05": 1.0, "0.02": 1.0, "0.01": 4.5, "0.005": 7.0})
    out = tmp_path / "out"
    assert main([f"d:old={old1}", f"d:old={old2}", f"d:new={new1}", "--out", str(out)]) == 0
    table = json.loads((out / "comparison.json").read_text())["d"]["nmbatch"]
    assert table["old_pooled"] == {"0.05": 2.0, "0.02": 2.0, "0.01": 5.0, "0.005": None}
    assert table["new_pooled"]["0.01"] == 4.5
    assert table["ratio_new_over_old"]["0.01"] == 0.9
    assert table["ratio_new_over_old"]["0.005"] is None  # one old run never got there
    text = (out / "comparison.md").read_text()
    assert "| nmbatch | 1.0% | 4, 6 | 4.5 | 5 | 4.5 | 0.90 |" in text
    assert (out / "comparison.png").stat().st_size > 0
