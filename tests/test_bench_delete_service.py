"""benchmarks.delete_service end to end on tiny sizes: a real service process with its
embedded Redis, rows pushed with ids, deletions timed, the JSON and the table written."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.delete_service import main


def test_the_benchmark_runs_end_to_end_on_tiny_sizes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    doc = main(["--n", "3000", "--dim", "4", "--k", "3", "--sizes", "1,10,200",
                "--repeats", "2", "--timeout", "120", "--out", str(out)])  # fmt: skip
    saved = json.loads((out / "delete_service.json").read_text())
    assert saved["sizes"] == doc["sizes"]
    assert [s["ids"] for s in saved["sizes"]] == [1, 10, 200]
    assert all(len(s["runs"]) == 2 and s["median_seconds"] > 0 for s in saved["sizes"])
    assert saved["n_samples_after"] == 3000 - 2 * (1 + 10 + 200)
    table = (out / "delete_service.md").read_text()
    assert "| 200 | 1 |" in table and "--sizes 1,10,200" in table
