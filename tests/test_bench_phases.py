"""``python -m benchmarks.phases``: the Amdahl fit and projection, the phase timer,
the peers file, and one quick run at 1 and 2 threads end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import peak, phases

REPO = Path(__file__).resolve().parents[1]

# -- Amdahl's law -------------------------------------------------------------------------


def test_projection_is_amdahls_law() -> None:
    assert phases.amdahl_time(10.0, 0.5, 8) == pytest.approx(10.0 * (0.5 + 0.5 / 8))
    assert phases.amdahl_time(10.0, 0.0, 64) == pytest.approx(10.0)
    assert phases.amdahl_time(10.0, 1.0, 16) == pytest.approx(10.0 / 16)
    got = phases.project([1, 2], [10.0, 6.0], [8, 16, 64])
    f = 2 * (1 - 6.0 / 10.0)
    assert got["f"] == pytest.approx(f) and got["t1"] == pytest.approx(10.0)
    assert set(got["projected"]) == {"8", "16", "64"}
    for p in (8, 16, 64):
        assert got["projected"][str(p)] == pytest.approx(10.0 * ((1 - f) + f / p))


@pytest.mark.parametrize("f", [0.0, 0.3, 0.75, 1.0])
@pytest.mark.parametrize("counts", [[1, 2], [1, 2, 4], [2, 4, 8], [1, 3, 16]])
def test_fit_recovers_a_synthetic_parallel_fraction(f: float, counts: list[int]) -> None:
    times = [phases.amdahl_time(7.0, f, p) for p in counts]
    got_f, t1 = phases.amdahl_fit(counts, times)
    assert got_f == pytest.approx(f, abs=1e-9) and t1 == pytest.approx(7.0)


def test_fit_with_two_counts_is_the_two_point_formula() -> None:
    t1, t2 = 4.0, 2.6
    f, got_t1 = phases.amdahl_fit([1, 2], [t1, t2])
    assert f == pytest.approx((1 - t2 / t1) / (1 - 1 / 2)) and got_t1 == t1


def test_fit_clips_to_zero_and_one_and_keeps_the_one_thread_time() -> None:
    f, t1 = phases.amdahl_fit([1, 2], [1.0, 3.0])  # slower on two threads
    assert f == 0.0 and t1 == 1.0
    f, t1 = phases.amdahl_fit([1, 2], [1.0, 0.3])  # faster than linear
    assert f == 1.0 and t1 == 1.0
    f, t1 = phases.amdahl_fit([1, 2, 4], [1.0, 0.6, 0.45])  # noisy: least squares
    assert 0.0 < f < 1.0 and t1 == 1.0


def test_fit_needs_two_thread_counts() -> None:
    assert phases.amdahl_fit([2], [3.0]) == (None, 3.0)
    assert phases.amdahl_fit([1, 1], [3.0, 5.0]) == (None, 4.0)
    assert phases.project([4], [1.0], [8])["projected"] == {"8": None}


# -- the peers file -----------------------------------------------------------------------


def test_peers_read_the_simple_format_and_the_benchs_scaling_json(tmp_path: Path) -> None:
    simple = tmp_path / "simple.json"
    simple.write_text(json.dumps({"faiss": {"1": 2.0, "2": 1.2}, "never": {"1": None}}))
    assert phases.read_peers(simple) == {"faiss": {1: 2.0, 2: 1.2}}
    scaling = tmp_path / "scaling.json"
    row = {"time_to": {"0.05": 0.1, "0.01": 0.5}, "final_rel": 0.0}
    scaling.write_text(json.dumps({"threads": [1, 2], "algorithms": {
        "sklearn.lloyd": {"1": row, "2": {**row, "time_to": {"0.01": 0.3}}},
        "mbatch": {"1": {"time_to": {"0.01": None}}},
    }}))  # fmt: skip
    assert phases.read_peers(scaling) == {"sklearn.lloyd": {1: 0.5, 2: 0.3}}


# -- the phase timer ----------------------------------------------------------------------


def test_timer_counts_each_phase_exclusively_and_by_context() -> None:
    timer = phases.PhaseTimer()

    def kernel() -> None:
        time.sleep(0.02)

    wrapped_kernel = timer.wrap(kernel, lambda c: f"{c or 'revisit'}: kernel", nbytes=lambda: 8)

    def assign() -> None:
        time.sleep(0.01)
        wrapped_kernel()

    wrapped_assign = timer.wrap(assign, "other", context="assign new")

    def step() -> None:
        wrapped_assign()
        wrapped_kernel()

    t0 = time.perf_counter()
    timer.wrap(step, "other")()
    total = time.perf_counter() - t0
    table = timer.table()
    assert set(table) == {"other", "assign new: kernel", "revisit: kernel"}
    assert table["assign new: kernel"]["seconds"] >= 0.02
    assert table["assign new: kernel"]["bytes"] == 8 and table["other"]["bytes"] is None
    assert 0.01 <= table["other"]["seconds"] < 0.02 + 0.01
    assert sum(r["seconds"] for r in table.values()) == pytest.approx(total, abs=2e-3)


# -- end to end ---------------------------------------------------------------------------


def test_quick_blobs_run_at_one_and_two_threads(tmp_path: Path) -> None:
    out = tmp_path / "phases"
    peers = tmp_path / "peers.json"
    peers.write_text(json.dumps({"sklearn.lloyd": {"1": 2.0, "2": 1.25}}))
    argv = ["--dataset", "blobs", "--quick", "--threads", "1,2", "--out", str(out),
            "--peers", str(peers)]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.phases", *argv],
        cwd=REPO, env=dict(os.environ, MPLBACKEND="Agg"), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.perf_counter() - t0 < 60
    doc = json.loads((out / "phases.json").read_text())
    assert doc["threads"] == [1, 2] and doc["project_to"] == [8, 16, 64]
    assert doc["dataset"] == "blobs" and doc["k"] == 50
    assert doc["n_steps"]["1"] == doc["n_steps"]["2"] > 1
    assert doc["identical"] and doc["max_abs_diff"] == 0.0, doc["centroids_sha256"]
    assert doc["numba_threads"] == {"1": 1, "2": 2} or os.cpu_count() == 1
    for name in ("assign new: BLAS product", "assign new: assign kernel",
                 "revisit: bound sweep", "update centroids", "other"):  # fmt: skip
        assert name in doc["phases"], sorted(doc["phases"])
    for ph in doc["phases"].values():
        assert set(ph) >= {"seconds", "share", "calls", "bytes", "gbps", "f", "projected"}
        assert ph["f"] is None or 0.0 <= ph["f"] <= 1.0
        assert all(s >= 0.0 for s in ph["seconds"].values())
    sweep = doc["phases"]["revisit: bound sweep"]
    assert sweep["bytes"] > 0 and sweep["gbps"]["1"] > 0
    total = doc["total"]
    for n in ("1", "2"):  # the phases account for the step time measured around step()
        assert total["phase_sum"][n] == pytest.approx(total["seconds"][n], rel=0.02, abs=2e-3)
        assert sum(ph["share"][n] for ph in doc["phases"].values()) == pytest.approx(1, abs=0.03)
        assert doc["bandwidth"][n]["sum_gbps"] > 0 and doc["bandwidth"][n]["copy_gbps"] > 0
    assert len(doc["step_seconds"]["1"]) == doc["n_steps"]["1"] and len(doc["load"]["2"]) == 2
    for p in ("8", "16", "64"):
        assert total["projected_from_phases"][p] == pytest.approx(
            sum(ph["projected"][p] for ph in doc["phases"].values())
        )
    peer = doc["peers"]["sklearn.lloyd"]
    assert peer["f"] == pytest.approx(0.75) and math.isclose(
        peer["projected"]["8"], 2.0 * (0.25 + 0.75 / 8)
    )
    md = (out / "phases.md").read_text()
    assert md in proc.stdout and "bit-identical across thread counts: **yes**" in md
    assert "| phase | 1t s | 2t s | share 1t | share 2t | f | 8 cores s |" in md
    assert "## Memory bandwidth" in md and "sklearn.lloyd" in md and "## Machine" in md
    for n in ("1", "2"):  # the peak, at each thread count, and the fit against it
        assert doc["peak"][n]["gflops"] > 0 and doc["peak"][n]["threads"] == int(n)
        assert doc["lloyd_at_peak"][n] > 0
    assert "## Fraction of the machine's peak" in md and "Lloyd at the peak" in md
    assert (out / "phases.png").stat().st_size > 0


def test_peak_fractions_are_seconds_at_the_peak_over_seconds() -> None:
    """A product phase at the peak is 100%; its kernel's fraction is the peak product's
    time over the kernel's; the fit's reference is b k pairs per step at the peak."""
    d, k, rows = 10, 20, 1000  # 2 d k rows = 400,000 flops: 1 ms at 0.4 GFLOP/s
    phase = lambda s, b: {"seconds": {"2": s}, "bytes": b}  # noqa: E731
    doc = {"dim": d, "k": k, "peak": {"2": {"gflops": 0.4}}, "phases": {
        "assign new: BLAS product": phase(1e-3, rows * 4 * (d + k)),
        "assign new: assign kernel": phase(4e-3, 1),
        "revisit: bound sweep": phase(1.0, 1),
    }}  # fmt: skip
    got = peak.peak_table(doc)
    whole = "assign new: dense pass (all of the above)"
    assert set(got) == {"assign new: BLAS product", "assign new: assign kernel", whole}
    assert got[whole]["2"] == pytest.approx(0.2)
    pooled = {**doc, "phases": {**doc["phases"],
                                "assign new: pooled product and kernel": phase(1e-3, 1)}}
    only = peak.peak_table(pooled)  # the whole pass only (the product phase holds no BLAS)
    assert set(only) == {whole} and only[whole]["2"] == pytest.approx(1 / 6)
    assert got["assign new: BLAS product"]["pairs"] == rows * k
    assert got["assign new: BLAS product"]["2"] == pytest.approx(1.0)
    assert got["assign new: assign kernel"]["2"] == pytest.approx(0.25)
    assert peak.lloyd_at_peak([500, 500], d, k, 0.4) == pytest.approx(1e-3)


def test_gemm_peak_times_the_shape_at_the_thread_count() -> None:
    got = peak.gemm_peak(16, 32, 1, rows=256, repeats=1)
    assert got["gflops"] > 0
    assert (got["rows"], got["d"], got["k"], got["threads"]) == (256, 16, 32, 1)
    assert got["gflops"] == pytest.approx(2 * 256 * 16 * 32 / got["seconds"] / 1e9)


@pytest.mark.parametrize("bad", ["0", "1,0", "a", "1,,2"])
def test_thread_counts_must_be_positive_integers(bad: str) -> None:
    with pytest.raises(SystemExit):
        phases.build_parser().parse_args(["--threads", bad])
    assert phases.build_parser().parse_args(["--threads", "4,1,2,2"]).threads == [1, 2, 4]
