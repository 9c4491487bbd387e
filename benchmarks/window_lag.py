"""How far behind the newest data nmbatch stays with a sliding window under live ingestion.

The engine alone (no HTTP, no Redis): a :class:`~nmbatch.engine.NestedBatchStore`, nmbatch
on it and :class:`~nmbatch.engine.retention.WindowRetention` (``W`` samples). Samples of a
Gaussian mixture (``--drift``: its means move by that many noise deviations per window)
come at ``R`` per second in log entries of ``E`` rows (default: the service's, a
``CHUNK_BYTES`` payload): entry ``e`` of the timed stream (rows ``[eE, (e+1)E)``) arrives,
and can be read, when its last row has come, at ``(e + 1) E / R``; its samples arrive
with it. The first ``W`` samples (entries arrived before time 0) are fed at once and
nmbatch runs on them until converged (or ``--warm-seconds``); then, for ``--duration``
seconds, the loop of the service's worker: feed every complete entry that has arrived, one
:func:`~nmbatch.engine.hosting.feed` per entry (retire, then append), one ``step()``,
publish. Nothing else runs (were the model converged on all it holds, the worker would
wait for the next entry, as the service does). nmbatch is made as the service makes it
(``init="k-means++"``, ``rho=100``, ``--batch-size``, default 5000).

Modes: ``engine``, the engine as it is (a retirement shrinks ``b`` by the prefix rows it
retires; ``step()`` grows ``b`` only when the doubling test passes); ``top-up``, an
experiment on a candidate rule, carried out by this tool and not by the engine: when the
prefix held every stored sample before a feed, the prefix is grown to all of them again
before the step (``store.grow_batch(N)``; the step assigns the rows that join).

The clock is the wall clock paused while the tool generates data or measures lag, so it
counts only the engine's work. At each publication (time ``P``):

- ``lag_s``: ``P`` minus the arrival time of the newest sample in the prefix ``[0, b)``
  (the samples the published centroids describe);
- ``behind``: samples arrived by ``P`` but not in the prefix (``arrived - retired - b``);
  ``lag_it``: ``behind`` over the samples that came during that iteration (``R`` times
  the time since the previous publication): about 1 means "the model holds all but what
  came while this very iteration ran".

BLAS and numba run on ``--threads`` threads (default 1: the worker's default,
``NMBATCH_WORKER_THREADS`` = cores - 1 on this 2-core machine). Writes ``results.json``,
``results.md`` and ``lag.png`` into ``--out``. Usage (from a checkout)::

    python -m benchmarks.window_lag --out docs/bench/window --k 16 100 --duration 60
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from benchmarks.machine import machine_info
from nmbatch.engine import NestedBatchStore, make_algorithm
from nmbatch.engine.hosting import feed
from nmbatch.engine.retention import WindowRetention
from nmbatch.service.storage.codec import CHUNK_BYTES

__all__ = ["COLUMNS", "Clock", "MixtureStream", "dump", "lag_at", "main", "run", "summarise"]


class Clock:
    """Seconds since start of the wall clock, not counting the time spent in :meth:`paused`."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._paused = 0.0

    def now(self) -> float:
        return time.perf_counter() - self._t0 - self._paused

    @contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - t


class MixtureStream:
    """Sample ``j``: ``mean[c] + noise`` with ``c`` uniform of ``n_true`` clusters, means
    ``N(0, 4^2)`` per coordinate moving ``drift`` noise deviations per ``window`` samples
    along a fixed random direction each, noise ``N(0, 1)``; rows ``(m, d)`` float32."""

    def __init__(self, d: int, n_true: int, window: int, drift: float, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self.means = self._rng.normal(0.0, 4.0, (n_true, d)).astype(np.float32)
        way = self._rng.normal(size=(n_true, d)).astype(np.float32)
        self.way = way / np.linalg.norm(way, axis=1, keepdims=True) * (drift / window)

    def rows(self, start: int, m: int) -> np.ndarray:
        """Rows ``[start, start + m)`` of the stream (the means at ``start``)."""
        X = self._rng.standard_normal((m, self.means.shape[1]), dtype=np.float32)
        c = self._rng.integers(0, self.means.shape[0], m)
        X += self.means[c] + np.float32(start) * self.way[c]
        return X


def lag_at(publish: float, b: int, n_retired: int, newest: int, cfg: dict, cycle: float) -> dict:
    """Lag of the model published at ``publish`` (s) whose prefix holds ``b`` samples, the
    newest with stream id ``newest``, when the ``n_retired`` ids below the window have left
    and the previous model was published ``cycle`` s before. ``cfg``: ``window``, ``rate``
    and ``entry`` (module docstring). Returns ``lag_s``, ``behind`` (samples), ``lag_it``."""
    W, R, E = cfg["window"], cfg["rate"], cfg["entry"]
    arrived = W + int(publish * R) // E * E  # ids [0, arrived) have arrived
    behind = max(arrived - n_retired - b, 0)
    came = ((newest - W) // E + 1) * E / R  # when the entry of id `newest` arrived
    lag_it = behind / (R * cycle) if cycle > 0 else float("inf")
    return {"lag_s": publish - came, "behind": behind, "lag_it": lag_it}


COLUMNS = ("t", "rows", "feed_s", "step_s", "b", "N", "backlog", "lag_s", "behind", "lag_it")


def run(cfg: dict, k: int, mode: str) -> dict:
    """One run of ``k`` clusters in ``mode`` ("engine" or "top-up"). ``cfg``: ``window``,
    ``d``, ``rate``, ``duration``, ``entry``, ``drift``, ``batch_size``, ``seed``,
    ``warm_seconds``. Returns the settings, the warm-up, the memory and per-iteration
    columns (:data:`COLUMNS`, times in seconds of the paused clock)."""
    W, R, E = cfg["window"], cfg["rate"], cfg["entry"]
    stream = MixtureStream(cfg["d"], k, W, cfg["drift"], cfg["seed"])
    store = NestedBatchStore(cfg["d"], seed=cfg["seed"])
    algo = make_algorithm("nmbatch", store, k, init="k-means++", batch_size=cfg["batch_size"],
                          rho=100, random_state=cfg["seed"],
                          swap=cfg.get("swap", True))  # fmt: skip
    policy = WindowRetention(W)
    t = time.perf_counter()
    for start in range(0, W, 1 << 18):
        feed(policy, algo, stream.rows(start, min(1 << 18, W - start)))
    warm = {"fill_s": time.perf_counter() - t, "iterations": 0}
    t = time.perf_counter()
    while time.perf_counter() - t < cfg["warm_seconds"] and not algo.converged:
        stats = algo.step()
        warm["iterations"] += 1
        if stats.batch_size == stats.n_samples and stats.n_changed == 0:
            break  # every sample in the batch, no label changed
    warm.update(seconds=time.perf_counter() - t, b=algo.batch_size, converged=algo.converged)
    cols: dict[str, list] = {name: [] for name in COLUMNS}
    clock, fed, last = Clock(), 0, 0.0
    while (now := clock.now()) < cfg["duration"]:
        ready = int(now * R) // E * E  # rows of the entries arrived
        if ready == fed and algo.converged and store.n_samples == algo.batch_size:
            time.sleep(max((fed + E) / R - now, 0.0))  # idle until the next entry
            continue
        with clock.paused():
            X = stream.rows(W + fed, ready - fed)
        t0 = time.perf_counter()
        held_all = store.n_samples == algo.batch_size
        for s in range(0, ready - fed, E):
            feed(policy, algo, X[s : s + E])
        if mode == "top-up" and held_all:
            store.grow_batch(store.n_samples)  # the step assigns the rows that join
        t1 = time.perf_counter()
        algo.step()
        t2 = time.perf_counter()
        publish = clock.now()
        with clock.paused():
            b, n = algo.batch_size, store.n_samples
            newest = store.n_ingested - 1 if b == n else int(store.ids()[:b].max())
            lag = lag_at(publish, b, store.n_retired, newest, cfg, publish - last)
            backlog = int(publish * R) // E * E - ready
            row = (publish, ready - fed, t1 - t0, t2 - t1, b, n, backlog, *lag.values())
            for name, value in zip(COLUMNS, row, strict=True):
                cols[name].append(value)
            fed, last = ready, publish
    memory = {"algo_bytes": int(algo.nbytes()), "store_bytes": int(store.nbytes)}
    memory["bytes_per_sample"] = (memory["algo_bytes"] + memory["store_bytes"]) / W
    return {**cfg, "k": k, "mode": mode, "warm": warm, "memory": memory,
            "retained": store.n_samples, "fed": fed, "columns": cols}  # fmt: skip


def _q(x, q: float) -> float:
    return float(np.quantile(np.asarray(x, dtype=float), q)) if len(x) else float("nan")


def _mpm(x) -> dict:
    return {"median": _q(x, 0.5), "p99": _q(x, 0.99), "max": _q(x, 1.0)}


def summarise(r: dict) -> dict:
    """The figures of one run: step and feed times, sustained rate, lag, memory, verdict."""
    c = r["columns"]
    rows, feed_s = np.asarray(c["rows"], float), np.asarray(c["feed_s"], float)
    cycle = np.diff(np.concatenate([[0.0], c["t"]]))
    # cycle = a + slope * rows: the loop keeps up with any rate below 1 / slope.
    fit = len(rows) > 2 and rows.std() > 0
    slope = float(np.polyfit(rows, cycle, 1)[0]) if fit else 0.0
    seconds = c["t"][-1] if c["t"] else 0.0
    fed_rate = r["fed"] / seconds if seconds else 0.0
    lag_it = _mpm(c["lag_it"])
    keeps_up = fed_rate >= 0.98 * r["rate"]
    return {
        "iterations": len(rows), "seconds": seconds, "windows_passed": r["fed"] / r["window"],
        "step_s": _mpm(c["step_s"]), "cycle_s": _mpm(cycle), "rows_per_iteration": _q(rows, .5),
        "feed_s_per_10k": 1e4 * float(feed_s.sum() / rows.sum()) if rows.sum() else None,
        "fed_rate": fed_rate, "final_backlog": c["backlog"][-1] if c["backlog"] else 0,
        "keeps_up": keeps_up, "max_rate_estimate": 1.0 / slope if slope > 0 else None,
        "b_equals_N": float(np.mean(np.equal(c["b"], c["N"]))) if c["b"] else None,
        "b_min": int(min(c["b"])) if c["b"] else None,
        "lag_s": _mpm(c["lag_s"]), "lag_it": lag_it,
        "bytes_per_sample": r["memory"]["bytes_per_sample"],
        "pass": bool(keeps_up and lag_it["p99"] <= 2.0),
    }  # fmt: skip


def _row(r: dict) -> str:
    s = r["summary"]
    three = "{median:.3f} / {p99:.3f} / {max:.3f}".format
    cells = [
        r["k"], r["mode"], f"{r['window']:,}", r["d"], f"{r['rate']:,.0f}", r["drift"],
        f"{s['seconds']:.0f} ({s['windows_passed']:.1f})", s["iterations"],
        three(**s["step_s"]), f"{s['feed_s_per_10k']:.4f}", f"{s['cycle_s']['median']:.3f}",
        f"{s['fed_rate']:,.0f}",
        f"{s['max_rate_estimate']:,.0f}" if s["max_rate_estimate"] else "-",
        f"{100 * s['b_equals_N']:.0f}% (min {s['b_min']:,})", three(**s["lag_s"]),
        "{median:.2f} / {p99:.2f} / {max:.2f}".format(**s["lag_it"]),
        f"{s['bytes_per_sample']:.0f}", "pass" if s["pass"] else "FAIL",
    ]  # fmt: skip
    return "| " + " | ".join(map(str, cells)) + " |"


HEADER = (
    "k", "mode", "W", "d", "R /s", "drift", "s timed (windows)", "iterations",
    "step s med / p99 / max", "feed s per 10k rows", "cycle s med", "rows fed /s",
    "max rate est. /s", "b = N (b min)", "lag s med / p99 / max",
    "lag iterations med / p99 / max", "engine B per sample", "verdict",
)  # fmt: skip


def _markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        "# Sliding window under live ingestion: how far behind the newest data",
        "",
        "Produced by `benchmarks/window_lag.py` (its docstring defines every figure):",
        "",
        f"    {doc['command']}",
        "",
        f"Machine: {m['cpu']} ({m['simd']}), {m['cores']} cores; numpy "
        f"{m['versions']['numpy']}, numba {m['versions']['numba']}. BLAS and numba on "
        f"{doc['threads']} thread(s), like the service's worker by default "
        f"(`NMBATCH_WORKER_THREADS` = cores - 1). Started {doc['started']}.",
        "",
        "Target (issue 12): a window of 2 million at d = 128, ingestion at 200,000 vectors/s, "
        "the model within one or two iterations of the newest data (pass: the loop keeps up, "
        ">= 98% of the rate fed, and p99 of `lag_it` <= 2).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *map(_row, doc["runs"]),
        "",
        "Warm-up (the first W samples fed at once, then steps until converged):",
        "",
    ]
    for r in doc["runs"]:
        w = r["warm"]
        lines.append(f"- k = {r['k']}, {r['mode']}: fill {w['fill_s']:.1f} s, "
                     f"{w['iterations']} iterations in {w['seconds']:.1f} s, b = {w['b']:,}, "
                     f"converged: {w['converged']}")  # fmt: skip
    lines += [
        "",
        "Engine memory: `algo.nbytes() + store.nbytes` (arrays at their capacity) over the W "
        "retained samples. `max rate est.`: 1 / slope of a least-squares fit of each "
        "iteration's time on the rows fed in it (the loop keeps up below it).",
        "",
        "![lag](lag.png)",
        "",
    ]
    return "\n".join(lines + ([doc["note"], ""] if doc["note"] else []))


def _plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for r in doc["runs"]:
        c, label = r["columns"], f"k = {r['k']}, {r['mode']}"
        axes[0].plot(c["t"], c["lag_it"], lw=0.8, label=label)
        axes[1].plot(c["t"], c["lag_s"], lw=0.8, label=label)
        cycle = np.diff(np.concatenate([[0.0], c["t"]]))
        (line,) = axes[2].plot(c["t"], cycle, lw=0.8, label=f"{label}: publish to publish")
        axes[2].plot(c["t"], c["step_s"], lw=0.6, ls=":", color=line.get_color())
    axes[0].axhline(2.0, color="grey", ls="--", lw=0.8)
    labels = ("lag (iterations)", "lag (s)", "s per iteration (dotted: step)")
    for ax, y in zip(axes, labels, strict=True):
        ax.set_ylabel(y)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    axes[2].set_xlabel("seconds of streaming (engine clock)")
    fig.suptitle("nmbatch with a sliding window under live ingestion: lag behind the newest data")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dump(doc: dict) -> str:
    """``doc`` as JSON: indented, but each run's columns one line each (floats to 7 digits)."""
    runs = [{**r, "columns": f"@{i}@"} for i, r in enumerate(doc["runs"])]
    text = json.dumps({**doc, "runs": runs}, indent=1) + "\n"
    for i, r in enumerate(doc["runs"]):
        cols = {n: [v if isinstance(v, int) else float(f"{v:.7g}") for v in col]
                for n, col in r["columns"].items()}  # fmt: skip
        text = text.replace(f'"@{i}@"', json.dumps(cols, separators=(",", ":")))
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.window_lag",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    add = p.add_argument
    add("--out", required=True, type=Path, help="folder for the results")
    add("--k", type=int, nargs="+", default=[16], help="k of each run")
    add("--modes", nargs="+", choices=("engine", "top-up"), default=["engine"],
        help="modes run for each k (module docstring)")  # fmt: skip
    add("--window", type=int, default=2_000_000, help="W, samples retained")
    add("--d", type=int, default=128, help="dimension")
    add("--rate", type=float, default=200_000.0, help="R, samples per second")
    add("--duration", type=float, default=60.0, help="seconds of streaming")
    add("--entry", type=int, default=None, help="rows per log entry (default: the service's)")
    add("--drift", type=float, default=0.0, help="noise deviations the means move per window")
    add("--batch-size", type=int, default=5000, help="initial b (the service's default)")
    add("--seed", type=int, default=0)
    add("--warm-seconds", type=float, default=300.0, help="warm-up at most")
    add("--threads", type=int, default=1, help="BLAS and numba threads")
    add("--no-swap", dest="swap", action="store_false",
        help="without cluster swaps (the service makes them with a window)")
    add("--note", default="", help="a paragraph added to results.md")
    return p


def main(argv: list[str] | None = None) -> dict:
    """Run every ``(k, mode)``; write results.json, results.md and lag.png; return them."""
    import numba
    from threadpoolctl import threadpool_limits

    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    cfg = {name: getattr(args, name) for name in ("window", "d", "rate", "duration", "drift",
           "batch_size", "seed", "warm_seconds", "swap")}  # fmt: skip
    cfg["entry"] = args.entry or CHUNK_BYTES // (4 * args.d)
    doc = {"command": "python -m benchmarks.window_lag " + shlex.join(argv),
           "started": time.strftime("%Y-%m-%d %H:%M %Z"), "threads": args.threads,
           "note": args.note, "runs": []}  # fmt: skip
    with threadpool_limits(limits=args.threads):
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        doc["machine"] = machine_info()
        for k in args.k:
            for mode in args.modes:
                r = run(cfg, k, mode)
                r["summary"] = summarise(r)
                doc["runs"].append(r)
                print(json.dumps({"k": k, "mode": mode, **r["summary"]}), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(dump(doc))
    (args.out / "results.md").write_text(_markdown(doc))
    _plot(doc, args.out / "lag.png")
    return doc


if __name__ == "__main__":
    main()
