"""Compare benchmark runs of two commits: time to each energy level, before against after.

Each run is a ``results.json`` written by ``python -m benchmarks``. Runs are
grouped by dataset and side (``old``/``new``); a side may have several runs (taken in
alternating order, to see the machine's drift), whose medians are shown side by side and
pooled as the median of the runs' medians.

Usage (from a checkout)::

    python -m benchmarks.bench_compare --out docs/bench/restructure \\
        mnist:old=docs/bench/restructure/mnist/old mnist:new=docs/bench/restructure/mnist/new ...

Writes ``comparison.json``, ``comparison.md`` and ``comparison.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

LEVELS = ("0.05", "0.02", "0.01", "0.005")


def load(spec: str) -> tuple[str, str, Path, dict]:
    """``dataset:side=folder`` -> (dataset, side, folder, results.json contents)."""
    label, folder = spec.split("=", 1)
    dataset, side = label.split(":", 1)
    path = Path(folder)
    return dataset, side, path, json.loads((path / "results.json").read_text())


def pooled(values: list[float | None]) -> float | None:
    """Median of the runs' medians; None ("never") if any run never got there."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(values)


def compare(specs: list[str]) -> dict:
    """Per dataset and algorithm: each run's median time to each level, pooled per side."""
    table: dict = {}
    for dataset, side, path, result in map(load, specs):
        for name, summary in result["algorithms"].items():
            entry = table.setdefault(dataset, {}).setdefault(name, {})
            runs = entry.setdefault(side, [])
            runs.append({"run": path.name, "time_to": summary["time_to"],
                         "final_rel": summary["final_rel"]})
    for algorithms in table.values():
        for entry in algorithms.values():
            for side in ("old", "new"):
                runs = entry.get(side, [])
                entry[f"{side}_pooled"] = {
                    level: pooled([r["time_to"].get(level) for r in runs]) for level in LEVELS
                }
            entry["ratio_new_over_old"] = {
                level: (entry["new_pooled"][level] / entry["old_pooled"][level])
                if entry["new_pooled"][level] and entry["old_pooled"][level] else None
                for level in LEVELS
            }
    return table


def fmt(value: float | None, digits: int = 3) -> str:
    return "never" if value is None else f"{value:.{digits}g}"


def markdown(table: dict, machine: str, command: str) -> str:
    lines = [
        "# Benchmark before and after a change: time to (1 + eps) E*_s",
        "",
        f"Machine: {machine}",
        "",
        f"Command: `{command}`",
        "",
        "Seconds, median over seeds within a run; each run's medians in order, then the",
        "median of the runs (pooled) and new/old of the pooled values.",
        "",
    ]
    for dataset, algorithms in table.items():
        lines += [f"## {dataset}", "",
                  "| algorithm | eps | old runs | new runs | old | new | new/old |",
                  "|---|---:|---|---|---:|---:|---:|"]
        for name, entry in algorithms.items():
            for level in LEVELS:
                old = ", ".join(fmt(r["time_to"].get(level)) for r in entry.get("old", []))
                new = ", ".join(fmt(r["time_to"].get(level)) for r in entry.get("new", []))
                ratio = entry["ratio_new_over_old"][level]
                lines.append(
                    f"| {name} | {float(level):.1%} | {old} | {new} | "
                    f"{fmt(entry['old_pooled'][level])} | {fmt(entry['new_pooled'][level])} | "
                    f"{'-' if ratio is None else f'{ratio:.2f}'} |"
                )
        lines.append("")
    return "\n".join(lines)


def plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 4), squeeze=False)
    for ax, (dataset, algorithms) in zip(axes[0], table.items(), strict=True):
        names = list(algorithms)
        for offset, side in ((-0.2, "old"), (0.2, "new")):
            values = [algorithms[n][f"{side}_pooled"]["0.01"] or 0.0 for n in names]
            ax.bar([i + offset for i in range(len(names))], values, width=0.4, label=side)
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_ylabel("seconds to 1% of E*_s (median)")
        ax.set_title(dataset)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_compare", description=__doc__)
    parser.add_argument("runs", nargs="+", help="dataset:side=folder (side: old or new)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--machine", default="(not given)")
    parser.add_argument("--command", default="(not given)")
    args = parser.parse_args(argv)
    table = compare(args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.json").write_text(json.dumps(table, indent=1) + "\n")
    (args.out / "comparison.md").write_text(markdown(table, args.machine, args.command))
    plot(table, args.out / "comparison.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
