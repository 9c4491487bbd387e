"""Writing the benchmark's outputs: results.json, results.md, curves.png, curves.json.

``results.json`` has exactly the schema of the issue (see :func:`results_json`); anything
else (per-seed curves, notes, the rho study, extra labelled runs) goes to other files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.peers import PEERS
from benchmarks.protocol import (
    EPS_KEYS,
    EPSILONS,
    Curve,
    median_or_none,
    time_to,
    value_at,
)
from nmbatch.engine.algorithms import ALGORITHMS

__all__ = [
    "RESULT_NAMES",
    "plot_curves",
    "results_json",
    "target_check",
    "write_json",
]

# The algorithm names results.json may contain, in table order: ours, then the peers.
# nmbatch.strict: nmbatch with the paper's doubling test; nmbatch.swap: with cluster swaps
# (bench only, .ours.VARIANTS).
RESULT_NAMES = (*ALGORITHMS, "nmbatch.strict", "nmbatch.swap", "nmbatch.noswap", *PEERS)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")


def results_json(
    *, dataset: str, n_train: int, n_test: int, dim: int, k: int, threads: int,
    seeds: list[int], estar: dict[int, float], summary: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The exact results.json document (medians over seeds, relative to ``E*_s``)."""
    return {
        "dataset": dataset,
        "n_train": int(n_train),
        "n_test": int(n_test),
        "dim": int(dim),
        "k": int(k),
        "threads": int(threads),
        "seeds": [int(s) for s in seeds],
        "E_star": float(min(estar[s] for s in seeds)),
        "E_star_per_seed": [float(estar[s]) for s in seeds],
        "algorithms": {
            name: {
                "time_to": {key: summary[name]["time_to"][key] for key in EPS_KEYS},
                "final_rel": float(summary[name]["final_rel"]),
            }
            for name in RESULT_NAMES
            if name in summary
        },
    }


# -- target check -------------------------------------------------------------------------


def _fmt_ratio(a: float | None, b: float | None) -> tuple[float | None, str]:
    """``b / a`` as a ratio of times (how many times sooner ``a`` is than ``b``)."""
    if a is None:
        return None, "nmbatch never reached"
    if b is None:
        return math.inf, "peer never reached"
    return b / a, f"{b / a:.2f}x"


def target_check(summary: dict[str, dict[str, Any]]) -> list[str]:
    """The lead's three targets, each as one markdown bullet: met / not met with ratios."""
    lines: list[str] = []
    if "nmbatch" not in summary:
        return ["- nmbatch was not run: no target can be checked."]
    ours = summary["nmbatch"]["time_to"]
    exact = [n for n in ("sklearn.lloyd", "sklearn.elkan", "faiss") if n in summary]
    if exact:
        peer_times = [summary[n]["time_to"]["0.01"] for n in exact]
        finite = [t for t in peer_times if t is not None]
        best = min(finite) if finite else None
        ratio, text = _fmt_ratio(ours["0.01"], best)
        ok = ratio is not None and ratio >= 3.0
        who = exact[peer_times.index(best)] if best is not None else "none"
        lines.append(
            f"- nmbatch reaches 1% of E*_s 3x sooner than the fastest of "
            f"{', '.join(exact)} (fastest: {who}): **{'met' if ok else 'not met'}** ({text})"
        )
    mbs = [n for n in ("sklearn.minibatch.5000", "sklearn.minibatch.1024") if n in summary]
    if mbs:
        parts, ok_all = [], True
        for n in mbs:
            for key in EPS_KEYS:
                ratio, text = _fmt_ratio(ours[key], summary[n]["time_to"][key])
                ok = ratio is not None and ratio > 1.0
                ok_all &= ok
                parts.append(f"{n} @{float(key):.1%}: {text}")
        lines.append(
            f"- nmbatch sooner than sklearn minibatch at every level: "
            f"**{'met' if ok_all else 'not met'}** ({'; '.join(parts)})"
        )
    if "nmbatch.deact" in summary:
        ratio, text = _fmt_ratio(ours["0.01"], summary["nmbatch.deact"]["time_to"]["0.01"])
        ok = ratio is not None and ratio >= 1.5
        lines.append(
            f"- nmbatch reaches 1% 1.5x sooner than nmbatch.deact: "
            f"**{'met' if ok else 'not met'}** ({text})"
        )
    return lines


# -- plots --------------------------------------------------------------------------------

FLOOR = 1e-5


def _rel_on_grid(curve: Curve, estar: float, grid: np.ndarray) -> np.ndarray:
    """``E_V/E*_s - 1`` of ``curve`` at each time of ``grid`` (inf before its first
    evaluation, its final value after its end)."""
    return np.array([value_at(curve, t) / estar - 1.0 for t in grid])


def plot_curves(
    path: Path, curves: dict[int, dict[str, Curve]], estar: dict[int, float],
    names: list[str], title: str,
) -> None:
    """``E_V/E*_s - 1`` against time, both on log axes: thin lines per seed, a thick
    line for the median over seeds (drawn where more than half the seeds have started)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    cmap = plt.get_cmap("tab20")
    seeds = sorted(curves)
    all_t = [t for s in seeds for c in curves[s].values() for t in c.seconds if t > 0]
    if not all_t:
        plt.close(fig)
        return
    lo, hi = min(all_t), max(all_t)
    for i, name in enumerate(names):
        runs = [(s, curves[s][name]) for s in seeds if name in curves[s]]
        runs = [(s, c) for s, c in runs if c.seconds]
        if not runs:
            continue
        color = cmap(i % 20)
        end = max(c.total_seconds for _, c in runs)
        grid = np.geomspace(lo, max(end, lo * 1.0001), 300)
        rel = np.vstack([_rel_on_grid(c, estar[s], grid) for s, c in runs])
        if len(runs) > 1:
            for row in rel:
                ax.plot(grid, np.clip(row, FLOOR, None), color=color, lw=0.5, alpha=0.35)
        med = np.median(rel, axis=0)
        ok = np.isfinite(med)
        ax.plot(grid[ok], np.clip(med[ok], FLOOR, None), color=color, lw=2.0, label=name)
    for eps in EPSILONS:
        ax.axhline(eps, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("algorithm time (s), validation time excluded")
    ax.set_ylabel(f"E_V / E*_s - 1   (median over seeds; values < {FLOOR:g} drawn at it)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def rel_at_median(
    curves: dict[int, dict[str, Curve]], estar: dict[int, float], name: str, t: float
) -> float | None:
    """Median over seeds of ``E_V/E*_s - 1`` at time ``t`` (inf before the first point)."""
    vals = [value_at(curves[s][name], t) / estar[s] - 1.0 for s in curves if name in curves[s]]
    return median_or_none(vals)


def time_to_median(
    curves: dict[int, dict[str, Curve]], estar: dict[int, float], name: str, eps: float
) -> float | None:
    vals = [time_to(curves[s][name], (1 + eps) * estar[s]) for s in curves if name in curves[s]]
    return median_or_none(vals)


# -- tables -------------------------------------------------------------------------------


def summarize_all(
    curves: dict[int, dict[str, Curve]], estar: dict[int, float]
) -> dict[str, dict[str, Any]]:
    """:func:`~benchmarks.protocol.summarize` over every name run in any seed."""
    from benchmarks.protocol import summarize

    names: list[str] = []
    for per in curves.values():
        names += [n for n in per if n not in names]
    return summarize(curves, estar, names)


def rho_study(
    curves: dict[int, dict[str, Curve]], estar: dict[int, float], labels: list[str],
    slices: list[float],
) -> dict[str, dict[str, Any]]:
    """Per ``"<variant> rho=<r>"``: medians of time to each level, final ``E_V/E*_s - 1``
    and ``E_V/E*_s - 1`` at the time slices (as the paper's Figure 2)."""
    summary = summarize_all(curves, estar)
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        if label not in summary:
            continue
        variant, rho = label.split(" rho=")
        out[label] = {
            "variant": variant,
            "rho": float(rho),
            "time_to": summary[label]["time_to"],
            "final_rel": summary[label]["final_rel"],
            "rel_at": {f"{t:g}": rel_at_median(curves, estar, label, t) for t in slices},
        }
    return out


def _s(x: float | None) -> str:
    if x is None:
        return "never"
    return f"{x:.3g}" if x < 10 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


METHOD = """\
- Protocol (paper, Results): for each seed `s` the training set is shuffled with
  `numpy.random.default_rng(s)` and its first `k` rows are the initial centroids of every
  algorithm. `E_V` is the mean squared distance of the validation samples to their nearest
  centroid (`engine.energy`, float64 sums), computed outside every algorithm's clock.
  `E*_s` is the lowest `E_V` any run from seed `s` reached at any evaluation (the rho
  study's runs and an exact Lloyd run to its fixed point included); the table gives, per
  algorithm, the median over seeds of the first time `E_V <= (1+eps) E*_s` ("never"
  counts as infinite; the median is "never" when infinite) and of the final
  `E_V / E*_s - 1`. The global `E*` (lowest over seeds) is reported but not used.
- `E_V` is evaluated after each of the first 20 iterations, after the last one, and
  otherwise whenever the algorithm's own time has grown by `--eval-grid` (a fraction)
  since the last evaluation, so a time-to-target is exact to that fraction of itself
  (fast mini-batch steps would otherwise spend the run evaluating). A transient dip below
  a target between two evaluations can be missed.
- The order of the algorithms is rotated from seed to seed. Before the first seed, glibc
  is told to keep freed memory in the process (`mallopt`; `--no-keep-memory` to skip) and
  some memory is written once (`--prefault-gb`): on a VM the first touch of a page the
  host has not backed, or took back after a free, costs about 1 s per GB and would hit
  whichever fit allocates large arrays first (a scikit-learn fit took 0.9 s instead of
  0.15 s right after a mini-batch run). Then numba compiles our kernels on a
  small problem (its time is the JIT line, excluded), then
  every algorithm, ours and the peers alike, runs untimed on the real data for at most 3
  iterations (`--warmup` seconds) to warm BLAS, OpenMP pools and the allocator.
- Every run stops when it converges, after `--budget` seconds of its own time, or after
  `--max-iter` iterations.
- Ours (`nmbatch`, `nmbatch.deact`, `mbatch`, `mbatch.remove`, `lloyd`, `elkan`):
  the shuffled training set is appended to a fresh `NestedBatchStore` (not timed: the
  data's input format, like the in-memory array for the peers; its time is the store-load
  line), `engine.make_algorithm(name, store, k, init=C0, rho, batch_size)` is built inside
  the first timed step, and each `algo.step()` is timed. Convergence: `step().converged`
  (a fixed point over all samples; the mini-batch ones never converge).
- `sklearn.minibatch.<b>`: `MiniBatchKMeans(batch_size=b, init=C0, n_init=1,
  compute_labels=False)` driven by `partial_fit` on `b` rows drawn uniformly with
  replacement (as its `fit` draws them); the draw, the gather copy and each call (with its
  input validation) are timed. `compute_labels=False` favours it.
- `sklearn.lloyd` / `sklearn.elkan`: one ordinary `KMeans(init=C0, n_init=1,
  algorithm=..., tol=1e-4).fit(X)` per seed, whole fit timed from the estimator's
  construction; a thin wrapper around scikit-learn's per-iteration kernel records the
  time and a copy of the centres after each iteration (so Elkan keeps its bounds across
  iterations, and no iteration is repeated). The extra E-step and inertia that `fit`
  does after the last iteration are not in any sampled time. (Calling `fit` with
  `max_iter=1` repeatedly would redo that extra E-step, the centring copy and Elkan's
  bound initialisation every iteration: 2-3x too slow, hence not used.)
- `faiss`: `faiss.Kmeans` with subsampling off (`max_points_per_centroid >= n`), sampled by
  a chain of `train(X, init_centroids=C)` calls with `niter=1`, each from the previous
  centroids and each timed in full (faiss's iterations carry no state, so the chain is one
  run; its small per-call overhead is counted; the input NaN scan runs in the first call
  only, as in one run). Stops at a fixed point.
- `faiss.subsampled`: faiss's defaults (256 points per centroid, `niter=25`): for
  `i = 1..25` a fresh run with `niter=i` from `C0`, each timed in full; point `i` of the
  curve is (time of run `i`, its centroids); as run `i` is a prefix of run `j > i`, a
  point's time is lowered to the least time of runs `i..25` when noise made it slower.
- `*.blasfixed` (with `--faiss-blas-fixed`): the same faiss runs in a subprocess whose
  environment sets `OPENBLAS_CORETYPE`, as faiss-cpu's bundled OpenBLAS may mis-detect
  the CPU; shown for information, not in results.json.
- Threads: `threadpoolctl.threadpool_limits(limits=threads)` on every loaded BLAS and
  OpenMP library, `numba.set_num_threads`, `faiss.omp_set_num_threads`; the untimed
  reference Lloyd run uses all cores.
"""


def write_markdown(
    path: Path, *, dataset: Any, args: dict[str, Any], command: str, info: dict[str, Any],
    extra_blas: list[dict[str, Any]], summary: dict[str, dict[str, Any]], names: list[str],
    estar: dict[int, float], seeds: list[int], references: dict[int, dict[str, Any]],
    rho_table: dict[str, dict[str, Any]] | None, timings: dict[str, float | None],
    ours: list[str],
) -> None:
    """results.md: the table, the machine, BLAS, threads, versions, command, JIT line,
    target check, method notes and (optionally) the rho study."""
    L: list[str] = []
    L.append(f"# nmbatch benchmark: {dataset.name}\n")
    L.append(f"Command: `{command}`\n")
    L.append(
        f"Data: {dataset.description}. n_train = {dataset.train.shape[0]}, n_test = "
        f"{dataset.test.shape[0]}, d = {dataset.dim}. k = {args['k']}, initial batch "
        f"(nmbatch) / batch (mbatch) = {args['batch_size']}, rho = {args['rho']:g}, "
        f"seeds = {seeds}, budget = {args['budget']:g} s and {args['max_iter']} iterations "
        f"per algorithm and seed, eval grid = {args['eval_grid']:g}.\n"
    )
    L.append("## Time to reach (1+eps) E*_s (seconds, median over seeds)\n")
    L.append("| algorithm | 5% | 2% | 1% | 0.5% | final E_V/E*_s - 1 |")
    L.append("|---|---:|---:|---:|---:|---:|")
    for name in names:
        row = summary[name]
        cells = [_s(row["time_to"][k]) for k in EPS_KEYS]
        L.append(f"| {name} | {' | '.join(cells)} | {_pct(row['final_rel'])} |")
    L.append("")
    L.append(
        f"E* (lowest over all seeds) = {min(estar.values()):.6g}; E*_s per seed: "
        + ", ".join(f"{s}: {estar[s]:.6g}" for s in seeds)
        + ". Exact Lloyd to its fixed point, per seed: "
        + "; ".join(
            f"{s}: {references[s]['energy']:.6g} after {references[s]['iterations']} "
            f"iterations ({references[s]['source']})" for s in seeds
        ) + ".\n"
    )
    L.append("## Target check\n")
    if args.get("quick"):
        L.append("- Quick mode: a check that the pipeline runs; on data this small its times "
                 "say nothing about the targets.")
    L += target_check(summary)
    load = timings.get("store_load")
    exact = [n for n in ("sklearn.lloyd", "sklearn.elkan", "faiss") if n in summary]
    ours_1 = summary.get("nmbatch", {}).get("time_to", {}).get("0.01")
    best = [summary[n]["time_to"]["0.01"] for n in exact]
    best = [b for b in best if b is not None]
    if load is not None and ours_1 is not None and best:
        L.append(f"- (Our times exclude loading the store, {load:.3f} s a run; counting it, "
                 f"nmbatch's 1% ratio to the fastest exact peer would be "
                 f"{min(best) / (ours_1 + load):.2f}x.)")
    L.append("")
    if rho_table:
        L.append("## rho study (nmbatch with bounds on, nmbatch.deact with bounds off)\n")
        slices = list(next(iter(rho_table.values()))["rel_at"])
        head = " | ".join(f"E_V/E*_s-1 at {t} s" for t in slices)
        L.append(f"| run | 5% | 2% | 1% | 0.5% | final | {head} |")
        L.append("|---|---:|---:|---:|---:|---:|" + "---:|" * len(slices))
        for label, row in rho_table.items():
            cells = [_s(row["time_to"][k]) for k in EPS_KEYS]
            at = [_pct(row["rel_at"][t]) for t in slices]
            L.append(f"| {label} | {' | '.join(cells)} | {_pct(row['final_rel'])} | "
                     f"{' | '.join(at)} |")
        L.append("")
    L.append("## Machine and software\n")
    L.append(f"- CPU: {info['cpu']} ({info['simd']}); {info['cores']} cores, "
             f"{info['cores_available']} available to this process")
    L.append(f"- Threads: {args['threads']} (BLAS, OpenMP, numba, faiss); numba threading "
             f"layer: {info['numba_threading_layer']}")
    t = timings
    L.append(f"- 1-minute load average at the start / end of the run: {t['load_start']:.2f} / "
             f"{t['load_end']:.2f} (the benchmark itself accounts for about 1; more means "
             f"other processes competed for the {info['cores_available']} cores and times "
             f"are inflated)")
    v = info["versions"]
    L.append(f"- Python {info['python']}, " + ", ".join(f"{k} {x}" for k, x in v.items()))
    L.append("- BLAS and OpenMP libraries loaded (threadpoolctl):")
    for lib in info["blas"]:
        L.append(f"  - {lib['library']}: {lib['internal_api']} {lib['version'] or ''}, "
                 f"architecture {lib['architecture'] or 'n/a'}, "
                 f"threading {lib['threading_layer'] or 'n/a'}, "
                 f"{lib['num_threads']} thread(s)")
    for lib in extra_blas:
        L.append(f"  - faiss subprocess (OPENBLAS_CORETYPE={args['faiss_coretype']}): "
                 f"{lib['library']} {lib['version']}, architecture {lib['architecture']}")
    L.append("- numpy's BLAS runs our algorithms and scikit-learn; faiss uses its own "
             "bundled OpenBLAS (the libopenblas line above).")
    t = timings
    L.append(f"- JIT: compiling and first runs of our algorithms ({', '.join(ours)}) "
             f"on a 2,000-sample problem took {t['jit']:.2f} s before timing started "
             f"(numba's on-disk cache may have been warm); importing and limiting the "
             f"libraries took {t['imports']:.2f} s; the untimed warm-up of every algorithm "
             f"{t['warmup']:.2f} s. None of this is in any time above.")
    if t["store_load"] is not None:
        L.append(f"- Store load (appending the shuffled training set to a NestedBatchStore, "
                 f"median per run, not in our times): {t['store_load']:.3f} s")
    L.append(f"- Memory: {t['prefault_gb']:g} GiB touched once before timing "
             f"({t['prefault']:.2f} s); glibc told to keep freed memory in the process "
             f"(mallopt): {'yes' if t['keep_memory'] else 'no'}. On a VM the first touch of a "
             f"page the host has not backed (or has taken back after a free) is slow, and "
             f"would otherwise hit whichever algorithm allocates first.")
    L.append(f"- Data preparation: {t['data']:.1f} s\n")
    L.append("## Method\n")
    L.append(METHOD)
    path.write_text("\n".join(L) + "\n")
