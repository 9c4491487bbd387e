"""The report of :mod:`.phases`: ``phases.md`` (tables of seconds per phase, parallel
fractions, projections, bandwidth) and ``phases.png`` (stacked bars per thread count)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peak import peak_table

__all__ = ["markdown", "plot"]


def _f(x: float | None, fmt: str = ".4f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table, the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _peak_lines(doc: dict[str, Any], ts: list[str]) -> list[str]:
    """The section on the fraction of the machine's peak (:mod:`.peak`)."""
    peak = doc["peak"]
    L = ["\n## Fraction of the machine's peak\n"]
    shape = ", ".join(f"{peak[n]['gflops']:.1f} GFLOP/s at {n}t" for n in ts)
    L.append(
        f"Peak: numpy's float32 GEMM ({peak[ts[0]]['rows']}, {doc['dim']}) @ ({doc['dim']}, "
        f"{doc['k']}), BLAS on the thread count, best of 5: {shape}. A dense phase's "
        "fraction: the seconds that GEMM needs for the phase's pairs (2 d flops each) over "
        "the phase's seconds (the kernel after a product: the share of a peak product's "
        "time it adds). The fit: one exact pass at the peak over each step's batch "
        "(b k pairs; a Lloyd iteration's least cost on the same batches) over the step "
        "time.\n"
    )
    rows = [[name, f"{row['pairs'] / 1e6:.1f}", *(f"{_f(row.get(n), '.0%')}" for n in ts)]
            for name, row in peak_table(doc).items()]  # fmt: skip
    fit = [f"{doc['lloyd_at_peak'][n] / doc['total']['seconds'][n]:.0%}"
           if doc["total"]["seconds"][n] else "n/a" for n in ts]  # fmt: skip
    rows.append(["**fit: Lloyd at the peak / step time**", "", *fit])
    return L + _table(["phase", "M pairs", *(f"{n}t of peak" for n in ts)], rows)


def markdown(doc: dict[str, Any]) -> str:
    """phases.md: the phase table, the total, the bandwidth, the peers, the machine."""
    ts, targets, tot = [str(n) for n in doc["threads"]], doc["project_to"], doc["total"]
    same = "**yes**" if doc["identical"] else f"**NO** (max |diff| {doc['max_abs_diff']:g})"
    used = ", ".join(f"{n}: {doc['numba_threads'][n]} / {doc['blas_threads'][n]}" for n in ts)
    L = [f"# nmbatch phases by thread count: {doc['dataset']}\n"]
    L.append(f"Command: `{doc['command']}`\n")
    L.append(
        f"Data: {doc['description']}; n = {doc['n_train']}, d = {doc['dim']}, k = {doc['k']}, "
        f"bounds {doc['bound_mode']}. One nmbatch fit per thread count, each in its own "
        f"process: {doc['n_steps'][ts[0]]} steps (at {ts[0]} thread(s) it stopped: "
        f"{doc['stop']}; the others ran as many), final batch {doc['final_batch_size']}, "
        f"{doc['n_distances']} distances. Final centroids bit-identical across thread counts: "
        f"{same}. Threads used (numba / BLAS): {used}.\n"
    )
    load = ", ".join(f"{a:.2f} / {b:.2f} at {n}t" for n, (a, b) in doc["load"].items())
    L.append(
        f"1-minute load average at the start / end of each child: {load} (above its thread "
        "count: other processes shared the cores, its times are inflated).\n"
    )
    L.append("## Seconds per phase (exclusive), share, parallel fraction f, projection\n")
    L.append(
        "f: Amdahl's t(p) = t1 ((1 - f) + f / p) fitted to the thread counts measured; the "
        "projections assume the same f. The total is the sum of the phases, projected phase "
        "by phase.\n"
    )
    head = ["phase", *(f"{n}t s" for n in ts), *(f"share {n}t" for n in ts), "f"]
    total = {"seconds": tot["phase_sum"], "share": dict.fromkeys(ts, 1.0), "f": tot["f"]}
    total["projected"] = tot["projected_from_phases"]
    rows = []
    for name, ph in [*doc["phases"].items(), ("**total**", total)]:
        row = [name, *(_f(ph["seconds"][n]) for n in ts), *(f"{ph['share'][n]:.1%}" for n in ts)]
        rows.append([*row, _f(ph["f"], ".2f"), *(_f(ph["projected"][str(p)]) for p in targets)])
    L += _table([*head, *(f"{p} cores s" for p in targets)], rows)
    measured = ", ".join(f"{_f(tot['seconds'][n])} s at {n}t" for n in ts)
    alone = ", ".join(f"{_f(tot['projected'][str(p)])} s at {p}" for p in targets)
    L.append(f"\nStep time measured around step(): {measured}. The total fitted alone: "
             f"f = {_f(tot['f'], '.2f')}, {alone}.\n")  # fmt: skip
    L.append("## Memory bandwidth\n")
    L.append(
        "numba prange over a float32 array, best of 5, GB/s (1e9 bytes): a sum (bytes read) "
        "and a copy (bytes read + written).\n"
    )
    bw = doc["bandwidth"]
    cells = [[n, f"{b['gib']:.2f}", f"{b['sum_gbps']:.1f}", f"{b['copy_gbps']:.1f}"]
             for n, b in bw.items()]  # fmt: skip
    L += _table(["threads", "GiB", "sum GB/s", "copy GB/s"], cells)
    L.append(
        "\nBytes each phase moved, counted from its arguments (bound sweep: labels, upper and "
        "lower bounds read and written; settle, reassign: the rows read, their bounds read and "
        "written; BLAS product: rows read, products written; assign kernel: rows and products "
        "read, bounds written), over its time; in brackets, the share of the copy bandwidth "
        "at that thread count (data that fit in the caches can pass it, and so can an in-place "
        "update such as the sweep: a copy also reads the lines it writes).\n"
    )
    rows = []
    for name, ph in doc["phases"].items():
        if ph["gbps"]:
            share = {n: g and 100 * g / bw[n]["copy_gbps"] for n, g in ph["gbps"].items()}
            cells = [f"{_f(ph['gbps'][n], '.2f')} ({_f(share[n], '.0f')}%)" for n in ts]
            rows.append([name, f"{ph['bytes'] / 1e9:.3f}", *cells])
    L += _table(["phase", "GB", *(f"{n}t GB/s" for n in ts)], rows)
    L += _peak_lines(doc, ts)
    if doc["peers"]:
        L.append("\n## Peers (--peers), projected alike\n")
        L.append(
            "Their times are those of the file (the bench's scaling.json: time to 1% of E*_s), "
            "not one fit's: compare like with like.\n"
        )
        rows = []
        for name, pe in doc["peers"].items():
            meas = ", ".join(f"{t:.3f} s @{n}t" for n, t in pe["seconds"].items())
            proj = [_f(pe["projected"][str(p)], ".3f") for p in targets]
            rows.append([name, meas, _f(pe["f"], ".2f"), *proj])
        L += _table(["algorithm", "measured", "f", *(f"{p} cores s" for p in targets)], rows)
    m = doc["machine"]
    libs = "; ".join(f"{b['library']} ({b['internal_api']} {b['version']})" for b in m["blas"])
    L.append(f"\n## Machine\n\n- CPU: {m['cpu']} ({m['simd']}), {m['cores']} cores, "
             f"{m['cores_available']} available\n- {m['versions']}; numba threading layer "
             f"{m['numba_threading_layer']}\n- BLAS/OpenMP: {libs}")  # fmt: skip
    return "\n".join(L) + "\n"


def plot(path: Path, doc: dict[str, Any]) -> None:
    """phases.png: stacked phase seconds per thread count measured, then projected."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [(str(n), "seconds", str(n)) for n in doc["threads"]]
    cols += [(str(p), "projected", f"{p}\n(proj.)") for p in doc["project_to"]]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    bottom = np.zeros(len(cols))
    for name, ph in doc["phases"].items():
        h = np.array([ph[key][n] or 0.0 for n, key, _ in cols])
        ax.bar(range(len(cols)), h, bottom=bottom, label=name)
        bottom += h
    ax.set_xticks(range(len(cols)), [c[2] for c in cols])
    ax.set(xlabel="threads", ylabel="seconds (one fit)", title=f"nmbatch phases: {doc['dataset']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- command line -------------------------------------------------------------------------
