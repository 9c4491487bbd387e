"""``python -m benchmarks --large-k``: the benchmark at several ``k``, one folder.

For each ``k`` of ``--ks`` it runs the benchmark (:func:`benchmarks.paper.main`,
every option not listed here passed through: ``--dataset``, ``--data``, ``--seeds``,
``--budget``, ``--algorithms``, ...) into ``OUT/<dataset>-k<k>/`` (results.json,
results.md, curves.json, curves.png), then measures each algorithm's memory per sample
(:mod:`benchmarks.memory`; ``OUT/<dataset>-k<k>/memory.json``), and finally
rebuilds ``OUT/large_k.json``, ``OUT/large_k.md`` and ``OUT/large_k.png`` from every
``<dataset>-k<k>`` folder in ``OUT``: runs of several data sets (one command each) into
the same folder add up. ``--summarize-only`` rebuilds the summary without running.

Defaults differ from the k = 50 benchmark: one seed, the algorithms of issue 16
(:data:`LARGE_K_ALGORITHMS`), and a reference Lloyd run capped at ``--reference-seconds``
(600 s unless given; a run to the fixed point takes hours at k = 4,096).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks import options, paper
from benchmarks.memory import measure_memory, memory_markdown
from benchmarks.protocol import EPS_KEYS

__all__ = ["LARGE_K_ALGORITHMS", "build_parser", "main", "summarize_folder"]

LARGE_K_ALGORITHMS = (
    "nmbatch", "sklearn.lloyd", "sklearn.elkan", "faiss", "faiss.subsampled",
    "sklearn.minibatch.5000", "sklearn.minibatch.1024",
)
_RUN_DIR = re.compile(r"^(?P<dataset>.+)-k(?P<k>\d+)$")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks --large-k",
        description="The benchmark at several k into one folder, with memory per sample. "
        "Other options go to the benchmark (python -m benchmarks --help).",
        allow_abbrev=False,  # --k is the benchmark's (refused here), not --ks
    )
    p.add_argument("--ks", default="256,1024,4096", help="comma-separated k values")
    p.add_argument("--out", type=Path, default=Path("bench-results") / "large-k")
    p.add_argument("--no-memory", action="store_true", help="skip the memory table")
    p.add_argument("--memory-n", type=int, default=None,
                   help="rows for the memory measurement (default: the whole training set)")
    p.add_argument("--memory-iterations", type=int, default=2)
    p.add_argument("--summarize-only", action="store_true",
                   help="only rebuild large_k.json/.md/.png from the folders in --out")
    return p


def _dataset_label(passthrough: list[str]) -> str:
    """Folder name of the data set, from the benchmark's own options."""
    args, _ = options.build_parser().parse_known_args(passthrough)
    if args.dataset and args.dataset != "npz":
        return str(args.dataset)
    return Path(args.data).stem if args.data else "blobs"


def _run_k(k: int, passthrough: list[str], out: Path) -> int:
    argv = [
        "--seeds", "1", "--algorithms", ",".join(LARGE_K_ALGORITHMS),
        "--reference-seconds", "600", *passthrough, "--k", str(k), "--out", str(out),
    ]
    return paper.main(argv)


def _measure(k: int, passthrough: list[str], args: argparse.Namespace, out: Path) -> None:
    bench = options.build_parser().parse_args(
        ["--algorithms", ",".join(LARGE_K_ALGORITHMS), *passthrough, "--k", str(k)]
    )
    ds = options.load_dataset(bench)
    names = [n.strip() for n in bench.algorithms.split(",") if n.strip()]
    rows = measure_memory(
        ds.train, names, k, n=args.memory_n, threads=bench.threads,
        iterations=args.memory_iterations, seed=bench.first_seed,
        batch_size=bench.batch_size, log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    for r in rows:
        r["dataset"] = ds.name
    (out / "memory.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")


def _load_runs(folder: Path) -> list[dict[str, Any]]:
    runs = []
    for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = _RUN_DIR.match(sub.name)
        if not m or not (sub / "results.json").is_file():
            continue
        res = json.loads((sub / "results.json").read_text())
        mem = sub / "memory.json"
        runs.append({
            "folder": sub.name, "results": res,
            "memory": json.loads(mem.read_text())["rows"] if mem.is_file() else [],
            "references": json.loads((sub / "curves.json").read_text()).get("references", {})
            if (sub / "curves.json").is_file() else {},
        })
    runs.sort(key=lambda r: (r["results"]["dataset"], r["results"]["k"]))
    return runs


def _cell(t: float | None) -> str:
    return "never" if t is None else f"{t:.3g}"


def summarize_folder(folder: Path, command: str | None = None) -> dict[str, Any]:
    """Write ``large_k.json``, ``large_k.md`` and ``large_k.png`` from every
    ``<dataset>-k<k>`` run folder in ``folder``; returns the JSON document."""
    runs = _load_runs(folder)
    doc = {"runs": [{"folder": r["folder"], **r["results"], "memory": r["memory"],
                     "references": r["references"]} for r in runs]}
    (folder / "large_k.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    L = ["# nmbatch at large k\n"]
    if command:
        L.append(f"Last command: `{command}`\n")
    L.append("Time (s, median over seeds) to reach (1+eps) E*_s, and final E_V/E*_s - 1; "
             "each run's folder holds its results.md (machine, command, method, E*_s "
             "and the reference Lloyd run) and curves.png. faiss.subsampled is faiss's "
             "default (max_points_per_centroid = 256, niter = 25): it subsamples only "
             "when n > 256 k.\n")
    for r in runs:
        res = r["results"]
        L.append(f"## {res['dataset']}, k = {res['k']:,} (n = {res['n_train']:,}, "
                 f"d = {res['dim']}, seeds {res['seeds']}, threads {res['threads']})\n")
        L.append("| algorithm | 5% | 2% | 1% | 0.5% | final |")
        L.append("|---|---:|---:|---:|---:|---:|")
        for name, row in res["algorithms"].items():
            cells = " | ".join(_cell(row["time_to"][e]) for e in EPS_KEYS)
            L.append(f"| {name} | {cells} | {100 * row['final_rel']:.2f}% |")
        L.append("")
    mem = [m for r in runs for m in r["memory"]]
    if mem:
        L.append("## Memory per sample\n")
        L.append("Peak resident memory a run adds (a fresh process per algorithm, k and "
                 "n; Linux VmHWM after a reset, minus VmRSS before the run), measured at "
                 "n/2 and n rows: bytes per sample is the slope, fixed the rest. The "
                 "engine's algorithms are measured with the whole data in the batch. "
                 "A copy of the data counts (4d bytes per sample as float32); "
                 "nmbatch's includes its store.\n")
        L += memory_markdown(mem)
        L.append("")
    (folder / "large_k.md").write_text("\n".join(L))
    _plot(folder / "large_k.png", runs)
    return doc


def _plot(path: Path, runs: list[dict[str, Any]]) -> None:
    """Per data set: time to 1% and final E_V/E*_s - 1 against k, one line per algorithm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({r["results"]["dataset"] for r in runs})
    if not datasets:
        return
    fig, axes = plt.subplots(len(datasets), 2, figsize=(11, 4 * len(datasets)), dpi=100,
                             squeeze=False)
    for row, name in enumerate(datasets):
        mine = [r["results"] for r in runs if r["results"]["dataset"] == name]
        algos = list(dict.fromkeys(a for res in mine for a in res["algorithms"]))
        for algo in algos:
            ks = [res["k"] for res in mine if algo in res["algorithms"]]
            got = [res["algorithms"][algo] for res in mine if algo in res["algorithms"]]
            t1 = [math.nan if g["time_to"]["0.01"] is None else g["time_to"]["0.01"]
                  for g in got]
            axes[row][0].plot(ks, t1, marker="o", label=algo)
            axes[row][1].plot(ks, [max(g["final_rel"], 1e-5) for g in got], marker="o",
                              label=algo)
        for col, ylabel in enumerate(("time to 1% of E*_s (s; gap: never)",
                                      "final E_V/E*_s - 1 (below 1e-5 drawn at it)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("k")
            ax.set_ylabel(ylabel)
            ax.set_title(name)
            ax.grid(True, alpha=0.3)
        axes[row][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, passthrough = build_parser().parse_known_args(argv)
    if any(a == "--k" or a.startswith("--k=") for a in passthrough):
        raise SystemExit("--large-k takes --ks (a list), not --k")
    if any(a == "--out" or a.startswith("--out=") for a in passthrough):
        raise SystemExit("--out: give it once")
    ks = [int(x) for x in args.ks.split(",") if x.strip()]
    if not ks or min(ks) < 1:
        raise SystemExit(f"--ks must list positive integers, got {args.ks!r}")
    command = "python -m benchmarks --large-k " + shlex.join(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarize_only:
        label = _dataset_label(passthrough)
        for k in ks:
            sub = args.out / f"{label}-k{k}"
            rc = _run_k(k, passthrough, sub)
            if rc != 0:
                return rc
            if not args.no_memory:
                _measure(k, passthrough, args, sub)
    summarize_folder(args.out, command)
    print((args.out / "large_k.md").read_text())
    return 0
