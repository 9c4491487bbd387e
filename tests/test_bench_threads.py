"""``--threads 1,2``: parsing the list, combining the runs into scaling.*, and one quick run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import options, report, threads
from benchmarks.protocol import Curve

REPO = Path(__file__).resolve().parents[1]

# -- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "counts", "single"),
    [
        ([], [1], 1),
        (["--threads", "4"], [4], 4),
        (["--threads", "1,2"], [1, 2], 1),
        (["--threads=4, 1,2,2"], [1, 2, 4], 1),
    ],
)
def test_threads_parses_one_count_or_a_sorted_list(
    argv: list[str], counts: list[int], single: int
) -> None:
    args = options.build_parser().parse_args(argv)
    assert args.thread_counts == counts
    assert args.threads == single and type(args.threads) is int


@pytest.mark.parametrize("bad", ["0", "-1", "a", "1,,2", "", "1.5", "2,0"])
def test_threads_refuses_bad_values_with_a_message(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        options.build_parser().parse_args(["--threads", bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --threads" in err and ("thread count" in err or ">= 1" in err), err


def test_child_argv_replaces_threads_and_out_however_they_were_spelt() -> None:
    names = [o for a in options.build_parser()._actions for o in a.option_strings]
    argv = [
        "--quick",
        "--threads",
        "1,2",
        "--out",
        "x",
        "--seeds=1",
        "--thr=1,2",
        "--ou=y",
        "--k",
        "8",
    ]
    got = threads.child_argv(argv, names, 2, Path("x") / "threads-2")
    assert got == [
        "--quick",
        "--seeds=1",
        "--k",
        "8",
        "--threads",
        "2",
        "--out",
        str(Path("x") / "threads-2"),
    ]


def test_default_out_is_the_single_runs_folder() -> None:
    parse = options.build_parser().parse_args
    assert threads.default_out(parse(["--threads", "1,2"])) == Path("bench-results/blobs")
    assert threads.default_out(parse(["--dataset", "mnist"])) == Path("bench-results/mnist")
    assert threads.default_out(parse(["--data", "d/my.npz"])) == Path("bench-results/my")


# -- combining ----------------------------------------------------------------------------

MACHINE = "## Machine and software\n\n- CPU: test CPU; 2 cores\n- Threads: 1\n"


def _curve(name: str, seed: int, seconds: list[float], energy: list[float]) -> Curve:
    return Curve(
        name,
        seed,
        seconds,
        energy,
        list(range(1, len(seconds) + 1)),
        n_steps=len(seconds),
        converged=True,
        notes={"stop": "converged"},
    )


def _write_run(
    folder: Path, n: int, curves: dict[int, dict[str, Curve]], refs: dict[int, float]
) -> None:
    """One child's curves.json, results.json and results.md, as paper.main writes them
    (each relative to its own E*_s)."""
    sub = folder / f"threads-{n}"
    sub.mkdir(parents=True)
    seeds = sorted(curves)
    own = {s: min([min(c.energy) for c in curves[s].values()] + [refs[s]]) for s in seeds}
    summary = report.summarize_all(curves, own)
    report.write_json(
        sub / "results.json",
        report.results_json(
            dataset="blobs",
            n_train=1000,
            n_test=200,
            dim=4,
            k=3,
            threads=n,
            seeds=seeds,
            estar=own,
            summary=summary,
        ),
    )
    report.write_json(
        sub / "curves.json",
        {
            "estar_per_seed": {str(s): own[s] for s in seeds},
            "references": {
                str(s): {"source": "test", "energy": refs[s], "iterations": 9} for s in seeds
            },
            "extra_algorithms": {},
            "curves": {str(s): {k: c.to_json() for k, c in curves[s].items()} for s in seeds},
        },
    )
    (sub / "results.md").write_text(
        f"# nmbatch benchmark: blobs\n\nCommand: `x`\n\nData: test blobs, threads {n}.\n\n"
        f"## Target check\n\n- x\n\n{MACHINE}\n## Method\n\n- protocol\n"
    )


def _scaled(curves: dict[str, Curve], seed: int, f: float) -> dict[str, Curve]:
    return {k: _curve(k, seed, c.seconds, [e * f for e in c.energy]) for k, c in curves.items()}


def _runs(tmp_path: Path, lloyd_2t: float) -> dict:
    """Seeds 0 and 1 (seed 1: every energy doubled). At 1 thread the runs' own E*_0 is
    the reference, 100.4; nmbatch at 2 threads reaches 100.0, the common E*_0."""
    one = {
        "nmbatch": _curve("nmbatch", 0, [0.1, 0.5, 1.0, 2.0], [200, 101.2, 100.9, 100.4]),
        "sklearn.lloyd": _curve("sklearn.lloyd", 0, [1.0, 6.0], [150, 100.6]),
        "sklearn.minibatch.1024": _curve("sklearn.minibatch.1024", 0, [0.2], [104]),
    }
    two = {
        "nmbatch": _curve("nmbatch", 0, [0.05, 0.25, 0.5, 1.0], [200, 101.5, 100.9, 100.0]),
        "sklearn.lloyd": _curve("sklearn.lloyd", 0, [0.5, lloyd_2t], [150, 100.6]),
        "sklearn.minibatch.1024": _curve("sklearn.minibatch.1024", 0, [0.1], [104]),
    }
    _write_run(tmp_path, 1, {0: one, 1: _scaled(one, 1, 2.0)}, {0: 100.4, 1: 200.8})
    _write_run(tmp_path, 2, {0: two, 1: _scaled(two, 1, 2.0)}, {0: 100.4, 1: 200.8})
    return threads.combine(tmp_path, [1, 2], command="python -m benchmarks x")


def test_combine_measures_every_thread_count_against_one_common_estar(tmp_path: Path) -> None:
    doc = _runs(tmp_path, lloyd_2t=1.5)
    assert doc["E_star_per_seed"] == {"0": 100.0, "1": 200.0}
    assert doc["E_star_per_seed_of_each_run"]["1"] == {"0": 100.4, "1": 200.8}
    ours = doc["algorithms"]["nmbatch"]
    # Against its own E*_0 = 100.4 the 1-thread run reached 1% (101.404) at 0.5 s (101.2);
    # against the common 100.0 (target 101.0) only at 1.0 s.
    assert (
        json.loads((tmp_path / "threads-1/results.json").read_text())["algorithms"]["nmbatch"][
            "time_to"
        ]["0.01"]
        == 0.5
    )
    assert ours["1"]["time_to"]["0.01"] == 1.0 and ours["2"]["time_to"]["0.01"] == 0.5
    assert ours["1"]["final_rel"] == pytest.approx(0.004)
    assert ours["2"]["final_rel"] == pytest.approx(0.0)
    assert doc["speedup"]["nmbatch"]["2"]["0.01"] == pytest.approx(2.0)
    assert doc["speedup"]["nmbatch"]["2"]["0.05"] == pytest.approx(2.0)
    assert doc["speedup"]["nmbatch"]["2"]["0.005"] == pytest.approx(2.0)  # 2.0 s -> 1.0 s
    assert doc["speedup"]["sklearn.lloyd"]["2"]["0.01"] == pytest.approx(4.0)  # 6 -> 1.5
    assert doc["speedup"]["sklearn.minibatch.1024"]["2"]["0.01"] is None  # never reached
    peer = doc["peer_ratio"]
    assert peer["1"]["fastest"] == "sklearn.lloyd" and peer["1"]["ratio"] == pytest.approx(6.0)
    assert peer["2"]["ratio"] == pytest.approx(3.0)
    assert list(doc["algorithms"]) == ["nmbatch", "sklearn.minibatch.1024", "sklearn.lloyd"]
    assert doc == json.loads((tmp_path / "scaling.json").read_text())
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scaling_md_marks_each_target_met_or_not_met(tmp_path: Path) -> None:
    doc = _runs(tmp_path, lloyd_2t=1.5)
    met = {t["name"]: t["met"] for t in doc["targets"]}
    assert met == {"own_speedup": True, "peer_ratio": False, "final_energy": True}
    md = (tmp_path / "scaling.md").read_text()
    lines = {t["name"]: t["line"] for t in doc["targets"]}
    assert (
        "in at most 0.6x its own 1-thread time: **met** (0.5 s at 2 threads / 1 s at 1"
        in lines["own_speedup"]
    )
    assert "at least 4x sooner than the fastest exact peer" in lines["peer_ratio"]
    assert "**not met** (3.00x" in lines["peer_ratio"]
    assert "within 0.5% of E*_s: **met** (0.40% at 1 thread(s); 0.00% at 2" in lines["final_energy"]
    for line in lines.values():
        assert line in md
    for needle in (
        "# nmbatch thread scaling: blobs",
        "Command: `python -m benchmarks x`",
        "Data: test blobs, threads 1.",
        "| nmbatch | 1 | 0.5 | 0.5 | 1 | 2 | 0.40% |",
        "| nmbatch | 1 | 0.40% | 0.5 | 0.00% | 2.00x |",
        "| nmbatch | 2 | 0.25 (2.00x) | 0.25 (2.00x) | 0.5 (2.00x) | 1 (2.00x) | 0.00% |",
        MACHINE.splitlines()[2],
        "## Machine and software",
    ):
        assert needle in md, needle
    assert "## Method" not in md

    other = tmp_path / "faster-peer-lost"
    other.mkdir()
    doc = _runs(other, lloyd_2t=2.5)  # the peer reaches 1% at 2.5 s: 5x nmbatch's 0.5 s
    assert {t["name"]: t["met"] for t in doc["targets"]}["peer_ratio"] is True
    assert "**met** (5.00x" in (other / "scaling.md").read_text()


# -- end to end ---------------------------------------------------------------------------


def test_quick_run_at_two_thread_counts_writes_the_scaling_table(tmp_path: Path) -> None:
    out = tmp_path / "scaling"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--dataset",
            "blobs",
            "--threads",
            "1,2",
            "--algorithms",
            "nmbatch,sklearn.lloyd",
            "--seeds",
            "1",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=dict(os.environ, MPLBACKEND="Agg"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for n in (1, 2):
        res = json.loads((out / f"threads-{n}" / "results.json").read_text())
        assert res["threads"] == n and list(res["algorithms"]) == ["nmbatch", "sklearn.lloyd"]
    doc = json.loads((out / "scaling.json").read_text())
    assert doc["threads"] == [1, 2] and list(doc["algorithms"]) == ["nmbatch", "sklearn.lloyd"]
    md = (out / "scaling.md").read_text()
    assert md in proc.stdout
    assert md.count("**met**") + md.count("**not met**") == 3
    assert "- Threads: 1 (BLAS" in md and "--threads 1,2" in md
    assert (out / "scaling.png").is_file()
