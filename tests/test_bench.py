"""The benchmark (benchmarks): its quick run end to end, and its measuring parts."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import datasets, peers, protocol, report
from benchmarks.protocol import Budget, Curve, Snapshot
from nmbatch.engine import NestedBatchStore, energy

REPO = Path(__file__).resolve().parents[1]
EPS_KEYS = ["0.05", "0.02", "0.01", "0.005"]
NAMES = [
    "nmbatch", "nmbatch.deact", "mbatch", "mbatch.remove", "lloyd", "elkan",
    "sklearn.minibatch.5000", "sklearn.minibatch.1024", "sklearn.lloyd", "sklearn.elkan",
    "faiss", "faiss.subsampled",
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "quick"
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--rho-study", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_quick_run_results_json_has_exactly_the_schema(quick_run: Path) -> None:
    doc = json.loads((quick_run / "results.json").read_text())
    assert list(doc) == [
        "dataset", "n_train", "n_test", "dim", "k", "threads", "seeds", "E_star",
        "E_star_per_seed", "algorithms",
    ]
    assert isinstance(doc["dataset"], str)
    for key in ("n_train", "n_test", "dim", "k", "threads"):
        assert type(doc[key]) is int and doc[key] > 0
    assert doc["k"] == 50 and doc["threads"] == 1
    assert doc["seeds"] and all(type(s) is int for s in doc["seeds"])
    assert len(doc["E_star_per_seed"]) == len(doc["seeds"])
    assert all(type(e) is float and e > 0 for e in doc["E_star_per_seed"])
    assert doc["E_star"] == min(doc["E_star_per_seed"])
    assert list(doc["algorithms"]) == NAMES
    for name, row in doc["algorithms"].items():
        assert list(row) == ["time_to", "final_rel"], name
        assert list(row["time_to"]) == EPS_KEYS, name
        for t in row["time_to"].values():
            assert t is None or (type(t) is float and t >= 0.0), name
        # E*_s is the lowest energy any run reached, so no run ends below it.
        assert type(row["final_rel"]) is float and row["final_rel"] >= 0.0, name
        # Reaching a tighter level implies having reached the looser ones, no later.
        times = [math.inf if t is None else t for t in row["time_to"].values()]
        assert times == sorted(times), name


def test_quick_run_writes_markdown_plot_curves_and_rho_study(quick_run: Path) -> None:
    md = (quick_run / "results.md").read_text()
    for needle in ("| nmbatch |", "## Target check", "JIT", "Threads: 1", "BLAS", "load average",
                   "python -m benchmarks --quick", "## rho study", "numpy "):
        assert needle in md, needle
    assert (quick_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = json.loads((quick_run / "curves.json").read_text())
    assert set(curves["curves"]["0"]) == set(NAMES)
    rho = json.loads((quick_run / "rho_study.json").read_text())["rho_study"]
    assert sorted(rho) == sorted(
        f"{v} rho={r}" for v in ("nmbatch", "nmbatch.deact") for r in (1, 10, 100, 1000)
    )


# -- protocol ---------------------------------------------------------------------------


def test_time_to_is_the_first_time_at_or_below_the_target() -> None:
    c = Curve("x", 0, seconds=[1.0, 2.0, 3.0, 4.0], energy=[10.0, 5.0, 6.0, 4.0])
    assert protocol.time_to(c, 5.0) == 2.0
    assert protocol.time_to(c, 4.5) == 4.0
    assert protocol.time_to(c, 3.9) == math.inf
    assert protocol.value_at(c, 0.5) == math.inf
    assert protocol.value_at(c, 3.5) == 6.0


def test_median_counts_never_as_infinite() -> None:
    assert protocol.median_or_none([1.0, 3.0, math.inf]) == 3.0
    assert protocol.median_or_none([1.0, math.inf]) is None
    assert protocol.median_or_none([1.0, 2.0]) == 1.5


def test_summarize_is_relative_to_each_seeds_own_best() -> None:
    curves = {
        0: {"a": Curve("a", 0, seconds=[1.0, 2.0], energy=[110.0, 100.0])},
        1: {"a": Curve("a", 1, seconds=[1.0, 2.0], energy=[220.0, 204.0])},
    }
    out = protocol.summarize(curves, {0: 100.0, 1: 200.0}, ["a"])
    # seed 0 reaches 5% at 2 s, seed 1 (204 <= 210) at 2 s; 1% only seed 0: median never
    assert out["a"]["time_to"] == {"0.05": 2.0, "0.02": 2.0, "0.01": None, "0.005": None}
    assert out["a"]["final_rel"] == pytest.approx(0.01)


def test_record_evaluates_first_steps_grid_points_and_the_last_snapshot() -> None:
    rng = np.random.default_rng(0)
    test = rng.normal(size=(50, 3)).astype(np.float32)
    cents = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(6)]
    times = [1.0, 2.0, 2.1, 2.2, 5.0, 5.1]

    def trace():
        for i, (t, c) in enumerate(zip(times, cents, strict=True)):
            yield Snapshot(t, c, i + 1)
        return {"stop": "budget"}

    curve = protocol.record("r", trace(), test, 7, eval_grid=0.5, first_steps=2)
    # iterations 1, 2 (first steps); 5 (5.0 - 2.0 >= 0.5 * 5.0); 6 (the last one)
    assert curve.iteration == [1, 2, 5, 6]
    assert curve.seconds == [1.0, 2.0, 5.0, 5.1]
    assert curve.n_steps == 6 and curve.notes == {"stop": "budget"}
    brute = [float(((test[:, None] - cents[i - 1][None]) ** 2).sum(-1).min(1).mean())
             for i in curve.iteration]
    assert curve.energy == pytest.approx(brute, rel=1e-6)


def test_shuffled_problem_starts_every_algorithm_from_the_first_k_shuffled_rows() -> None:
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    p = protocol.shuffled_problem(X, 3, 5)
    assert np.array_equal(p.train, X[np.random.default_rng(3).permutation(20)])
    assert np.array_equal(p.init, p.train[:5]) and p.k == 5


# -- peers ------------------------------------------------------------------------------


def _small_problem(seed: int = 0) -> tuple[protocol.Problem, np.ndarray]:
    ds = datasets.make_blobs(n_train=3000, n_test=500, dim=8, centers=6, seed=seed)
    return protocol.shuffled_problem(ds.train, seed, 10, batch_size=500), ds.test


@pytest.mark.parametrize("algorithm", ["lloyd", "elkan"])
def test_sklearn_kmeans_sampling_follows_an_ordinary_fit(algorithm: str) -> None:
    from sklearn.cluster import KMeans

    problem, _ = _small_problem()
    snaps = list(peers.sklearn_kmeans(algorithm)(problem, Budget(60.0, 300)))
    est = KMeans(10, init=problem.init, n_init=1, algorithm=algorithm).fit(problem.train)
    assert len(snaps) == est.n_iter_
    assert [s.iteration for s in snaps] == list(range(1, est.n_iter_ + 1))
    np.testing.assert_allclose(snaps[-1].centroids, est.cluster_centers_, rtol=0, atol=1e-4)
    assert all(a.seconds < b.seconds for a, b in itertools.pairwise(snaps))


def test_sklearn_kmeans_sampling_stops_at_max_iter_and_restores_the_kernel() -> None:
    import sklearn.cluster._kmeans as km

    kernel = km.lloyd_iter_chunked_dense
    problem, _ = _small_problem()
    snaps = list(peers.sklearn_kmeans("lloyd")(problem, Budget(60.0, 2)))
    assert len(snaps) == 2
    assert km.lloyd_iter_chunked_dense is kernel


def test_faiss_chain_of_single_iterations_is_one_run() -> None:
    import faiss

    problem, _ = _small_problem()
    snaps = list(peers.faiss_full()(problem, Budget(60.0, 5)))
    km = faiss.Kmeans(8, 10, niter=5, max_points_per_centroid=10**6, seed=problem.seed)
    km.train(problem.train, init_centroids=problem.init)
    assert len(snaps) == 5
    np.testing.assert_allclose(snaps[-1].centroids, km.centroids, rtol=1e-5, atol=1e-4)


def test_faiss_subsampled_gives_one_point_per_fresh_run_in_time_order() -> None:
    problem, _ = _small_problem()
    snaps = list(peers.faiss_subsampled(niter=6)(problem, Budget(60.0, 100)))
    assert [s.iteration for s in snaps] == [1, 2, 3, 4, 5, 6]
    assert all(a.seconds <= b.seconds for a, b in itertools.pairwise(snaps))
    assert all(s.evaluate for s in snaps)


def test_minibatch_peer_starts_from_the_given_centroids() -> None:
    problem, test = _small_problem()
    first = next(peers.sklearn_minibatch(200)(problem, Budget(60.0, 1)))
    # One step of a mini-batch of 200 moves the centroids, but they are still near C0.
    assert first.centroids.shape == problem.init.shape
    assert energy(test, first.centroids) < 2 * energy(test, problem.init)


# -- data -------------------------------------------------------------------------------


def test_patches_are_6x6x3_on_a_stride_2_grid_with_20000_held_out() -> None:
    ds = datasets.make_patches()
    assert ds.dim == 108 and ds.test.shape == (20_000, 108)
    assert ds.train.shape[0] + ds.test.shape[0] == 2 * 211 * 318
    assert ds.train.dtype == np.float32 and ds.train.flags.c_contiguous


def test_deformation_without_displacement_is_the_identity() -> None:
    imgs = np.random.default_rng(0).integers(0, 256, size=(5, 784), dtype=np.uint8)
    out = datasets.deform_digits(imgs, np.random.default_rng(1), alpha=0.0, max_shift=0.0)
    assert np.array_equal(out, imgs)


def test_infmnist_is_deterministic_and_cached_where_told(tmp_path: Path) -> None:
    digits = np.random.default_rng(0).integers(0, 256, size=(30, 784), dtype=np.uint8)
    src = tmp_path / "mini.npz"
    np.savez(src, train=digits, test=digits[:7])
    cache = tmp_path / "cache"
    a = datasets.make_infmnist(src, n=50, seed=3, cache_dir=cache, chunk=20)
    assert len(list(cache.glob("infmnist-*.npy"))) == 1
    b = datasets.make_infmnist(src, n=50, seed=3, cache_dir=cache, chunk=20)
    c = datasets.make_infmnist(src, n=50, seed=4, cache_dir=cache, chunk=20)
    assert len(list(cache.glob("infmnist-*.npy"))) == 2
    assert a.train.shape == (50, 784) and a.test.shape == (7, 784)
    assert a.train.dtype == np.float32
    assert np.array_equal(a.train, b.train) and not np.array_equal(a.train, c.train)
    assert np.array_equal(a.test, digits[:7].astype(np.float32))


def test_infmnist_digit_i_comes_from_source_i_mod_n(tmp_path: Path) -> None:
    digits = np.random.default_rng(0).integers(0, 256, size=(30, 784), dtype=np.uint8)
    np.savez(tmp_path / "mini.npz", train=digits, test=digits[:7])
    ds = datasets.make_infmnist(
        tmp_path / "mini.npz", n=50, cache_dir=tmp_path, chunk=20, alpha=0.0, max_shift=0.0
    )
    assert np.array_equal(ds.train, digits[np.arange(50) % 30].astype(np.float32))


def test_load_npz_casts_to_float32_and_checks_keys(tmp_path: Path) -> None:
    np.savez(tmp_path / "ok.npz", train=np.ones((4, 3), np.uint8), test=np.ones((2, 3), int))
    ds = datasets.load_npz(tmp_path / "ok.npz")
    assert ds.train.dtype == np.float32 and ds.test.dtype == np.float32 and ds.dim == 3
    np.savez(tmp_path / "bad.npz", train=np.ones((4, 3)))
    with pytest.raises(ValueError, match="test"):
        datasets.load_npz(tmp_path / "bad.npz")


# -- report -----------------------------------------------------------------------------


def _summary(ours: float | None, deact: float | None, exact: float | None) -> dict:
    def row(t: float | None) -> dict:
        return {"time_to": dict.fromkeys(EPS_KEYS, t), "final_rel": 0.0}

    return {
        "nmbatch": row(ours), "nmbatch.deact": row(deact), "sklearn.lloyd": row(exact),
        "sklearn.minibatch.1024": row(None),
    }


def test_target_check_reports_met_and_not_met_with_ratios() -> None:
    lines = report.target_check(_summary(1.0, 2.0, 3.5))
    assert "**met** (3.50x)" in lines[0]
    assert "**met**" in lines[1] and "peer never reached" in lines[1]
    assert "**met** (2.00x)" in lines[2]
    lines = report.target_check(_summary(1.0, 1.2, 2.0))
    assert "**not met** (2.00x)" in lines[0] and "**not met** (1.20x)" in lines[2]
    assert "nmbatch never reached" in report.target_check(_summary(None, 1.0, 1.0))[0]


def _final_centroids(runner, problem: protocol.Problem) -> np.ndarray:
    last = None
    for snap in runner(problem, Budget(60.0, 40)):
        last = snap.centroids.copy()
    return last


def test_nmbatch_strict_is_nmbatch_with_the_papers_doubling_test() -> None:
    from benchmarks.ours import run_ours
    from nmbatch.engine import make_algorithm

    ds = datasets.make_blobs(n_train=4000, n_test=100, dim=6, centers=40, seed=2)
    problem = protocol.shuffled_problem(ds.train, 2, 60, batch_size=300)  # 20 k > 300

    def direct(strict: bool) -> np.ndarray:
        store = NestedBatchStore(problem.train.shape[1], seed=problem.seed)
        store.append(problem.train)
        algo = make_algorithm("nmbatch", store, problem.k, init=problem.init,
                              rho=problem.rho, batch_size=problem.batch_size,
                              random_state=problem.seed)
        if strict:
            algo.doubling_tolerance, algo.large_k_rho = 0.0, float("inf")
        for _ in range(40):
            if algo.step().converged:
                break
        return algo.centroids

    strict = _final_centroids(run_ours("nmbatch.strict"), problem)
    tolerant = _final_centroids(run_ours("nmbatch"), problem)
    assert np.array_equal(strict, direct(True))
    assert np.array_equal(tolerant, direct(False))
    assert not np.array_equal(strict, tolerant)  # the tolerance changed the run


def test_nmbatch_swap_is_nmbatch_with_cluster_swaps() -> None:
    from benchmarks.ours import run_ours
    from nmbatch.engine import make_algorithm

    ds = datasets.make_blobs(n_train=4000, n_test=100, dim=6, centers=40, seed=2)
    problem = protocol.shuffled_problem(ds.train, 2, 60, batch_size=300)
    store = NestedBatchStore(problem.train.shape[1], seed=problem.seed)
    store.append(problem.train)
    algo = make_algorithm("nmbatch", store, problem.k, init=problem.init, rho=problem.rho,
                          batch_size=problem.batch_size, random_state=problem.seed,
                          swap=True)  # fmt: skip
    swaps = 0
    for _ in range(40):
        stats = algo.step()
        swaps += len(algo.last_swaps)
        if stats.converged:
            break
    assert swaps > 0
    assert np.array_equal(_final_centroids(run_ours("nmbatch.swap"), problem), algo.centroids)
    # k = 60 > batch_size / 20: nmbatch's default makes swaps; nmbatch.noswap does not.
    assert np.array_equal(_final_centroids(run_ours("nmbatch"), problem), algo.centroids)
    assert not np.array_equal(_final_centroids(run_ours("nmbatch.noswap"), problem), algo.centroids)
