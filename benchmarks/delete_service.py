"""Deletion by id timed through the service: ``POST /samples/delete`` of 1, 1,000 and
100,000 ids from a model of 1,000,000 rows.

Starts ``python -m nmbatch`` (:class:`benchmarks.two_models.Service`: its embedded Redis
in a temporary folder, or ``--redis-url``), pushes ``--n`` rows of dimension ``--dim``
(Gaussian blobs) with ids ``"s<i>"`` through the Python client (``push(X, ids=...)``,
chunks of 100,000 rows), waits until the model converged on all of them, then for each
size of ``--sizes`` deletes ``--repeats`` times that many ids drawn at random among the
ones left (``--pause`` seconds after the deletion before, 0: back to back), in
requests of at most 10,000 ids (the service's bound), timing each
request from the client: the service answers once the tombstones are written, the
samples are out of the engine and the model without them is published. Writes
``delete_service.json`` and ``delete_service.md`` in ``--out``. Usage (from a checkout;
under ``taskset -c 0`` the service, its engine and Redis share that core)::

    taskset -c 0 python -m benchmarks.delete_service --out docs/bench/delete-service
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.machine import machine_info
from benchmarks.two_models import Service
from nmbatch import Client

__all__ = ["main", "run"]

MAX_IDS = 10_000  # ids per POST /samples/delete (service/usecases/samples.py)


def _blobs(rng: np.random.Generator, n: int, d: int, k: int) -> np.ndarray:
    centres = rng.standard_normal((k, d)) * 10
    out = np.empty((n, d), dtype=np.float32)
    for start in range(0, n, 100_000):  # a page at a time: no float64 copy of all rows
        stop = min(n, start + 100_000)
        which = rng.integers(0, k, stop - start)
        out[start:stop] = centres[which] + rng.standard_normal((stop - start, d))
    return out


def _delete(base: str, ids: list[str]) -> tuple[list[float], int]:
    """``ids`` deleted in requests of at most :data:`MAX_IDS`: each request's seconds,
    and how many the service deleted."""
    seconds, deleted = [], 0
    with httpx.Client(base_url=base, timeout=600) as http:
        for start in range(0, len(ids), MAX_IDS):
            body = {"ids": ids[start : start + MAX_IDS]}
            began = time.perf_counter()
            answer = http.post("/samples/delete", json=body)
            seconds.append(time.perf_counter() - began)
            answer.raise_for_status()
            deleted += len(answer.json()["deleted"])
    return seconds, deleted


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    X = _blobs(rng, args.n, args.dim, args.k)
    ids = [f"s{i}" for i in range(args.n)]
    with tempfile.TemporaryDirectory(prefix="nmbatch-delete-") as tmp:
        service = Service(Path(tmp), args.redis_url, args.worker_threads, k=str(args.k),
                          max_samples=str(args.n), seed=str(args.seed))  # fmt: skip
        try:
            service.wait_ready()
            began = time.perf_counter()
            with Client(service.base, timeout=600) as client:
                pushed = client.push(X, ids=ids)
                push_seconds = time.perf_counter() - began
                assert pushed.accepted == args.n and pushed.ids == tuple(ids)
                model = client.wait_for(converged=True, min_samples=args.n,
                                        timeout=args.timeout)  # fmt: skip
                converge_seconds = time.perf_counter() - began - push_seconds
                left = np.arange(args.n)
                sizes = []
                for size in args.sizes:
                    runs = []
                    for _ in range(args.repeats):
                        time.sleep(args.pause)  # the worker idle again (or not: 0)
                        chosen = rng.choice(left.shape[0], size=size, replace=False)
                        doomed = left[chosen]
                        left = np.delete(left, chosen)
                        seconds, deleted = _delete(service.base, [ids[i] for i in doomed])
                        assert deleted == size, (deleted, size)
                        runs.append({"seconds": sum(seconds), "requests": seconds})
                    totals = [r["seconds"] for r in runs]
                    sizes.append({
                        "ids": size, "requests": len(runs[0]["requests"]),
                        "median_seconds": statistics.median(totals), "min_seconds": min(totals),
                        "ids_per_second": size / statistics.median(totals), "runs": runs,
                    })  # fmt: skip
                after = client.stats()
        finally:
            service.stop()
    return {
        "command": "python -m benchmarks.delete_service " + shlex.join(argv),
        "n": args.n, "dim": args.dim, "k": args.k, "repeats": args.repeats,
        "pause": args.pause,
        "push_seconds": push_seconds, "converge_seconds": converge_seconds,
        "version_before": model.version, "n_samples_after": after.get("n_samples"),
        "sizes": sizes, "machine": machine_info(),
    }  # fmt: skip


def markdown(doc: dict[str, Any]) -> str:
    """The table of ``doc`` (what :func:`run` returns)."""
    pause = doc.get("pause") or 0
    spacing = f"{pause:g} s after the one before" if pause else "back to back"
    lines = [
        "# Deletion by id through the service",
        "",
        f"`POST /samples/delete` on a model of {doc['n']:,} rows (d = {doc['dim']}, "
        f"k = {doc['k']}), pushed with ids in {doc['push_seconds']:.1f} s, converged "
        f"{doc['converge_seconds']:.1f} s later; each size deleted {doc['repeats']} times "
        "(ids drawn at random among those left, at most 10,000 per request), "
        f"{spacing}, timed from the client. The machine is shared: the figures are rough.",
        "",
        "| ids | requests | median s | min s | ids/s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for size in doc["sizes"]:
        lines.append(
            f"| {size['ids']:,} | {size['requests']} | {size['median_seconds']:.4f} | "
            f"{size['min_seconds']:.4f} | {size['ids_per_second']:,.0f} |"
        )
    lines += ["", f"Command: `{doc['command']}`", ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, default=Path("docs/bench/delete-service"))
    p.add_argument("--n", type=int, default=1_000_000, help="rows of the model")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--k", type=int, default=8)
    p.add_argument(
        "--sizes",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[1, 1_000, 100_000],
        help="ids per deletion, comma-separated",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pause", type=float, default=0.0,
                   help="seconds to wait before each deletion (0: back to back)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to converge")
    p.add_argument("--worker-threads", type=int, default=1)
    p.add_argument("--redis-url", default=None, help="default: the embedded Redis")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.n < sum(args.sizes) * args.repeats:
        raise SystemExit("--n must hold every deletion: at least sum(sizes) x repeats rows")
    doc = run(args, argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "delete_service.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "delete_service.md").write_text(markdown(doc))
    return doc


if __name__ == "__main__":
    main()
