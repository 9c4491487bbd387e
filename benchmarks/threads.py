"""``python -m benchmarks --threads 1,2``: the benchmark at several thread counts.

Each run limits its thread pools process-wide (:func:`benchmarks.process.limit_threads`),
so every thread count runs in its own child process, one after the other:
``python -m benchmarks <the same options> --threads N --out OUT/threads-N``.
:func:`combine` then reads each ``OUT/threads-N/curves.json`` and ``results.json`` and
writes ``OUT/scaling.json``, ``OUT/scaling.md`` and ``OUT/scaling.png``.

Every thread count is measured against one ``E*_s`` per seed: the lowest ``E_V`` of any
evaluation of any curve of any thread count from that seed, of the reference Lloyd runs
(``curves.json["references"]``) and of each run's own ``E*_s`` (which also counts the rho
study's runs); the times to ``(1+eps) E*_s`` are recomputed from the curves against it
with :func:`benchmarks.report.summarize_all`.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.process import child_env
from benchmarks.protocol import EPS_KEYS, Curve

__all__ = [
    "EXACT_PEERS",
    "ThreadsAction",
    "child_argv",
    "combine",
    "common_estar",
    "default_out",
    "parse_threads",
    "run_scaling",
]

# Peers that compute every distance of every sample (no subsampling): the 4x target's rivals.
EXACT_PEERS = ("sklearn.lloyd", "sklearn.elkan", "faiss")
# The targets for the largest thread count against the smallest.
MAX_OWN_RATIO = 0.6  # time to 1% at most this fraction of its own time at the fewest threads
MIN_PEER_RATIO = 4.0  # and at least this many times sooner than the fastest exact peer
MAX_FINAL_REL = 0.005  # final E_V / E*_s - 1


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the command line ---------------------------------------------------------------------


def parse_threads(text: str) -> list[int]:
    """``"2"`` -> ``[2]``, ``"4,1,2"`` -> ``[1, 2, 4]`` (sorted, duplicates dropped).

    Raises :class:`argparse.ArgumentTypeError` unless every comma-separated item is an
    integer >= 1.
    """
    parts = [p.strip() for p in str(text).split(",")]
    try:
        counts = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a thread count or a comma-separated list of them (1 or 1,2,4), got {text!r}"
        ) from None
    if min(counts) < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {text!r}")
    return sorted(set(counts))


class ThreadsAction(argparse.Action):
    """Stores ``--threads``' list (from :func:`parse_threads`) as ``thread_counts`` and its
    first (smallest) count as ``threads``, the int a single run uses."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        namespace.thread_counts = list(values)
        setattr(namespace, self.dest, int(values[0]))


def default_out(args: argparse.Namespace) -> Path:
    """``bench-results/<dataset>``, the folder a single run writes to without ``--out``
    (the data set's name as :mod:`benchmarks.datasets` gives it)."""
    kind = args.dataset or ("npz" if args.data else "blobs")
    if kind == "npz":
        if args.data is None:
            raise SystemExit("--dataset npz needs --data FILE.npz")
        return Path("bench-results") / Path(args.data).stem
    return Path("bench-results") / kind


def _option_of(token: str, options: Sequence[str]) -> str | None:
    """The long option ``token`` names (exactly, as ``--opt=value`` or as an unambiguous
    prefix, as argparse resolves it), else None."""
    name = token.split("=", 1)[0]
    if not name.startswith("--") or len(name) < 3:
        return None
    if name in options:
        return name
    hits = [o for o in options if o.startswith(name)]
    return hits[0] if len(hits) == 1 else None


def child_argv(argv: Sequence[str], options: Sequence[str], threads: int, out: Path) -> list[str]:
    """``argv`` without its ``--threads`` and ``--out`` (with their values), then
    ``--threads <threads> --out <out>``. ``options``: every option string of the parser."""
    kept: list[str] = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
            continue
        if _option_of(tok, options) in ("--threads", "--out"):
            skip = "=" not in tok
            continue
        kept.append(tok)
    return [*kept, "--threads", str(threads), "--out", str(out)]


def run_scaling(args: argparse.Namespace, argv: Sequence[str], options: Sequence[str]) -> int:
    """Run the benchmark once per ``args.thread_counts`` (child processes, in order), then
    :func:`combine` them in ``--out`` (default ``bench-results/<dataset>``)."""
    counts = list(args.thread_counts)
    out = args.out or default_out(args)
    out.mkdir(parents=True, exist_ok=True)
    for n in counts:
        cmd = [sys.executable, "-m", "benchmarks"]
        cmd += child_argv(argv, options, n, out / f"threads-{n}")
        _log(f"threads {n}: python {shlex.join(cmd[1:])}")
        rc = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, check=False, env=child_env()
        ).returncode
        if rc != 0:
            _log(f"the run with --threads {n} failed (exit status {rc}); no scaling table")
            return rc
    command = "python -m benchmarks " + shlex.join(argv)
    combine(out, counts, command=command, quick=bool(args.quick))
    _log(f"wrote {out / 'scaling.json'}, scaling.md, scaling.png")
    print((out / "scaling.md").read_text())
    return 0


# -- combining ----------------------------------------------------------------------------


def _load(folder: Path, counts: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per thread count: its results.json, results.md text, curves and references."""
    runs: dict[int, dict[str, Any]] = {}
    for n in counts:
        sub = folder / f"threads-{n}"
        doc = json.loads((sub / "curves.json").read_text())
        md = sub / "results.md"
        runs[n] = {
            "results": json.loads((sub / "results.json").read_text()),
            "markdown": md.read_text() if md.is_file() else "",
            "curves": {
                int(s): {name: Curve.from_json(c) for name, c in per.items()}
                for s, per in doc["curves"].items()
            },
            "references": {int(s): r for s, r in doc.get("references", {}).items()},
            "estar": {int(s): float(e) for s, e in doc.get("estar_per_seed", {}).items()},
        }
    return runs


def common_estar(runs: dict[int, dict[str, Any]]) -> dict[int, float]:
    """Per seed: the lowest ``E_V`` of every curve of every thread count, of the reference
    runs and of each run's own ``E*_s``."""
    values: dict[int, list[float]] = {}
    for run in runs.values():
        for s, per in run["curves"].items():
            values.setdefault(s, []).extend(min(c.energy) for c in per.values() if c.energy)
        for s, ref in run["references"].items():
            values.setdefault(s, []).append(float(ref["energy"]))
        for s, e in run["estar"].items():
            values.setdefault(s, []).append(e)
    return {s: min(v) for s, v in sorted(values.items()) if v}


def _speedup(before: float | None, after: float | None) -> float | None:
    """``before / after`` (times), None when either never reached the level."""
    return None if before is None or after is None else before / after


def _peer_ratio(summary: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fastest exact peer's time to 1% over nmbatch's (None: not computable), with
    a ``detail`` text giving both times."""
    from benchmarks.report import _fmt_ratio, _s

    exact = [n for n in EXACT_PEERS if n in summary]
    times = {n: summary[n]["time_to"]["0.01"] for n in exact}
    reached = {n: t for n, t in times.items() if t is not None}
    peer = min(reached, key=reached.__getitem__) if reached else None
    ours = summary["nmbatch"]["time_to"]["0.01"] if "nmbatch" in summary else None
    if "nmbatch" not in summary:
        ratio, text = None, "nmbatch not run"
    elif not exact:
        ratio, text = None, "no exact peer run"
    else:
        ratio, text = _fmt_ratio(ours, reached.get(peer) if peer else None)
    if peer is not None:
        text += f": nmbatch {_s(ours)} s, fastest exact peer {peer} {_s(reached[peer])} s"
    keys = ("peers", "fastest", "peer_time", "nmbatch_time", "ratio", "detail")
    return dict(zip(keys, (exact, peer, reached.get(peer), ours, ratio, text), strict=True))


def _targets(
    counts: list[int],
    table: dict[str, dict[int, dict[str, Any]]],
    peer: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The issue's three checks, the largest thread count against the smallest."""
    from benchmarks.report import _pct, _s

    lo, hi = counts[0], counts[-1]
    ours = table.get("nmbatch")
    if ours is None:
        return [{"name": "nmbatch", "met": False, "value": None, "line": _NOT_RUN}]
    t_lo, t_hi = ours[lo]["time_to"]["0.01"], ours[hi]["time_to"]["0.01"]
    own = None if t_lo is None or t_hi is None else t_hi / t_lo
    if hi == lo:
        own_text = "one thread count only"
    elif own is None:
        own_text = f"{hi} threads: {_s(t_hi)} s, {lo} thread(s): {_s(t_lo)} s"
    else:
        own_text = (
            f"{_s(t_hi)} s at {hi} threads / {_s(t_lo)} s at {lo} = {own:.2f}x, "
            f"a {1 / own:.2f}x speed-up"
        )
    own_met = hi != lo and own is not None and own <= MAX_OWN_RATIO
    p = peer[hi]
    peer_met = p["ratio"] is not None and p["ratio"] >= MIN_PEER_RATIO
    finals = {n: ours[n]["final_rel"] for n in counts}
    final_met = finals[hi] <= MAX_FINAL_REL
    final_text = "; ".join(f"{_pct(finals[n])} at {n} thread(s)" for n in counts)

    own_what = f"nmbatch reaches 1% of E*_s in at most {MAX_OWN_RATIO:g}x its own {lo}-thread time"
    peer_what = (
        f"nmbatch reaches 1% of E*_s at least {MIN_PEER_RATIO:g}x sooner than the fastest "
        f"exact peer ({', '.join(EXACT_PEERS)}) at {hi} threads"
    )
    final_what = f"nmbatch's final energy within {MAX_FINAL_REL:.1%} of E*_s"
    checks = [
        ("own_speedup", own_met, own, own_text, own_what),
        ("peer_ratio", peer_met, p["ratio"], p["detail"], peer_what),
        ("final_energy", final_met, finals[hi], final_text, final_what),
    ]
    return [
        {
            "name": name,
            "met": ok,
            "value": value,
            "line": f"- at --threads {hi}, {what}: **{'met' if ok else 'not met'}** ({detail})",
        }
        for name, ok, value, detail, what in checks
    ]


_NOT_RUN = "- nmbatch was not run: no target can be checked."


def _json_safe(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _section(markdown: str, heading: str) -> list[str]:
    """The lines of ``markdown`` from ``heading`` up to the next ``## `` heading."""
    lines = markdown.splitlines()
    if heading not in lines:
        return []
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def combine(
    folder: Path, counts: Sequence[int], *, command: str | None = None, quick: bool = False
) -> dict[str, Any]:
    """Write ``scaling.json``, ``scaling.md`` and ``scaling.png`` into ``folder`` from
    ``folder/threads-N`` for each ``N`` of ``counts``; returns the JSON document.

    Per algorithm and thread count: medians over seeds of the time (s) to each
    ``(1+eps) E*_s`` and of the final ``E_V/E*_s - 1`` against the common ``E*_s``
    (:func:`common_estar`); the speed-up from the smallest count to each other one at each
    level; per thread count the fastest exact peer's time to 1% over nmbatch's.
    """
    from benchmarks.report import RESULT_NAMES, summarize_all, write_json

    counts = sorted(set(counts))
    runs = _load(folder, counts)
    estar = common_estar(runs)
    summaries = {n: summarize_all(runs[n]["curves"], estar) for n in counts}
    seen = list(dict.fromkeys(name for n in counts for name in summaries[n]))
    names = [n for n in RESULT_NAMES if n in seen] + [n for n in seen if n not in RESULT_NAMES]
    table = {
        name: {n: summaries[n][name] for n in counts if name in summaries[n]} for name in names
    }
    lo = counts[0]
    speedup = {
        name: {
            n: {
                key: _speedup(rows[lo]["time_to"][key], rows[n]["time_to"][key]) for key in EPS_KEYS
            }
            for n in counts[1:]
            if n in rows and lo in rows
        }
        for name, rows in table.items()
    }
    peer = {n: _peer_ratio(summaries[n]) for n in counts}
    targets = _targets(counts, table, peer)
    first = runs[lo]["results"]
    doc = {
        "command": command,
        **{key: first[key] for key in ("dataset", "n_train", "n_test", "dim", "k", "seeds")},
        "threads": counts,
        "E_star_per_seed": {str(s): e for s, e in estar.items()},
        "E_star_per_seed_of_each_run": {
            str(n): {str(s): e for s, e in runs[n]["estar"].items()} for n in counts
        },
        "algorithms": {
            name: {str(n): row for n, row in rows.items()} for name, rows in table.items()
        },
        "speedup": {
            name: {str(n): {k: _json_safe(v) for k, v in per.items()} for n, per in rows.items()}
            for name, rows in speedup.items()
        },
        "peer_ratio": {str(n): {**p, "ratio": _json_safe(p["ratio"])} for n, p in peer.items()},
        "targets": [
            {k: (_json_safe(v) if k == "value" else v) for k, v in t.items()} for t in targets
        ],
    }
    write_json(folder / "scaling.json", doc)
    _markdown(folder / "scaling.md", doc, runs, counts, speedup, peer, targets, quick)
    _plot(folder / "scaling.png", table, counts, f"{first['dataset']}: time to 1% of E*_s")
    return doc


def _markdown(
    path: Path,
    doc: dict[str, Any],
    runs: dict[int, dict[str, Any]],
    counts: list[int],
    speedup: dict[str, dict[int, dict[str, float | None]]],
    peer: dict[int, dict[str, Any]],
    targets: list[dict[str, Any]],
    quick: bool,
) -> None:
    from benchmarks.report import _pct, _s

    lo = counts[0]
    first = runs[lo]["markdown"].splitlines()
    data = next((line for line in first if line.startswith("Data: ")), None) or (
        f"Data: {doc['dataset']}, n_train = {doc['n_train']}, n_test = {doc['n_test']}, "
        f"d = {doc['dim']}, k = {doc['k']}, seeds = {doc['seeds']}."
    )
    L = [f"# nmbatch thread scaling: {doc['dataset']}\n"]
    if doc["command"]:
        L.append(
            f"Command: `{doc['command']}` (one child process per thread count, "
            f"each writing threads-N/)\n"
        )
    L.append(data + "\n")
    L.append(
        "Times are medians over seeds of the seconds to reach 1% above E*_s, against one "
        "E*_s per seed common to every thread count (the lowest E_V of any run of any "
        "thread count, and of the reference Lloyd runs): "
        + ", ".join(f"{s}: {e:.6g}" for s, e in doc["E_star_per_seed"].items())
        + ".\n"
    )
    L.append("## Time to 1% of E*_s (s) and final E_V/E*_s - 1, by thread count\n")
    head = [f"1% @{n}t | final @{n}t" for n in counts]
    head += [f"speed-up 1% {lo}t->{n}t" for n in counts[1:]]
    L.append(f"| algorithm | {' | '.join(head)} |")
    L.append("|---|" + "---:|" * (2 * len(counts) + len(counts) - 1))
    for name, rows in doc["algorithms"].items():
        cells = []
        for n in counts:
            row = rows.get(str(n))
            cells += (
                ["-", "-"] if row is None else [_s(row["time_to"]["0.01"]), _pct(row["final_rel"])]
            )
        for n in counts[1:]:
            x = speedup[name].get(n, {}).get("0.01")
            cells.append("n/a" if x is None else f"{x:.2f}x")
        L.append(f"| {name} | {' | '.join(cells)} |")
    L.append("")
    L.append(
        f"## Time to each level (s, median over seeds; in brackets the speed-up from "
        f"{lo} thread(s): its time there / this one)\n"
    )
    L.append("| algorithm | threads | 5% | 2% | 1% | 0.5% | final |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for name, rows in doc["algorithms"].items():
        for n, row in rows.items():
            up = speedup[name].get(int(n), {})
            cells = [
                _s(row["time_to"][k])
                + ("" if k not in up else " (n/a)" if up[k] is None else f" ({up[k]:.2f}x)")
                for k in EPS_KEYS
            ]
            L.append(f"| {name} | {n} | {' | '.join(cells)} | {_pct(row['final_rel'])} |")
    L.append("")
    L.append("## nmbatch against the fastest exact peer (its time to 1% / nmbatch's)\n")
    for n in counts:
        L.append(f"- {n} thread(s): {peer[n]['detail']}")
    L.append("")
    L.append(f"## Target check ({counts[-1]} threads against {lo})\n")
    if quick:
        L.append(
            "- Quick mode: a check that the pipeline runs; on data this small its times "
            "say nothing about the targets."
        )
    L += [t["line"] for t in targets]
    L.append("")
    machine = _section(runs[lo]["markdown"], "## Machine and software")
    if machine:
        note = f"(From the {lo}-thread run's results.md; each threads-N/results.md has its own.)"
        L += [machine[0], "", note, *machine[1:]]
    path.write_text("\n".join(L).rstrip("\n") + "\n")


def _plot(
    path: Path, table: dict[str, dict[int, dict[str, Any]]], counts: list[int], title: str
) -> None:
    """Time to 1% of E*_s against the thread count, one line per algorithm, log y."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, ax = plt.subplots(figsize=(7, 5), dpi=100)
    for name, rows in table.items():
        xs = [n for n in counts if n in rows]
        t1 = [rows[n]["time_to"]["0.01"] for n in xs]
        ys = [math.nan if t is None else t for t in t1]
        ax.plot(xs, ys, marker="o", label=name)
    if counts[-1] > counts[0]:
        ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("threads")
    ax.set_ylabel("time to 1% of E*_s (s, median over seeds; gap: never)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
