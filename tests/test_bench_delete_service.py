"""benchmarks.delete_service end to end on tiny sizes: a real service process with its
embedded Redis, rows pushed with ids, deletions timed, the JSON and the table written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.delete_service import main, markdown


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


RESULTS = Path(__file__).resolve().parent.parent / "docs" / "bench" / "delete-service"


@pytest.mark.parametrize("saved", sorted(RESULTS.rglob("delete_service.json")), ids=str)
def test_a_committed_report_is_the_rendering_of_its_json(saved: Path) -> None:
    doc = json.loads(saved.read_text())
    assert markdown(doc) == (saved.parent / "delete_service.md").read_text()
    assert doc["n"] == 1_000_000 and [s["ids"] for s in doc["sizes"]] == [1, 1_000, 100_000]
