"""Fairness of two models in one service: does a busy model starve a quiet one?

Starts ``python -m nmbatch`` (its embedded Redis in a temporary folder, or ``--redis-url``)
and creates two named models, ``busy`` and ``quiet`` (``k`` 8, ``d`` 64, ``b`` 5000 by
default; ``busy`` keeps a sliding window of ``--window`` samples, so it ingests without
end at a flat memory). Then, in two phases:

- ``idle``: nothing else runs; ``--rounds`` times, ``quiet`` receives a small batch
  (``--small`` rows, one ``POST``) and the tool polls ``/models/quiet/centroids`` until it
  shows centroids computed with that batch in the store (``n_samples`` equal to all
  ``quiet`` was sent: ``t_included``) and until they are converged on it
  (``t_converged``), timed from just before the ``POST``;
- ``busy``: ``--threads`` client threads post ``--big``-row ``.npy`` batches to
  ``busy`` as fast as the service takes them (its worker iterates without pause on a
  growing store), and the same rounds are timed for ``quiet``.

A fair service keeps ``quiet``'s times in the ``busy`` phase near the ``idle`` ones: its
iterations run in its own engine process, which the OS schedules beside ``busy``'s.
The load average and the CPU time of the machine are recorded before and after (other
programs on the machine count too). Writes ``two_models.json`` and ``two_models.md`` in
``--out``. Usage (from a checkout)::

    python -m benchmarks.two_models --out docs/bench/models
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.machine import machine_info
from nmbatch.service.embedded_redis import free_port

__all__ = ["main", "run"]

REPO = Path(__file__).resolve().parents[1]


def _npy(X: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, X, allow_pickle=False)
    return out.getvalue()


def _blobs(rng: np.random.Generator, n: int, d: int, centres: np.ndarray) -> np.ndarray:
    which = rng.integers(0, centres.shape[0], n)
    return (centres[which] + rng.standard_normal((n, d))).astype(np.float32)


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from ``/proc/stat``."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Service:
    """``python -m nmbatch`` on a free port; stopped with SIGTERM. ``settings``: more
    of its settings (``k="8"`` sets ``NMBATCH_K``)."""

    def __init__(self, folder: Path, redis_url: str | None, threads: int, **settings: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NMBATCH_")}
        env.update(
            PYTHONPATH=str(REPO), NMBATCH_PORT=str(self.port), NMBATCH_LOG_LEVEL="warning",
            NMBATCH_ACCESS_LOG="false", NMBATCH_DATA_DIR=str(folder / "data"),
            NMBATCH_WORKER_THREADS=str(threads), NMBATCH_MODEL="default",
        )  # fmt: skip
        if redis_url:
            env["NMBATCH_REDIS_URL"] = redis_url
        env.update({f"NMBATCH_{name.upper()}": value for name, value in settings.items()})
        self.log = open(folder / "service.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nmbatch"], cwd=REPO, env=env,
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}")
            try:
                if httpx.get(self.base + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the service did not get ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


class Flood:
    """Threads posting big batches to ``busy`` until stopped; counts accepted rows."""

    def __init__(self, base: str, X: np.ndarray, threads: int) -> None:
        self.body = _npy(X)
        self.rows = X.shape[0]
        self.base = base
        self.accepted = 0
        self.refused: dict[int, int] = {}  # status -> requests
        self.problems: list[str] = []  # the first few refusals' details
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        headers = {"content-type": "application/x-npy"}
        with httpx.Client(base_url=self.base, timeout=60) as http:
            while not self.stopping.is_set():
                status = http.post("/models/busy/samples", content=self.body, headers=headers)
                with self.lock:
                    if status.status_code == 202:
                        self.accepted += self.rows
                    else:
                        code = status.status_code
                        self.refused[code] = self.refused.get(code, 0) + 1
                        if len(self.problems) < 3:
                            self.problems.append(status.text[:300])
                        time.sleep(0.05)

    def __enter__(self) -> Flood:
        self.started = time.perf_counter()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(120)
        self.seconds = time.perf_counter() - self.started


def _round(http: httpx.Client, X: np.ndarray, expected: int, timeout: float) -> dict[str, Any]:
    """Post ``X`` to ``quiet``; seconds until its centroids hold ``expected`` samples, and
    until they are converged on them."""
    started = time.perf_counter()
    response = http.post(
        "/models/quiet/samples", content=_npy(X), headers={"content-type": "application/x-npy"}
    )
    acked = time.perf_counter() - started
    if response.status_code != 202:
        return {"ack_s": acked, "refused": response.status_code, "problem": response.json()}
    included = None
    while time.perf_counter() - started < timeout:
        answer = http.get("/models/quiet/centroids")
        doc = answer.json() if answer.status_code == 200 else {}
        if doc.get("n_samples") == expected:
            now = time.perf_counter() - started
            included = now if included is None else included
            if doc["converged"]:
                return {"ack_s": acked, "t_included_s": included, "t_converged_s": now,
                        "after_ack_s": included - acked, "version": doc["version"],
                        "iteration": doc["iteration"]}  # fmt: skip
        time.sleep(0.005)
    return {"ack_s": acked, "t_included_s": included, "t_converged_s": None, "timeout": True}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": len(rounds)}
    for key in ("ack_s", "after_ack_s", "t_included_s", "t_converged_s"):
        values = [r[key] for r in rounds if r.get(key) is not None]
        if values:
            out[key] = {"median": float(np.median(values)), "max": float(np.max(values))}
    out["timeouts"] = sum(1 for r in rounds if r.get("timeout"))
    out["refused"] = sum(1 for r in rounds if r.get("refused"))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = {"k": args.k, "dim": args.dim, "batch_size": args.batch_size, "seed": 1, "rho": 100}
    # busy keeps a sliding window: it ingests without end at a flat memory.
    specs = {"busy": spec | {"retention": "window", "max_samples": args.window}, "quiet": spec}
    rng = np.random.default_rng(0)
    centres = 8.0 * rng.standard_normal((args.k, args.dim))
    big = _blobs(rng, args.big, args.dim, centres)
    load_before, cpu_before = os.getloadavg(), _cpu_times()
    doc: dict[str, Any] = {"settings": {**vars(args), "out": str(args.out)}, "specs": specs}
    with tempfile.TemporaryDirectory(prefix="two-models-") as folder:
        service = Service(Path(folder), args.redis_url, args.worker_threads)
        try:
            service.wait_ready()
            with httpx.Client(base_url=service.base, timeout=60) as http:
                for name, body in specs.items():
                    http.put(f"/models/{name}", json=body).raise_for_status()
                sent = 0
                phases: dict[str, Any] = {}
                for phase in ("idle", "busy"):
                    rounds = []
                    flood = Flood(service.base, big, args.threads) if phase == "busy" else None
                    if flood is not None:
                        flood.__enter__()
                        time.sleep(args.warm_seconds)  # busy's worker iterating by now
                    try:
                        for _ in range(args.rounds):
                            X = _blobs(rng, args.small, args.dim, centres)
                            result = _round(http, X, sent + X.shape[0], args.timeout)
                            sent += X.shape[0] if "refused" not in result else 0
                            rounds.append(result)
                            time.sleep(args.pause)
                    finally:
                        if flood is not None:
                            flood.__exit__()
                    phases[phase] = {"summary": _summary(rounds), "rounds": rounds}
                    if flood is not None:
                        stats = http.get("/models/busy/stats").json()
                        phases[phase]["busy"] = {
                            "rows_accepted": flood.accepted,
                            "rows_per_second": flood.accepted / flood.seconds,
                            "refused_requests": flood.refused,
                            "refusals": flood.problems,
                            "iterations": stats["iteration"],
                            "n_samples": stats["n_samples"],
                            "b": stats["b"],
                        }
                doc["phases"] = phases
        finally:
            service.stop()
    cpu_after = _cpu_times()
    doc["machine"] = {
        **machine_info(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpu_busy_share": (cpu_after[0] - cpu_before[0]) / max(1.0, cpu_after[1] - cpu_before[1]),
    }
    doc["command"] = "python -m benchmarks.two_models " + shlex.join(sys.argv[1:])
    return doc


def _markdown(doc: dict[str, Any]) -> str:
    s, m = doc["settings"], doc["machine"]
    lines = [
        "# Two models in one service: the quiet one's latency while the other ingests",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Models `busy` (retention window of {s['window']:,}) and `quiet` (retention all): "
        f"k = {s['k']}, d = {s['dim']}, b = {s['batch_size']}. "
        f"Each round posts {s['small']} rows to `quiet` and times, from just before the "
        "POST, until `/models/quiet/centroids` shows centroids with them in the store "
        "(`included`) and converged on them (`converged`); `ack to included` is the part "
        "after the POST was answered (the worker's and the engine's). Phase `busy`: "
        f"{s['threads']} client threads post {s['big']}-row batches to `busy` without pause.",
        "",
        "| phase | rounds | POST ack median / max (s) | ack to included median / max (s) | "
        "included median / max (s) | converged median / max (s) | timeouts | refused |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for phase, value in doc["phases"].items():
        sm = value["summary"]

        def cell(key: str, sm: dict[str, Any] = sm) -> str:
            v = sm.get(key)
            return "—" if v is None else f"{v['median']:.3f} / {v['max']:.3f}"

        lines.append(
            f"| {phase} | {sm['rounds']} | {cell('ack_s')} | {cell('after_ack_s')} | "
            f"{cell('t_included_s')} | "
            f"{cell('t_converged_s')} | {sm['timeouts']} | {sm['refused']} |"
        )
    busy = doc["phases"]["busy"].get("busy", {})
    lines += [
        "",
        f"`busy` meanwhile: {busy.get('rows_accepted', 0):,} rows accepted "
        f"({busy.get('rows_per_second', 0):,.0f} rows/s), {busy.get('iterations')} "
        f"iterations, N = {busy.get('n_samples'):,}, b = {busy.get('b'):,}; requests "
        f"refused by status: {busy.get('refused_requests') or 'none'}.",
        "",
        f"Machine: {m['cpu']}, {m['cores_available']} cores; load average (1, 5, 15 min) "
        f"{tuple(round(x, 2) for x in m['loadavg_before'])} before, "
        f"{tuple(round(x, 2) for x in m['loadavg_after'])} after; the machine's CPUs were "
        f"busy {100 * m['cpu_busy_share']:.0f}% of the run (other programs included).",
        "",
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.two_models", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", type=Path, default=Path("docs/bench/models"))
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=5000)
    p.add_argument("--window", type=int, default=500_000, help="busy's window size")
    p.add_argument("--small", type=int, default=1000, help="rows per batch to quiet")
    p.add_argument("--big", type=int, default=10_000, help="rows per batch to busy")
    p.add_argument("--threads", type=int, default=2, help="client threads flooding busy")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--pause", type=float, default=0.5, help="seconds between rounds")
    p.add_argument("--warm-seconds", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=20.0, help="per round")
    p.add_argument("--worker-threads", type=int, default=1)
    p.add_argument("--redis-url", default=None, help="default: the embedded Redis")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    doc = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "two_models.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "two_models.md").write_text(_markdown(doc))
    print(_markdown(doc))
    return doc


if __name__ == "__main__":
    main()
