"""benchmarks.user_headline: the headline table from user-mode results."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.user_headline import main


def _results(folder: Path, dataset: str, k: int, times: dict[str, list[float | None]]) -> None:
    folder.mkdir()
    summary = {"1": {m: {"time_to": {"0.05": t[0], "0.02": t[0], "0.01": t[0], "0.005": t[1]},
                         "final_rel": 0.001} for m, t in times.items()}}
    doc = {"dataset": {"name": dataset}, "k": k, "seeds": 1, "summary": summary, "note": "x"}
    (folder / "results.json").write_text(json.dumps(doc))


def test_the_table_bolds_the_fastest_at_each_level_and_says_never(tmp_path: Path) -> None:
    _results(tmp_path / "a", "mnist", 50, {"nmbatch": [0.2, 0.5], "faiss": [0.1, None]})
    _results(tmp_path / "b", "patches", 1024, {"nmbatch": [3.0, None], "sklearn": [5.0, 9.0]})
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "h")]) == 0
    md = (tmp_path / "h.md").read_text().splitlines()
    rows = [line for line in md if line.startswith("| mnist") or line.startswith("| patches")]
    assert rows[0] == "| mnist, 50, 1 | 0.2 / **0.5** | **0.1** / never | – |"
    assert rows[1] == "| patches, 1,024, 1 | **3** / never | – | 5 / **9** |"
    doc = json.loads((tmp_path / "h.json").read_text())
    assert [(r["dataset"], r["k"], r["threads"]) for r in doc] == [("mnist", 50, 1),
                                                                   ("patches", 1024, 1)]
