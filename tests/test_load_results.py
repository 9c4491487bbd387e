"""The committed load benchmark results: the report renders from its JSON, the docs quote it."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.loadtest.report import markdown

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "bench" / "load"


def test_the_markdown_report_is_the_rendering_of_the_json() -> None:
    result = json.loads((RESULTS / "loadtest.json").read_text())
    assert markdown(result) == (RESULTS / "loadtest.md").read_text()


def test_every_target_is_met_and_quoted_in_the_docs() -> None:
    report = (RESULTS / "loadtest.md").read_text()
    table = report[report.index("## Targets") : report.index("## Phases")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 5
    page = (REPO / "docs" / "benchmarks" / "service.md").read_text()
    for row in rows[1:]:
        assert row in page, row
        assert not row.endswith("| **no** |"), row
