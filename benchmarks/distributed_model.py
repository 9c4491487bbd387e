"""A cost model of distributed nmbatch on 8-64 nodes, from constants measured on one machine.

The model (:func:`cost_table`), for ``N`` samples of dimension ``d``, ``k`` clusters and
``P`` nodes each holding one shard:

- **Memory per node**: ``N / P`` rows times the bytes a shard holds per row, measured
  (the row, its id and priority, nmbatch's per-row state in the bound mode ``auto``
  picks for ``k`` and ``d``).
- **Bytes per round**: ``P (4kd + 8k)`` out (``C`` float32 and the moves ``p`` float64 to
  each shard) and at most ``P (8kd + 24k)`` back (the clusters a shard changed, their
  ``dS``, ``dv``, ``dQ``): :func:`round_bytes`, whatever the batch size.
- **Time of a round**: ``o + (n_new / P) t_new + (b_old / P) t_rev + P t_merge +
  bytes / B``: ``o`` the measured time of a round outside the slowest shard's step
  (Ray's calls, the coordinator's update; on this machine, one shard), ``t_new`` and
  ``t_rev`` the single-machine seconds per row assigned for the first time and per row
  revisited (a least-squares fit of the measured steps), ``t_merge`` the coordinator's
  measured
  time to take in one shard's deltas, ``B`` the coordinator's network bandwidth
  (assumed, :data:`BANDWIDTH`: 10 Gb/s), plus one network round trip (assumed,
  :data:`LATENCY`).
- **Rounds**: the batch doubles from ``b_0`` to ``N``; each level below the last takes
  the median number of rounds the measured run spent at its levels, the last level the
  number the measured run spent at its own last (convergence). The first round of a
  level assigns the rows that join, the others revisit the level's ``b`` rows. The
  time to 1% sums the levels up to the batch at which the measured run first came
  within 1% of its final energy: on data from the same distribution that batch does not
  grow with ``N``.

It ignores stragglers (a round waits for its slowest shard: binomial imbalance of the
prefix is ``O(sqrt(b / P))`` rows), the tau search (a few tiny round trips per
doubling), relocation round trips (rare after the first levels) and the log's reading.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = [
    "BANDWIDTH",
    "LATENCY",
    "NODES",
    "cost_table",
    "limits",
    "markdown",
    "plot",
    "round_bytes",
]

NODES = (1, 8, 16, 32, 64)
N_MODEL = 10**9
BANDWIDTH = 1.25e9
"""Bytes per second into and out of the coordinator's node (10 Gb/s Ethernet, assumed)."""
LATENCY = 2e-4
"""Seconds of one network round trip between nodes of one data centre (assumed)."""


def round_bytes(P: int, k: int, d: int) -> int:
    """Bytes of one round on ``P`` shards at most: ``(C, p)`` out and ``(j, dS, dv, dQ)``
    back for every cluster (a shard names only the clusters it changed)."""
    return P * (4 * k * d + 8 * k) + P * (8 * k * d + 24 * k)


def _levels(b0: int, n: int) -> list[int]:
    sizes = [b0]
    while sizes[-1] < n:
        sizes.append(min(2 * sizes[-1], n))
    return sizes


def cost_table(
    c: dict[str, Any], n: int = N_MODEL, nodes: tuple[int, ...] = NODES
) -> list[dict[str, Any]]:
    """One row per node count of ``nodes``: memory, bytes, round times, time to 1% and
    to convergence over all ``n`` samples, from the constants ``c``
    (:func:`~benchmarks.distributed.measure_constants`)."""
    k, d, local = int(c["k"]), int(c["d"]), c["local"]
    per_level = {int(b): r for b, r in local["rounds_per_level"].items()}
    sizes = sorted(per_level)
    middle = sorted(per_level[b] for b in sizes[:-1]) or [1]
    r_mid, r_last = middle[len(middle) // 2], per_level[sizes[-1]]
    o = float(c["shards"]["1"]["overhead_per_round"]) if "1" in c["shards"] else 0.0
    t_new, t_rev = float(local["seconds_per_new_row"]), float(local["seconds_per_revisited_row"])
    t_merge = float(c["merge_seconds_per_shard"])
    levels = _levels(sizes[0], n)
    rounds = [r_mid] * (len(levels) - 1) + [r_last]
    target = min(int(local["batch_at_1pc"]), n)
    rows = []
    for P in nodes:
        nbytes = round_bytes(P, k, d) if P > 1 else 0
        fixed = (o + LATENCY + P * t_merge + nbytes / BANDWIDTH) if P > 1 else 0.0
        times = []  # seconds of each level
        for i, (r, b) in enumerate(zip(rounds, levels, strict=True)):
            joined = b - (levels[i - 1] if i else 0)
            first = fixed + math.ceil(joined / P) * t_new + math.ceil((b - joined) / P) * t_rev
            times.append(first + (r - 1) * (fixed + math.ceil(b / P) * t_rev))
        compute = math.ceil(n / P) * t_rev
        rows.append({
            "nodes": P, "n": n, "memory_gib_per_node": n / P * c["shard_bytes_per_row"] / 2**30,
            "bytes_per_round": nbytes, "fixed_seconds_per_round": fixed,
            "round_seconds_full_batch": fixed + compute, "rounds": sum(rounds),
            "levels": len(levels), "seconds_to_converge": sum(times),
            "seconds_to_1pc": sum(t for t, b in zip(times, levels, strict=True) if b <= target),
            "compute_share_full_batch": compute / (fixed + compute),
        })  # fmt: skip
    base = rows[0]["seconds_to_converge"]
    for row in rows:
        row["speedup_to_converge"] = base / row["seconds_to_converge"]
    return rows


def limits(c: dict[str, Any], n: int = N_MODEL) -> dict[str, int]:
    """Where adding nodes stops paying, over ``P = 2^0 .. 2^14``: the ``P`` with the least
    modelled time to converge on ``n`` samples, and the first ``P`` whose full-batch
    round spends less than half its time computing."""
    rows = cost_table(c, n, tuple(2**i for i in range(15)))
    best = min(rows, key=lambda r: r["seconds_to_converge"])["nodes"]
    half = next((r["nodes"] for r in rows if r["compute_share_full_batch"] < 0.5), 0)
    return {"nodes_fastest_to_converge": best, "nodes_compute_below_half": half}


def _fmt(x: float | None, digits: int = 3) -> str:
    return "never" if x is None else f"{x:.{digits}g}"


def markdown(doc: dict[str, Any]) -> str:
    """``distributed.md``: the runs, the constants and the cost model."""
    c, info = doc["constants"], doc["machine"]
    lines = ["# Distributed nmbatch (Ray shard actors) against the single-machine engine", ""]
    lines += [f"Machine: {info.get('cpu', '?')}, {info.get('cores', '?')} cores. Every "
              "shard is a Ray actor on this one machine, its kernels on "
              f"{c['threads']} thread(s), as the single-machine engine's. Commands below "
              "and in each folder's results.md.", ""]
    for ds, run in doc["runs"].items():
        algos = run["algorithms"]
        ref = (algos.get("nmbatch", {}).get("time_to") or {}).get("0.01")
        lines += [f"## {run['dataset']}: n = {run['n_train']}, d = {run['dim']}, "
                  f"k = {run['k']}, seeds {run['seeds']} (`{ds}/results.md`)", "",
                  "| algorithm | 5% | 2% | 1% | 0.5% | 1% vs nmbatch | final | rounds | "
                  "round ms | slowest shard ms | overhead s | bytes/round | setup s |",
                  "|---|" + "---:|" * 12]
        for name, a in algos.items():
            t, notes = a["time_to"], a.get("notes", {})
            ratio = (f"{t['0.01'] / ref:.2f}x" if ref and t.get("0.01") else "-")
            lines.append(
                f"| {name} | " + " | ".join(_fmt(t[key]) for key in ("0.05", "0.02", "0.01",
                                                                      "0.005"))
                + f" | {ratio} | {100 * a['final_rel']:.2f}% | {a['steps']:.0f} | "
                + (f"{1e3 * notes['round_seconds']:.2f} | {1e3 * notes['shard_seconds']:.2f} | "
                   f"{notes['overhead_seconds']:.2f} | {notes['round_bytes']:,.0f} | "
                   f"{notes['setup_seconds']:.2f} |" if "round_seconds" in notes
                   else "- | - | - | - | - |"))
        lines.append("")
    lines += [f"## One round at k = {c['k']}, d = {c['d']} (blobs, n = {c['n']:,})", "",
              f"`{c.get('command', '')}`", "",
              "| P | rounds | bytes per round (min / median / max) | at most "
              "P(4kd+8k) + P(8kd+24k) | overhead per round, ms | same rounds and centroids "
              "as one machine |", "|---:|---:|---|---:|---:|---|"]
    for P, s in c["shards"].items():
        tot = sorted(a + b for a, b in s["round_bytes"])
        lines.append(f"| {P} | {s['rounds']} | {tot[0]:,} / {tot[len(tot) // 2]:,} / "
                     f"{tot[-1]:,} | {s['formula_bytes']:,} | "
                     f"{1e3 * s['overhead_per_round']:.2f} | {s['same_rounds_as_local']} / "
                     f"{s['same_centroids_as_local']} |")
    local = c["local"]
    lines += ["", f"Single machine, same data: {local['steps']} steps, "
              f"{1e6 * local['seconds_per_new_row']:.3f} µs per new row and "
              f"{1e6 * local['seconds_per_revisited_row']:.3f} µs per revisited row "
              f"(least squares over the steps); within 1% of its final energy at batch "
              f"{local['batch_at_1pc']:,} (step {local['steps_to_1pc']}); rounds per batch "
              f"size {local['rounds_per_level']}. The coordinator takes in one shard's "
              f"deltas in {1e6 * c['merge_seconds_per_shard']:.1f} µs; a shard holds "
              f"{c['shard_bytes_per_row']:.0f} bytes per row (bounds: {c['bound_mode']}).",
              "", f"## Cost model: 10^9 samples, d = {c['d']}, k = {c['k']}", "",
              "From the constants above (`benchmarks.distributed_model`: 10 Gb/s "
              "into the coordinator and a 0.2 ms round trip assumed; stragglers, the tau "
              "search and the log's reading ignored). Nodes = 1 is one machine with "
              "the memory for all of it, without Ray.", "",
              "| nodes | memory per node, GiB | bytes per round | fixed s per round | "
              "full-batch round s (compute share) | rounds | to 1%, s | to converge, s | "
              "speed-up |", "|---:|" + "---:|" * 8]
    for r in doc["cost_model"]:
        lines.append(
            f"| {r['nodes']} | {r['memory_gib_per_node']:.1f} | {r['bytes_per_round']:,} | "
            f"{r['fixed_seconds_per_round']:.4f} | {r['round_seconds_full_batch']:.3f} "
            f"({100 * r['compute_share_full_batch']:.0f}%) | {r['rounds']} | "
            f"{r['seconds_to_1pc']:.2f} | {r['seconds_to_converge']:.1f} | "
            f"{r['speedup_to_converge']:.1f}x |")
    lim = doc["limits"]
    lines += ["", f"Where it stops scaling (same model, P = 1 .. 16,384): the time to converge "
              f"on all 10^9 samples is least at {lim['nodes_fastest_to_converge']:,} nodes; a "
              f"full-batch round spends less than half its time computing from "
              f"{lim['nodes_compute_below_half']:,} nodes on (the coordinator's serial merge, "
              "P k d, and its network share grow with P while each shard's rows shrink). "
              "The time to 1% does not shrink with nodes at all: it is spent at small "
              "batches (the 1% level is reached at the batch above, whatever N), where every "
              "round is the fixed cost. A cluster is for holding and converging on data one "
              "machine cannot hold, not for reaching 1% sooner."]
    return "\n".join(lines) + "\n"


def plot(path: Path, doc: dict[str, Any]) -> None:
    """Time to 1% per data set and shard count; modelled time to converge by nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (ds, run) in enumerate(doc["runs"].items()):
        names = list(run["algorithms"])
        values = [run["algorithms"][n]["time_to"].get("0.01") or 0.0 for n in names]
        xs = [i * (len(names) + 1) + j for j in range(len(names))]
        a.bar(xs, values, color=[f"C{j}" for j in range(len(names))])
        for x, n in zip(xs, names, strict=True):
            a.text(x, 0, f"{ds}\n{n}" if n == names[0] else n, rotation=90, va="bottom",
                   ha="center", fontsize=7)
    a.set_ylabel("seconds to 1% of E*_s (median)")
    a.set_xticks([])
    a.set_title("this machine: nmbatch vs ray.P")
    rows = doc["cost_model"]
    b.plot([r["nodes"] for r in rows], [r["seconds_to_converge"] for r in rows], "o-",
           label="to converge on all 10^9")
    b.plot([r["nodes"] for r in rows], [r["seconds_to_1pc"] for r in rows], "s-",
           label="to 1%")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("nodes")
    b.set_ylabel("seconds (model)")
    b.set_title("cost model, d = 128, k = 100")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
