"""``python -m benchmarks.user_headline``: one table from several user-mode runs.

Each folder is the output of ``python -m benchmarks --mode user`` (its ``results.json``).
For every run (data set, ``k``) and thread count, the table gives each method's seconds
to 1% and to 0.5% above that run's ``E*`` (the best validation energy any method
reached in it), seeding and loading inside the clock; the fastest method at each level
is in bold. Writes ``OUT.json`` and ``OUT.md`` (the README's headline is this table).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["LABELS", "headline", "main", "render"]

# The columns, in order, with their short labels (benchmarks.user_peers has the long ones).
LABELS = {
    "nmbatch": "nmbatch",
    "faiss": "faiss (defaults)",
    "faiss.allrows": "faiss (all rows)",
    "sklearnex": "sklearnex",
    "superkmeans": "SuperKMeans (defaults)",
    "superkmeans.full": "SuperKMeans (full)",
    "sklearn": "scikit-learn",
}
LEVELS = ("0.01", "0.005")


def headline(folders: list[Path]) -> list[dict[str, Any]]:
    """One row per (run, thread count): ``{"dataset", "k", "threads", "times": {method:
    {level: seconds or None}}, "final": {method: E_V/E* - 1}, "note"}``."""
    rows = []
    for folder in folders:
        doc = json.loads((folder / "results.json").read_text())
        ds = doc["dataset"]
        name = ds["name"] if isinstance(ds, dict) else str(ds)
        for threads, per in sorted(doc["summary"].items(), key=lambda kv: int(kv[0])):
            rows.append({
                "dataset": name, "k": int(doc["k"]), "threads": int(threads),
                "seeds": doc.get("seeds"), "folder": folder.as_posix(),
                "times": {m: {lv: per[m]["time_to"].get(lv) for lv in LEVELS} for m in per},
                "final": {m: per[m].get("final_rel") for m in per},
                "note": doc.get("note"),
            })
    return rows


def _cell(t: float | None, best: float | None) -> str:
    if t is None:
        return "never"
    text = f"{t:.3g}"
    return f"**{text}**" if best is not None and t <= best else text


def render(rows: list[dict[str, Any]]) -> str:
    """The markdown table: seconds to 1% / 0.5% per method; bold: the fastest."""
    methods = [m for m in LABELS if any(m in r["times"] for r in rows)]
    head = "| data, k, threads | " + " | ".join(LABELS[m] for m in methods) + " |"
    lines = [head, "|---|" + "---|" * len(methods)]
    for r in rows:
        best = {}
        for lv in LEVELS:
            reached = [r["times"][m][lv] for m in methods
                       if m in r["times"] and r["times"][m][lv] is not None]
            best[lv] = min(reached) if reached else None
        cells = []
        for m in methods:
            if m not in r["times"]:
                cells.append("–")
                continue
            cells.append(" / ".join(_cell(r["times"][m][lv], best[lv]) for lv in LEVELS))
        label = f"{r['dataset']}, {r['k']:,}, {r['threads']}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.user_headline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path, help="user-mode output folders")
    p.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    rows = headline(args.folders)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    command = "python -m benchmarks.user_headline " + " ".join(
        [f.as_posix() for f in args.folders] + ["--out", args.out.as_posix()])
    text = (f"Seconds to 1% / 0.5% above each run's best energy, as users run each method "
            f"(seeding and loading in the clock); bold: the fastest.\n\nCommand: "
            f"`{command}`\n\n" + render(rows))
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
