"""``python -m benchmarks.forget``: a small run end to end (the records it writes and the
table it makes of them)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import forget


def test_a_small_run_writes_its_records_and_table(tmp_path: Path) -> None:
    assert forget.main(["--n", "8000", "--d", "8", "--k", "4", "--repeat", "2",
                        "--out", str(tmp_path)]) == 0  # fmt: skip
    run = json.loads((tmp_path / "forget.json").read_text())
    assert (run["n"], run["d"], run["k"]) == (8000, 8, 4)
    sizes = [(r["op"], r["m"]) for r in run["records"]]
    assert sizes.count(("forget", 1)) == 2 and sizes.count(("forget", 1_000)) == 2
    assert ("forget", 100_000) not in sizes  # more than a quarter of the model: left out
    assert sizes.count(("lookup", 1_000)) == 2
    first = [r for r in run["records"] if r["op"] == "forget"]
    assert first[0]["n_before"] == 8000 and run["n_after"] == 8000 - 2 - 2_000
    assert all(r["seconds"] > 0 for r in run["records"])
    table = (tmp_path / "forget.md").read_text()
    assert "| `forget` | 1,000 | 7,998 |" in table
