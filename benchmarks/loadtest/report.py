"""The results of a run: ``loadtest.md`` (rendered from the JSON record) and ``loadtest.json``.

:func:`markdown` is a pure function of the run's JSON record, so a committed report
(``docs/bench/load/``) renders again, byte for byte, from its ``loadtest.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["markdown", "write_results"]


def _f(value: float | None, fmt: str = "{:,.0f}") -> str:
    """``value`` formatted with ``fmt``, ``-`` for None."""
    return "-" if value is None else fmt.format(value)


def _gib(value: float | None) -> str:
    """Bytes as GiB with two decimals, ``-`` for None."""
    return "-" if value is None else f"{value / 2**30:.2f}"


def _server_command(result: dict[str, Any]) -> str:
    """The command of the server a run started, told by the command that made the run.

    ``python -m service.loadtest`` (the runs committed in ``docs/bench/load/``) started
    ``python -m service``; ``python -m benchmarks.loadtest`` starts ``python -m nmbatch``.
    """
    made_by_service_loadtest = result["command"].startswith("python -m service.")
    return "python -m service" if made_by_service_loadtest else "python -m nmbatch"


def markdown(result: dict[str, Any]) -> str:
    """The report of a run (machine, versions, command, targets, phases) from its record."""
    m = result["machine"]
    v = m["versions"]
    loop = "uvloop" if v.get("uvloop") else "asyncio"
    a = result["args"]
    lines = [
        "# nmbatch service load benchmark",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {_gib(m['memory_bytes'])} GiB, "
        f"{m['platform']}. Server, Redis and load generator share these cores (loopback).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Server: one `{_server_command(result)}` process (uvicorn: h11, {loop} loop, access log "
        f"off), its embedded redis-server (append-only file, appendfsync everysec, "
        f"rewrites without compression at 400% growth), k = {a['k']}, d = {a['dim']}, "
        f"`NMBATCH_WORKER_THREADS={a.get('worker_threads', 1)}`, the worker iterating all "
        f"along (its engine in "
        f"{'a child process' if a.get('worker_process', True) else 'the worker thread'}). "
        f"A fresh server per phase. "
        f"Batches of {a['batch']:,} vectors. Clients: asyncio over raw keep-alive sockets, "
        f"{a['ingest_procs']} ingesting process(es) x {a['ingest_conns']} connections at full "
        f"speed, /assign paced (open loop, latency from the scheduled send) over "
        f"{a['assign_conns']} connections, and a probe posting one npy batch every "
        f"{a['probe_interval']:g} s and polling `GET /centroids` every {a['probe_poll_ms']:g} ms.",
        "",
        "## Targets",
        "",
        "| target | measured | wanted | met |",
        "|---|---|---|---|",
    ]
    for row in result["targets"]:
        value = row["measured"]
        if value is None:
            shown = "-"
        elif isinstance(value, int) or value >= 100:
            shown = f"{value:,.0f}"
        else:
            shown = f"{value:,.2f}"
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        lines.append(f"| {row['target']} | {shown} | {row['wanted']} | {met} |")
    lines += [
        "",
        "## Phases",
        "",
        "| phase | s | ingest vectors/s | ingest req ms p50 / p99 | /assign req/s | "
        "/assign ms p50 / p99 / max | errors | CPU cores: server (the worker) / "
        "redis / clients / other programs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        ing, asg = p.get("ingest"), p.get("assign")
        errors = (ing or {}).get("errors", 0) + (asg or {}).get("errors", 0)
        shed = (ing or {}).get("shed", 0)
        behind = (ing or {}).get("shed_behind")  # None: a record from before it was counted
        cpu = p["cpu_cores_used"]
        lines.append(
            f"| {p['name']} | {p['seconds']:.0f} | "
            + (
                f"{ing['vectors_per_second']:,.0f} | {_f(ing['latency_ms']['median'], '{:.1f}')} "
                f"/ {_f(ing['latency_ms']['p99'], '{:.1f}')} | "
                if ing
                else "- | - | "
            )
            + (
                f"{asg['requests_per_second']:,.0f} | {_f(asg['latency_ms']['median'], '{:.2f}')}"
                f" / {_f(asg['latency_ms']['p99'], '{:.2f}')} / "
                f"{_f(asg['latency_ms']['max'], '{:.1f}')} | "
                if asg
                else "- | - | "
            )
            + (f"{errors} ({shed} writes shed{_behind(behind)}) | " if shed else f"{errors} | ")
            + f"{_f(cpu.get('server'), '{:.2f}')} ({_f(cpu.get('worker'), '{:.2f}')})"
            f" / {_f(cpu.get('redis'), '{:.2f}')} / {_f(cpu.get('clients'), '{:.2f}')}"
            f" / {_f(cpu.get('other programs'), '{:.2f}')} |"
        )
    lines += [
        "",
        "Rates count the requests completed inside the phase's window; ingestion latency is "
        "per request (full speed: back to back; paced: from the scheduled send). CPU in cores "
        "over the window: the server process with its engine process (in brackets the "
        "worker: its thread and the engine process, which runs at niceness 10), "
        "redis-server with its append-only-file rewrite children, the client "
        "processes (their start-up and encoding included), and what the rest of the machine "
        "used meanwhile. Writes shed: answered `503` `overloaded` and sent again after "
        "`Retry-After` (not errors); \"behind\": of them, those shed because the worker was "
        "behind by more than its hand-off holds (the others: the event loop's lag).",
        "",
        "## Ingestion to centroids",
        "",
        "Delay from a POST's `202` until `GET /centroids` shows a version computed with the "
        "acknowledged total in the worker's store (`n_samples`), and until the nested batch "
        "covers it (`batch_size`).",
        "",
        "| phase | probes | in store: median / p90 / max s | in prefix: median / p90 / max s "
        "| prefix not reached |",
        "|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        dl = p.get("delay_seconds")
        if not dl:
            continue
        s, pr = dl["in_store"], dl["in_prefix"]
        lines.append(
            f"| {p['name']} | {dl['probes']} | {_f(s['median'], '{:.3f}')} / "
            f"{_f(s['p90'], '{:.3f}')} / {_f(s['max'], '{:.3f}')} | "
            f"{_f(pr['median'], '{:.3f}')} / {_f(pr['p90'], '{:.3f}')} / "
            f"{_f(pr['max'], '{:.3f}')} | {dl['in_prefix_not_reached']} |"
        )
    lines += [
        "",
        "## Memory",
        "",
        "RSS at the start and end of each phase (after the warm-up), against the growth the "
        "data alone explain. "
        + (result["phases"][0]["memory"]["rule"] if result["phases"] else ""),
        "",
        "| phase | vectors logged | process | RSS start GiB | RSS end GiB | growth GiB | "
        "expected GiB | ratio | explained |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result["phases"]:
        mem = p["memory"]
        for proc in ("server", "redis"):
            if proc not in mem:
                continue
            r = mem[proc]
            lines.append(
                f"| {p['name']} | {mem['vectors_logged']:,} | {proc} | {_gib(r['rss_start'])} | "
                f"{_gib(r['rss_end'])} | {_gib(r['growth'])} | {_gib(r['expected_from_data'])} "
                f"| {_f(r['ratio'], '{:.2f}')} | {'yes' if r['explained'] else '**no**'} |"
            )
    lines += ["", "## After each phase", ""]
    for p in result["phases"]:
        f = p["final"]
        lines.append(
            f"- {p['name']}: N = {f['N']:,} (log {f['n_logged']:,}), b = {f['b']:,}, iterations "
            f"{f['iteration']:,}, centroid version {f['version']}, bounds skipped "
            f"{_f(f['skipped_share'], '{:.1%}')} of distances; the worker's store held the "
            f"whole log {_f(p.get('catch_up_seconds'), '{:.1f}')} s after the clients stopped "
            f"and it converged on it after {_f(p.get('converged_seconds'), '{:.1f}')} s; "
            f"Redis forked {_f(p.get('redis_forks'), '{:.0f}')} time(s) to rewrite its "
            f"append-only file (last fork {_f(p.get('redis_latest_fork_ms'), '{:.0f}')} ms); "
            f"server exit code on SIGTERM {p['exit_code']}."
        )
        for kind in ("ingest", "assign"):
            for example in p.get(kind, {}).get("error_examples", []):
                lines.append(f"  - {kind} error: `{example}`")
    if result.get("notes"):
        lines += ["", "## Notes", "", *result["notes"]]
    return "\n".join(lines) + "\n"


def _json_default(value: object) -> object:
    """NumPy scalars and arrays as JSON numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value).__name__)


def write_results(result: dict[str, Any], out: Path) -> None:
    """Write ``result`` as ``out/loadtest.json`` and its rendering as ``out/loadtest.md``."""
    (out / "loadtest.json").write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    (out / "loadtest.md").write_text(markdown(result))


def _behind(count: int | None) -> str:
    """``", N behind"``: writes shed for the worker's backlog, if the record counts them."""
    return "" if count is None else f", {count} behind"

