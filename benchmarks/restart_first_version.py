"""What a restart of the service spends before its first new model version (issue 33).

Starts ``python -m nmbatch`` (embedded Redis in a temporary data folder, one worker
thread; :class:`benchmarks.soak.service.Service`), pushes ``n`` random ``(n, d)`` float32
samples (``k`` Gaussian clusters) and waits until the model holds them all and a
snapshot of it is written; stops it (SIGTERM) and starts it again on the same data. The
restart is timed from the new process's start: ``/readyz`` answering, the worker's
replay of the log (its log line ``replayed N samples from the log in S s``) and the first
``/stats`` whose model version is newer than the one at the stop (polled every 20 ms);
the restart's start time and its timestamped log lines are kept for a breakdown::

    python -m benchmarks.restart_first_version --n 100000 --d 128 --k 50 \\
        --out docs/bench/first-step/restart

Appends one JSON line per restart to ``OUT/restarts.jsonl`` and writes ``OUT/restart.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

__all__ = ["main", "restart_run"]


def restart_run(n: int, d: int, k: int, *, seed: int = 0, timeout: float = 600.0) -> dict:
    """One fill, stop and restart of the service; seconds from the restart's process
    start to readiness, to the end of the replay and to the first new version."""
    from benchmarks.soak.service import Service
    from nmbatch import Client

    rng = np.random.default_rng(seed)
    means = 4.0 * rng.standard_normal((k, d))
    X = (means[rng.integers(k, size=n)] + rng.standard_normal((n, d))).astype(np.float32)
    settings = {"NMBATCH_K": str(k), "NMBATCH_SNAPSHOT_SECONDS": "0.5"}
    with tempfile.TemporaryDirectory(prefix="nmbatch-restart-") as tmp:
        data_dir, log_path = Path(tmp) / "data", Path(tmp) / "service.log"
        data_dir.mkdir()
        first = Service(settings, data_dir, log_path)
        try:
            first.wait_ready(timeout)
            with Client(first.base) as client:
                client.push(X)
                client.wait_for(min_samples=n, converged=False, timeout=timeout)
                time.sleep(2.0)  # a few snapshot cadences: the snapshot is of the last model
                stopped = client.stats()
        finally:
            first.stop()
        offset = log_path.stat().st_size
        second = Service(settings, data_dir, log_path)
        out = {"n": n, "d": d, "k": k, "seed": seed, "version_at_stop": stopped.get("version"),
               "started_at": datetime.now().isoformat(sep=" ", timespec="milliseconds")}
        try:
            second.wait_ready(timeout)
            out["ready"] = second.ready_seconds
            with Client(second.base) as client:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    st = client.stats()
                    if (st.get("version") or 0) > (stopped.get("version") or 0):
                        out["first_new_version"] = time.monotonic() - second.started
                        out["version"], out["N"] = st.get("version"), st.get("N")
                        break
                    time.sleep(0.02)
            replayed = second.replayed()
            if replayed is not None:
                out["replayed_samples"], out["replay"] = replayed
        finally:
            second.stop()
            # The restart's log lines (timestamped: kernels loaded, Redis, the replay).
            with open(log_path, "rb") as f:
                f.seek(offset)
                lines = f.read().decode(errors="replace").splitlines()
            out["log"] = [line for line in lines if " INFO " in line or "WARN" in line][:40]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.restart_first_version",
                                description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--label", default="here")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "restarts.jsonl", "a") as f:
        for seed in range(args.repeats):
            r = {"label": args.label, **restart_run(args.n, args.d, args.k, seed=seed)}
            f.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)
    runs = [json.loads(s) for s in (args.out / "restarts.jsonl").read_text().splitlines() if s]
    lines = ["| label | n | d | k | ready (s) | replay (s, worker's log) | first new version (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        cells = [f"{r[c]:.2f}" if isinstance(r.get(c), float) else "-"
                 for c in ("ready", "replay", "first_new_version")]  # fmt: skip
        head = f"| {r['label']} | {r['n']} | {r['d']} | {r['k']} | "
        lines.append(head + " | ".join(cells) + " |")
    (args.out / "restart.md").write_text(
        "Seconds from the restarted service's process start (one worker thread).\n\n"
        + "\n".join(lines) + "\n")  # fmt: skip
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
