"""The results of a soak run: ``soak.json``, ``soak.md`` (rendered from the JSON record)
and ``soak.png`` (memory, samples and ``/assign`` latency over time).

:func:`markdown` is a pure function of the run's JSON record, so a committed report
renders again, byte for byte, from its ``soak.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.soak.plot import plot

__all__ = ["markdown", "write_results"]

_GIB = float(1 << 30)


def _f(value: float | None, fmt: str = "{:,.0f}") -> str:
    """``value`` formatted with ``fmt``, ``-`` for None."""
    return "-" if value is None else fmt.format(value)


def _gib(value: float | None) -> str:
    """Bytes as GiB with two decimals, ``-`` for None."""
    return "-" if value is None else f"{value / _GIB:.2f}"


def _shown(value: Any) -> str:
    """A measured value of the checks table."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def _settings_line(result: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in result["settings"].items())


def _code_line(code: dict[str, Any]) -> str:
    """Which code ran: the commit, and the files changed from it when the run was made."""
    if not code.get("commit"):
        return "Code: unknown (no git)."
    changed = code.get("changed") or []
    line = f"Code: commit `{code['commit'][:12]}`"
    if not changed:
        return line + " (clean checkout)."
    shown = ", ".join(f"`{c}`" for c in changed[:40])
    more = f" and {len(changed) - 40} more" if len(changed) > 40 else ""
    return f"{line} with uncommitted changes in {shown}{more}."


def _header(result: dict[str, Any]) -> list[str]:
    m, a = result["machine"], result["args"]
    v = m["versions"]
    cg = result.get("cgroup")
    title = f"# Soak: retention `{result['retention']}`" + (
        f", NMBATCH_MAX_SAMPLES = {result['max_samples']:,}" if result.get("max_samples") else ""
    )
    lines = [
        title,
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {_gib(m['memory_bytes'])} GiB, "
        f"{m['platform']}. Server, Redis and the client processes share these cores (loopback).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".",
        "",
        f"Command: `{result['command']}`",
        "",
        _code_line(result.get("code") or {}),
        "",
        f"Service: `python -m nmbatch` with its embedded redis-server, settings "
        f"{_settings_line(result)} (plus ports and a temporary data folder). Traffic: "
        f"`.npy` batches of {a['batch']:,} vectors (d = {a['dim']}, float32) "
        + (
            f"paced at {a['rate']:,.0f} vectors/s"
            if a["rate"]
            else f"back to back on {a['ingest_conns']} connections"
        )
        + f", {a['total']:,} vectors at most"
        + (
            f", stopping {a['after_full_seconds']:g} s after the first 507"
            if a.get("after_full_seconds") is not None
            else ""
        )
        + f"; single-vector `GET /assign` paced at {a['assign_rate']:,.0f} requests/s over "
        f"{a['assign_conns']} connections (latency from the scheduled send). Sampled every "
        f"{a['sample_every']:g} s: RSS of the server process tree without redis-server "
        "(server + engine), of redis-server, Redis's `used_memory`, `/readyz`, `/stats`.",
        "",
    ]
    quiet = result.get("before_start")
    if quiet:
        lines += [
            f"Before the start it waited {quiet['waited_seconds']:.0f} s for other programs "
            f"to leave the cores; they used {_f(quiet.get('background_cores'), '{:.2f}')} "
            "cores then.",
            "",
        ]
    if cg:
        lines += [
            f"Memory cgroup (v1): limit {_gib(cg['limit_bytes'])} GiB "
            f"({cg['limit_bytes']:,} bytes): {cg['rule']}",
            "",
        ]
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The report of a run (machine, command, checks, traffic, memory) from its record."""
    lines = _header(result)
    lines += ["## Checks", "", "| check | measured | wanted | met |", "|---|---|---|---|"]
    for row in result["checks"]:
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        lines.append(f"| {row['check']} | {_shown(row['measured'])} | {row['wanted']} | {met} |")
    if result.get("error"):
        lines += ["", "## Error", "", "```", *result["error"].rstrip().splitlines(), "```"]
    if "ingest" in result and "assign" in result:
        lines += _traffic_sections(result)
    if result.get("samples") and result.get("baseline"):
        lines += _memory_section(result)
    lines += _after_section(result)
    if result.get("notes"):
        lines += ["", "## Notes", "", *result["notes"]]
    return "\n".join(lines) + "\n"


def _others(result: dict[str, Any]) -> str:
    """``, the client processes ..., other programs ...`` (or the rest unsplit)."""
    machine, service = result.get("machine_cores_busy"), result.get("server_cores_busy")
    clients = result.get("client_cores_busy")
    if clients is None or machine is None or service is None:
        return "; the rest is the client processes and other programs."
    named = ", ".join(
        f"`{row['command']}` {row['cores']:.2f}"
        for row in result.get("other_programs") or []
        if row["cores"] >= 0.01
    )
    states = result.get("machine_states_cores") or {}
    unaccounted = ""
    if states:
        unaccounted = (
            f" The machine's time charged to no process: interrupts "
            f"{states.get('irq', 0.0) + states.get('softirq', 0.0):.2f} cores, stolen by the "
            f"hypervisor {states.get('steal', 0.0):.2f}."
        )
    return (
        f", the client processes {clients:.2f} (their start-up included), other programs "
        f"and the kernel {machine - service - clients:.2f}"
        + (
            f" (the busiest other processes, with the children they reaped, cores: {named})."
            if named
            else "."
        )
        + unaccounted
    )


def _replay(restart: dict[str, Any]) -> str:
    """``N samples in S s`` from the worker's log line, ``-`` when not seen."""
    r = restart.get("replay_log")
    return "-" if not r else f"{r['samples']:,} samples in {r['seconds']:.2f} s"


def _cpu_split(cores: dict[str, Any] | None) -> str:
    """`` Per process: ...`` from :func:`benchmarks.soak.analysis.cpu_cores`, or nothing."""
    if not cores:
        return ""
    parts = ", ".join(f"{k} {_f(v, '{:.2f}')}" for k, v in cores.items())
    return f" Per process (cores): {parts}."


def _traffic_sections(result: dict[str, Any]) -> list[str]:
    ing, asg = result["ingest"], result["assign"]
    lines: list[str] = []
    lat = ing["latency_ms"]
    lines += [
        "",
        f"CPU over the traffic ({_f(result.get('traffic_seconds'), '{:.0f}')} s): the machine "
        f"{_f(result.get('machine_cores_busy'), '{:.2f}')} cores busy, of which the service "
        f"(server, engine, redis-server) {_f(result.get('server_cores_busy'), '{:.2f}')}"
        + _others(result)
        + _cpu_split(result.get("cpu_cores")),
        "",
        "## Ingestion",
        "",
        f"- {ing['requests']:,} requests, {ing['vectors_posted']:,} vectors posted, "
        f"{ing['vectors_acked']:,} acknowledged (+ {ing['warmup_vectors']:,} in the warm-up); "
        f"statuses {ing['statuses']}; in doubt (no answer) {ing['in_doubt_vectors']:,} vectors.",
        f"- Acknowledged {_f(ing.get('vectors_per_second'))} vectors/s over "
        f"{_f(ing.get('acked_seconds'), '{:.1f}')} s; `202` latency median "
        f"{_f(lat['median'], '{:.1f}')} ms, p99 {_f(lat['p99'], '{:.1f}')} ms, max "
        f"{_f(lat['max'], '{:.1f}')} ms.",
    ]
    first = ing.get("first_507")
    if first:
        lines.append(
            f"- First `507` at {first['t']:.1f} s, the model holding {first['n_samples']:,} "
            f"samples ({first['acked_before']:,} acknowledged before it); then "
            f"{first['refused_after']:,} refused and {first['accepted_after']:,} accepted."
        )
    for status, bodies in ing.get("examples", {}).items():
        lines.append(f"- `{status}` example: `{bodies[0][:240]}`")
    lat = asg["latency_ms"]
    lines += [
        "",
        "## /assign",
        "",
        f"{asg['requests']:,} requests, {_f(asg['requests_per_second'])} per second, statuses "
        f"{asg['statuses']}; latency median {_f(lat['median'], '{:.2f}')} ms, p99 "
        f"{_f(lat['p99'], '{:.2f}')} ms, p99.9 {_f(lat['p999'], '{:.2f}')} ms, max "
        f"{_f(lat['max'], '{:.1f}')} ms.",
    ]
    out = asg.get("outside_rewrites")
    if out and out["spans"]:
        q = out["latency_ms"]
        lines += [
            "",
            f"Redis rewrote its append-only file {len(out['spans'])} time(s) (spans in s: "
            + ", ".join(f"{a:.0f}-{b:.0f}" for a, b in out["spans"])
            + f"). Leaving out the requests due during a rewrite or the "
            f"{out['after_seconds']:g} s after it ({out['left_out_share']:.1%} of them): "
            f"median {_f(q['median'], '{:.2f}')} ms, p99 {_f(q['p99'], '{:.2f}')} ms, max "
            f"{_f(q['max'], '{:.1f}')} ms.",
        ]
    lines += [
        "",
        "Per slice: requests by completion time; other programs = the cores the rest of "
        "the machine (other programs and the kernel) took meanwhile; rewrite = Redis "
        "rewrote its append-only file during the slice.",
        "",
        "| from s | requests | failed | p50 ms | p99 ms | max ms | other programs, cores "
        "| rewrite |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in asg["slices"]:
        rewrite = {True: "yes", False: "", None: "-"}[s.get("rewriting")]
        lines.append(
            f"| {s['t']:.0f} | {s['requests']:,} | {s['failed']:,} | {_f(s['p50_ms'], '{:.2f}')}"
            f" | {_f(s['p99_ms'], '{:.2f}')} | {_f(s['max_ms'], '{:.1f}')} | "
            f"{_f(s.get('other_cores'), '{:.2f}')} | {rewrite} |"
        )
    return lines


def _memory_section(result: dict[str, Any]) -> list[str]:
    cap = result["capacity_model"]
    lines = [
        "",
        "## Memory",
        "",
        f"Per vector, from `service/storage/capacity.py`: engine {cap['engine_per_vector']:,} "
        f"bytes, Redis {cap['redis_per_vector']:,} bytes (raw row: {cap['row_bytes']:,}). "
        f"Fixed overhead = the values of the service idle after its warm-up (before the "
        f"traffic): server + engine RSS {_gib(result['baseline'].get('server_rss'))} GiB, "
        f"Redis used_memory {_gib(result['baseline'].get('redis_used_memory'))} GiB, Redis "
        f"RSS {_gib(result['baseline'].get('redis_rss'))} GiB.",
        "",
    ]
    mem = result.get("memory_after_window")
    if mem:
        lines += [
            f"After the first window ({mem['window']:,} samples acknowledged; window bytes = "
            f"{mem['window']:,} x {cap['row_bytes']} = {_gib(mem['window_bytes'])} GiB), "
            f"{mem['samples']} samples:",
            "",
            "| measure | fixed GiB | max GiB | (max - fixed) / window bytes | bound GiB | within | "
            "(max - fixed) / the capacity model's bytes for the window | growth after 2 "
            "windows, MiB per million vectors |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for key, label in (
            ("server_rss", "server + engine RSS"),
            ("redis_used_memory", "Redis used_memory"),
            ("redis_rss", "Redis RSS"),
        ):
            e = mem.get(key) or {}
            slope = e.get("slope_bytes_per_million")
            lines.append(
                f"| {label} | {_gib(e.get('fixed'))} | {_gib(e.get('max'))} | "
                f"{_f(e.get('ratio'), '{:.2f}')} | {_gib(e.get('bound'))} | "
                f"{'-' if e.get('within') is None else ('yes' if e['within'] else '**no**')} | "
                f"{_f(e.get('model_ratio'), '{:.2f}')} | "
                f"{_f(None if slope is None else slope / 2**20, '{:.1f}')} |"
            )
        lines.append("")
    lines += [
        "Over the run (every tenth of the samples, and the last):",
        "",
        "| t s | acknowledged | engine N | b | server + engine RSS GiB | engine RSS GiB | "
        "Redis used_memory GiB | Redis RSS GiB | cgroup usage GiB | cgroup anonymous GiB "
        "| /readyz |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    samples = result["samples"]
    picks = (
        sorted(set(np.linspace(0, len(samples) - 1, 11).astype(int).tolist())) if samples else []
    )
    warm = result["ingest"]["warmup_vectors"]
    for i in picks:
        s = samples[i]
        st = s.get("stats") or {}
        acked = (s.get("traffic") or {}).get("acked_vectors", 0) + warm
        lines.append(
            f"| {s['t']:.0f} | {acked:,} | {_f(st.get('N'))} | {_f(st.get('b'))} | "
            f"{_gib(s.get('server_rss'))} | {_gib(s.get('engine_rss'))} | "
            f"{_gib(s.get('redis_used_memory'))} | {_gib(s.get('redis_rss'))} | "
            f"{_gib(s.get('cgroup_usage'))} | {_gib(s.get('cgroup_rss'))} | {s.get('readyz')} |"
        )
    return lines


def _after_section(result: dict[str, Any]) -> list[str]:
    lines = ["", "## After the traffic", ""]
    final = result.get("final") or {}
    stats = final.get("stats") or {}
    lines.append(
        f"- The engine held the log's samples {_f(result.get('catch_up_seconds'), '{:.1f}')} s "
        f"after the traffic ended: N = {_f(stats.get('N'))}, n_logged = "
        f"{_f(stats.get('n_logged'))}, b = {_f(stats.get('b'))}, converged "
        f"{stats.get('converged')}, engine_bytes {_gib(stats.get('engine_bytes'))} GiB."
    )
    loss = result.get("loss_check")
    if loss:
        lines.append(
            f"- Sample log: {loss['log_rows']:,} rows in {loss['log_entries']:,} entries, meta "
            f"n_samples {_f(loss.get('meta_n_samples'))}; acknowledged {loss['acked']:,}, in "
            f"doubt {loss['in_doubt']:,}: nothing lost {loss['nothing_lost']}."
        )
    info = final.get("redis_info") or {}
    if info:
        lines.append(
            f"- Redis: used_memory {_gib(info.get('used_memory'))} GiB (peak "
            f"{_gib(info.get('used_memory_peak'))}), maxmemory {_gib(info.get('maxmemory'))} "
            f"GiB ({info.get('maxmemory_policy')}), append-only file "
            f"{_gib(info.get('aof_current_size'))} GiB (base {_gib(info.get('aof_base_size'))}"
            f" GiB), {info.get('aof_rewrites')} rewrite(s), "
            f"errors {info.get('errorstats', {})}."
        )
    cg = result.get("cgroup")
    if cg:
        run = cg.get("after_run") or cg.get("end") or {}
        anon = [s["cgroup_rss"] for s in result.get("samples", []) if s.get("cgroup_rss")]
        lines.append(
            f"- Memory cgroup, limit {_gib(cg['limit_bytes'])} GiB: peak usage (anonymous "
            f"memory and page cache) {_gib(run.get('max_usage_bytes'))} GiB, peak anonymous "
            f"memory (`total_rss`, sampled) {_gib(max(anon) if anon else None)} GiB, failcnt "
            f"{run.get('failcnt')} (times the usage met the limit and the kernel reclaimed "
            f"page cache), OOM kills {run.get('oom_kill')}; when the service stopped: "
            f"{run.get('stat')}."
        )
    oom = result.get("oom") or {}
    lines.append(
        f"- OOM killer: cgroup counter {oom.get('cgroup_oom_kill')}, kernel log lines "
        f"{len(oom.get('kernel_log') or [])}, engine restarts {oom.get('engine_restarts')}."
    )
    for line in (oom.get("kernel_log") or [])[:20]:
        lines.append(f"  - `{line}`")
    restart = result.get("restart")
    if restart and restart.get("error"):
        lines.append(
            f"- Restart on the same data (same cgroup) **failed** after "
            f"{_f(restart.get('failed_after_seconds'), '{:.1f}')} s: {restart['error']}; peak "
            f"cgroup usage {_gib(restart.get('cgroup_max_usage_bytes'))} GiB, OOM kills "
            f"{restart.get('oom_kill')}. The logs' last lines:"
        )
        for name, tail in (restart.get("log_tail") or {}).items():
            lines += ["", f"  {name}:", "", "  ```", *(f"  {line}" for line in tail), "  ```", ""]
    elif restart:
        in_cgroup = (
            f"; peak cgroup usage {_gib(restart.get('cgroup_max_usage_bytes'))} GiB, OOM kills "
            f"{restart.get('oom_kill')}"
            if cg
            else ""
        )
        lines.append(
            f"- Restart on the same data{' (same cgroup)' if cg else ''}: ready after "
            f"{_f(restart.get('ready_seconds'), '{:.1f}')} s, the engine held "
            f"{_f(restart.get('N'))} samples (expected {_f(restart.get('expected'))}) and "
            f"converged on them {_f(restart.get('replayed_seconds'), '{:.1f}')} s after the "
            f"start (the worker's replay: {_replay(restart)}); peak RSS of the server and its "
            f"engine {_gib(restart.get('server_peak_rss'))} GiB; the log counts "
            f"{_f(restart.get('n_logged'))} ever accepted{in_cgroup}; exit code "
            f"{restart.get('exit_code')}."
        )
        for line in restart.get("redis_loading") or []:
            lines.append(f"  - redis-server: `{line.split(' * ', 1)[-1]}`")
    lines.append(f"- Server exit code on SIGTERM: {result.get('exit_code')}.")
    log = result.get("service_log") or []
    if log:
        lines += ["", "Service log (start-up figures, warnings, errors):", "", "```"]
        lines += log[:60]
        lines.append("```")
    return lines


def _json_default(value: object) -> object:
    """NumPy scalars and arrays as JSON numbers and lists."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value).__name__)


def write_results(result: dict[str, Any], out: Path, with_plot: bool = True) -> None:
    """Write ``out/soak.json``, its rendering ``out/soak.md`` and ``out/soak.png``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    (out / "soak.md").write_text(markdown(result))
    if with_plot and result.get("samples"):
        plot(result, out / "soak.png")
