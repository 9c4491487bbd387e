"""The large-k benchmark (``python -m benchmarks --large-k``) end to end on tiny
data, and its memory measurement (``benchmarks/memory.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import large_k
from benchmarks.memory import measure_memory, memory_markdown, read_status_kib

REPO = Path(__file__).resolve().parents[1]
EPS_KEYS = ["0.05", "0.02", "0.01", "0.005"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("large-k") / "out"
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--large-k", "--dataset", "blobs",
         "--max-train", "16000", "--max-test", "500", "--budget", "0.2", "--warmup", "0.01",
         "--prefault-gb", "0", "--ks", "8,64", "--memory-n", "16000",
         "--memory-iterations", "1", "--algorithms", "nmbatch,faiss", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_one_folder_per_k_and_the_summary(tiny_run: Path) -> None:
    for k in (8, 64):
        sub = tiny_run / f"blobs-k{k}"
        for name in ("results.json", "results.md", "curves.json", "curves.png", "memory.json"):
            assert (sub / name).is_file(), (k, name)
        assert json.loads((sub / "results.json").read_text())["k"] == k
    doc = json.loads((tiny_run / "large_k.json").read_text())
    assert [(r["dataset"], r["k"]) for r in doc["runs"]] == [("blobs", 8), ("blobs", 64)]
    for run in doc["runs"]:
        assert run["seeds"] == [0] and run["threads"] == 1 and run["n_train"] == 16000
        assert list(run["algorithms"]) == ["nmbatch", "faiss"]
        for row in run["algorithms"].values():
            assert list(row["time_to"]) == EPS_KEYS
        # E*_s: the lowest of every run and of the reference Lloyd run.
        assert run["references"]["0"]["energy"] >= run["E_star"]
        assert [m["name"] for m in run["memory"]] == ["nmbatch", "faiss"]
    md = (tiny_run / "large_k.md").read_text()
    assert "## blobs, k = 8 " in md and "## blobs, k = 64 " in md
    assert "## Memory per sample" in md
    assert md.count("\n| nmbatch | ") == 2  # one time table per k
    assert (tiny_run / "large_k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_memory_per_sample_counts_the_bounds_and_the_store(tiny_run: Path) -> None:
    doc = json.loads((tiny_run / "large_k.json").read_text())
    d = doc["runs"][0]["dim"]
    per = {(r["k"], m["name"]): m for r in doc["runs"] for m in r["memory"]}
    for k in (8, 64):
        ours = per[(k, "nmbatch")]["bytes_per_sample"]
        # At least its copy of the row (4d) and its upper bound; at most that, one lower
        # bound per centroid and 120 bytes of labels, norms, ids and distances.
        assert 4 * d + 8 <= ours <= 4 * d + 4 * k + 128, (k, ours)
        assert per[(k, "faiss")]["bytes_per_sample"] < 64  # faiss reads X in place
    for m in per.values():
        assert [r["n"] for r in m["runs"]] == [8000, 16000]
        assert all(r["added_bytes"] > 0 for r in m["runs"] if r["name"] == "nmbatch")


def test_summarize_only_rebuilds_the_summary_from_the_folders(tiny_run: Path) -> None:
    before = json.loads((tiny_run / "large_k.json").read_text())
    (tiny_run / "large_k.md").unlink()
    (tiny_run / "large_k.json").unlink()
    assert large_k.main(["--summarize-only", "--out", str(tiny_run)]) == 0
    assert json.loads((tiny_run / "large_k.json").read_text()) == before
    assert "## blobs, k = 64 " in (tiny_run / "large_k.md").read_text()


def test_large_k_refuses_a_single_k() -> None:
    with pytest.raises(SystemExit, match="--ks"):
        large_k.main(["--k", "256"])
    with pytest.raises(SystemExit, match="positive"):
        large_k.main(["--ks", "0,256"])


def test_an_algorithm_without_per_sample_state_adds_about_nothing_per_sample() -> None:
    # sklearn.minibatch keeps nothing per sample; the slope must be near zero, while the
    # resident-memory reading itself works on this system.
    assert read_status_kib("VmRSS") > 0
    X = np.random.default_rng(0).standard_normal((6000, 8)).astype(np.float32)
    rows = measure_memory(X, ["sklearn.minibatch.1024"], 4, iterations=2)
    assert abs(rows[0]["bytes_per_sample"]) < 64
    assert "sklearn.minibatch.1024" in "\n".join(memory_markdown(rows))
