"""The ``nmbatch`` command-line tool: help, ``fit``, ``serve``, ``bench``.

The parser and dispatch are ``nmbatch/cli.py``; ``fit`` runs in ``engine/fit.py``,
``serve`` in ``service/cli.py``, ``bench`` in ``benchmarks/`` (from a checkout only).
``fit`` runs in-process (one numba start-up for the module); ``--help``, the lazy-import
guarantees and ``serve`` run ``python -m nmbatch.cli`` in a subprocess, as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from nmbatch import cli
from nmbatch.service import cli as serve_cli
from nmbatch.service.embedded_redis import free_port
from tests import testkit

REPO = Path(__file__).resolve().parents[1]


def run_python(
    *args: str, timeout: float = 120, check: bool = False, **kwargs: object
) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root (also on ``PYTHONPATH``), output captured.

    ``env`` adds variables to this process's environment; ``check=True`` raises on a
    non-zero exit status.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.update(kwargs.pop("env", {}))  # type: ignore[arg-type]
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        **kwargs,  # type: ignore[arg-type]
    )


def run_cli(*args: str, **kwargs: object) -> subprocess.CompletedProcess:
    """``python -m nmbatch.cli ARGS``, as :func:`run_python`."""
    return run_python("-m", "nmbatch.cli", *args, **kwargs)  # type: ignore[arg-type]


def brute_force_labels(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Index of the nearest row of ``C`` for every row of ``X``, in float64 by brute force."""
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    d2 = ((X64[:, None, :] - C64[None, :, :]) ** 2).sum(axis=2)
    return d2.argmin(axis=1)


@pytest.fixture(scope="module")
def four_blobs() -> np.ndarray:
    """600 samples, ``(600, 3)`` float32, around 4 well separated means."""
    return testkit.blobs(600, 3, 4, seed=7, separation=20.0)


# -- help ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], ["serve"], ["fit"], ["bench"]])
def test_help_exits_zero_and_describes_the_command(command: list[str]) -> None:
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_top_level_help_lists_every_subcommand() -> None:
    result = run_cli("--help")
    for command in ("serve", "fit", "bench"):
        assert command in result.stdout


def test_no_subcommand_is_a_usage_error() -> None:
    result = run_cli()
    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_help_imports_neither_numpy_nor_the_service() -> None:
    code = (
        "import sys\n"
        "from nmbatch.cli import main\n"
        "try:\n"
        "    main(['fit', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('numpy', 'numba', 'fastapi', 'uvicorn') if m in sys.modules))\n"
    )
    result = run_python("-c", code, timeout=60, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_console_script_entry_point_is_cli_main() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["nmbatch"] == "nmbatch.cli:main"


def test_algorithm_choices_are_the_engines() -> None:
    from nmbatch.engine import ALGORITHMS

    assert tuple(cli.ALGORITHM_CHOICES) == tuple(ALGORITHMS)


# -- fit ----------------------------------------------------------------------------------
def fit(tmp_path: Path, data: Path, *extra: str, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Run ``nmbatch fit`` in-process; return the centroids and labels it wrote."""
    centroids, labels = tmp_path / "centroids.npy", tmp_path / "labels.npy"
    code = cli.main(
        [
            "fit", str(data), "-k", str(k), "--centroids", str(centroids),
            "--labels", str(labels), "--batch-size", "100", "--seed", "3", *extra,
        ]
    )  # fmt: skip
    assert code == 0
    return np.load(centroids, allow_pickle=False), np.load(labels, allow_pickle=False)


def assert_is_kmeans_solution(X: np.ndarray, C: np.ndarray, labels: np.ndarray, k: int) -> None:
    assert C.shape == (k, X.shape[1])
    assert labels.shape == (X.shape[0],)
    np.testing.assert_array_equal(labels, brute_force_labels(X, C))


def test_fit_npy_writes_centroids_and_nearest_centroid_labels(
    tmp_path: Path, four_blobs: np.ndarray
) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    C, labels = fit(tmp_path, tmp_path / "x.npy")
    assert_is_kmeans_solution(four_blobs, C, labels, 4)


def test_fit_converged_centroids_are_the_means_of_their_samples(
    tmp_path: Path, four_blobs: np.ndarray
) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    C, labels = fit(tmp_path, tmp_path / "x.npy", "--max-iter", "1000")
    for j in range(4):
        np.testing.assert_allclose(C[j], four_blobs[labels == j].mean(axis=0), rtol=1e-5, atol=1e-5)


def test_fit_matches_the_estimator_with_the_same_seed(
    tmp_path: Path, four_blobs: np.ndarray
) -> None:
    from nmbatch.engine import NestedMiniBatchKMeans

    np.save(tmp_path / "x.npy", four_blobs)
    C, labels = fit(tmp_path, tmp_path / "x.npy")
    km = NestedMiniBatchKMeans(4, batch_size=100, random_state=3).fit(four_blobs)
    np.testing.assert_array_equal(C, km.cluster_centers_)
    np.testing.assert_array_equal(labels, km.labels_)


def test_fit_init_from_a_file_is_the_estimators_init_array(
    tmp_path: Path, four_blobs: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    from nmbatch.engine import NestedMiniBatchKMeans

    np.save(tmp_path / "x.npy", four_blobs)
    given = four_blobs[[0, 10, 20, 30]] + np.float32(0.5)
    np.save(tmp_path / "init.npy", given)
    np.savetxt(tmp_path / "init.csv", given, delimiter=",")
    km = NestedMiniBatchKMeans(4, batch_size=100, init=given, random_state=3).fit(four_blobs)
    for init in ("init.npy", "init.csv"):
        C, labels = fit(tmp_path, tmp_path / "x.npy", "--init", str(tmp_path / init))
        np.testing.assert_array_equal(C, km.cluster_centers_)
        np.testing.assert_array_equal(labels, km.labels_)
    # -k defaults to the file's rows; another -k, or -k missing without a file, is an error.
    out = tmp_path / "c.npy"
    args = ["fit", str(tmp_path / "x.npy"), "--centroids", str(out), "-q"]
    assert cli.main([*args, "--init", str(tmp_path / "init.npy")]) == 0
    assert np.load(out).shape == (4, 3)
    assert cli.main([*args, "--init", str(tmp_path / "init.npy"), "-k", "3"]) == 2
    assert "init has shape (4, 3), but the model needs (k, dim) = (3, 3)" in capsys.readouterr().err
    assert cli.main(args) == 2
    assert "-k is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*args, "--init", "kmeans"])


def test_sweep_recommends_the_number_of_blobs_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.testkit import blobs_around

    X, _ = blobs_around(1, 12.0 * np.vstack([np.eye(4), np.zeros((1, 4))]), 400)
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "sweep.json"
    args = ["sweep", str(tmp_path / "x.npy"), "--ks", "2,3,4,5,6,8,10", "--threads", "1"]
    assert cli.main([*args, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "recommended k = 5;" in printed and "<- recommended" in printed
    doc = json.loads(out.read_text())
    assert doc["recommended_k"] == 5 and [p["k"] for p in doc["points"]] == [2, 3, 4, 5, 6, 8, 10]
    assert (doc["n_train"], doc["n_heldout"]) == (1600, 400)
    assert cli.main([*args, "--max-rows", "1000"]) == 0
    assert "800 rows fitted, 200 held out" in capsys.readouterr().out
    assert cli.main([*args[:2], "--ks", "2,2000"]) == 2
    assert "every k must be in [1, 1600]" in capsys.readouterr().err
    for bad in ("2,x", "0,3", ""):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args([*args[:2], "--ks", bad])


def test_fit_npz_uses_train_by_default(tmp_path: Path, four_blobs: np.ndarray) -> None:
    np.savez(tmp_path / "x.npz", aaa=four_blobs[:50], train=four_blobs)
    C, labels = fit(tmp_path, tmp_path / "x.npz")
    assert_is_kmeans_solution(four_blobs, C, labels, 4)


def test_fit_npz_uses_the_first_array_without_train(tmp_path: Path, four_blobs: np.ndarray) -> None:
    np.savez(tmp_path / "x.npz", first=four_blobs, second=four_blobs[:50])
    C, labels = fit(tmp_path, tmp_path / "x.npz")
    assert_is_kmeans_solution(four_blobs, C, labels, 4)


def test_fit_npz_key_selects_the_array(tmp_path: Path, four_blobs: np.ndarray) -> None:
    np.savez(tmp_path / "x.npz", train=four_blobs, other=four_blobs[:200])
    C, labels = fit(tmp_path, tmp_path / "x.npz", "--key", "other")
    assert_is_kmeans_solution(four_blobs[:200], C, labels, 4)


def test_fit_csv_with_header(tmp_path: Path, four_blobs: np.ndarray) -> None:
    path = tmp_path / "x.csv"
    np.savetxt(path, four_blobs, delimiter=",", header="a,b,c", comments="", fmt="%.9g")
    C, labels = fit(tmp_path, path)
    assert_is_kmeans_solution(np.loadtxt(path, delimiter=",", skiprows=1), C, labels, 4)


def test_fit_csv_without_header(tmp_path: Path, four_blobs: np.ndarray) -> None:
    path = tmp_path / "x.csv"
    np.savetxt(path, four_blobs, delimiter=",", fmt="%.9g")
    C, labels = fit(tmp_path, path)
    assert labels.shape == (600,)
    assert_is_kmeans_solution(np.loadtxt(path, delimiter=","), C, labels, 4)


def test_fit_flattens_images_to_rows(tmp_path: Path, four_blobs: np.ndarray) -> None:
    np.save(tmp_path / "x.npy", four_blobs.reshape(600, 3, 1))
    C, labels = fit(tmp_path, tmp_path / "x.npy")
    assert_is_kmeans_solution(four_blobs, C, labels, 4)


def test_fit_writes_csv_outputs(tmp_path: Path, four_blobs: np.ndarray) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    code = cli.main(
        ["fit", str(tmp_path / "x.npy"), "-k", "4", "--seed", "1", "-q",
         "--centroids", str(tmp_path / "c.csv"), "--labels", str(tmp_path / "l.csv")]
    )  # fmt: skip
    assert code == 0
    C = np.loadtxt(tmp_path / "c.csv", delimiter=",", ndmin=2)
    labels = np.loadtxt(tmp_path / "l.csv", dtype=np.int64)
    assert C.shape == (4, 3)
    assert labels.shape == (600,)
    np.testing.assert_array_equal(labels, brute_force_labels(four_blobs, C.astype(np.float32)))


@pytest.mark.parametrize("algorithm", ["mbatch", "lloyd"])
def test_fit_other_algorithms(tmp_path: Path, four_blobs: np.ndarray, algorithm: str) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    C, labels = fit(tmp_path, tmp_path / "x.npy", "--algorithm", algorithm, "--max-iter", "20")
    assert_is_kmeans_solution(four_blobs, C, labels, 4)


def test_fit_progress_shows_iteration_batch_and_energy(
    tmp_path: Path, four_blobs: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    fit(tmp_path, tmp_path / "x.npy")
    captured = capsys.readouterr()
    assert captured.out == ""
    first = captured.err.splitlines()[0]
    assert "iter 1 " in first
    assert "batch 100/600" in first
    assert "energy " in first
    assert "converged after" in captured.err


def test_fit_summary_says_when_max_iter_stopped_it(
    tmp_path: Path, four_blobs: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    fit(tmp_path, tmp_path / "x.npy", "--max-iter", "1")
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("nmbatch: stopped at --max-iter 1 after 1 iterations in ")


def test_fit_quiet_prints_nothing(
    tmp_path: Path, four_blobs: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    fit(tmp_path, tmp_path / "x.npy", "--quiet")
    assert capsys.readouterr().err == ""


def test_fit_does_not_import_fastapi(tmp_path: Path, four_blobs: np.ndarray) -> None:
    np.save(tmp_path / "x.npy", four_blobs)
    code = (
        "import sys\n"
        "from nmbatch.cli import main\n"
        f"rc = main(['fit', {str(tmp_path / 'x.npy')!r}, '-k', '2', '-q',\n"
        f"           '--centroids', {str(tmp_path / 'c.npy')!r}])\n"
        "print(rc, sorted(m for m in ('fastapi', 'uvicorn', 'redis') if m in sys.modules))\n"
    )
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0 []"
    assert np.load(tmp_path / "c.npy").shape == (2, 3)


# -- fit: errors --------------------------------------------------------------------------
def fit_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run a failing ``nmbatch fit``; check status 2 and return the error line."""
    code = cli.main(["fit", *args])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("nmbatch fit: error: ")
    return err


def test_fit_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = fit_error(capsys, str(tmp_path / "nope.npy"), "-k", "2", "--centroids", "c.npy")
    assert "no such file" in err
    assert not (tmp_path / "c.npy").exists()


def test_fit_unknown_npz_key_lists_the_arrays(
    tmp_path: Path, four_blobs: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    np.savez(tmp_path / "x.npz", a=four_blobs, b=four_blobs)
    err = fit_error(
        capsys, str(tmp_path / "x.npz"), "-k", "2", "--key", "zz",
        "--centroids", str(tmp_path / "c.npy"),
    )  # fmt: skip
    assert "'zz'" in err
    assert "a, b" in err


def test_fit_fewer_samples_than_clusters_is_an_error(
    tmp_path: Path, four_blobs: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", four_blobs[:3])
    fit_error(capsys, str(tmp_path / "x.npy"), "-k", "4", "--centroids", str(tmp_path / "c.npy"))
    assert not (tmp_path / "c.npy").exists()


def test_fit_non_finite_values_are_an_error(
    tmp_path: Path, four_blobs: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    X = four_blobs.copy()
    X[5, 1] = np.nan
    np.save(tmp_path / "x.npy", X)
    err = fit_error(
        capsys, str(tmp_path / "x.npy"), "-k", "2", "--centroids", str(tmp_path / "c.npy")
    )
    assert "NaN" in err


def test_fit_one_dimensional_array_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    np.save(tmp_path / "x.npy", np.arange(10.0))
    err = fit_error(
        capsys, str(tmp_path / "x.npy"), "-k", "2", "--centroids", str(tmp_path / "c.npy")
    )
    assert "2-D" in err


def test_fit_unknown_file_type_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    err = fit_error(
        capsys, str(tmp_path / "x.parquet"), "-k", "2", "--centroids", str(tmp_path / "c.npy")
    )
    assert ".parquet" in err


# -- serve --------------------------------------------------------------------------------
def test_serve_options_become_nmbatch_settings() -> None:
    from nmbatch.service.config import Settings

    args = cli.build_parser().parse_args(
        ["serve", "--host", "127.0.0.1", "--port", "9999", "--redis-url", "redis://r:1/0",
         "--k", "5", "--set", "rho=50", "--set", "NMBATCH_BATCH_SIZE=100"]
    )  # fmt: skip
    env = serve_cli.serve_environment(args)
    assert env == {
        "NMBATCH_HOST": "127.0.0.1",
        "NMBATCH_PORT": "9999",
        "NMBATCH_REDIS_URL": "redis://r:1/0",
        "NMBATCH_K": "5",
        "NMBATCH_RHO": "50",
        "NMBATCH_BATCH_SIZE": "100",
    }
    for name in env:
        assert name.removeprefix("NMBATCH_").lower() in Settings.model_fields


def test_serve_flags_override_the_environment_which_overrides_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nmbatch.service.config import Settings

    for name in [key for key in os.environ if key.startswith("NMBATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("NMBATCH_K", "7")
    monkeypatch.setenv("NMBATCH_RHO", "20")
    monkeypatch.setenv("NMBATCH_PORT", "8001")
    args = cli.build_parser().parse_args(["serve", "--k", "5", "--set", "rho=50"])
    for name, value in serve_cli.serve_environment(args).items():
        monkeypatch.setenv(name, value)  # what run_serve does before starting the service
    settings = Settings()
    assert (settings.k, settings.rho) == (5, 50.0)  # the flags
    assert settings.port == 8001  # the environment
    assert settings.batch_size == Settings.model_fields["batch_size"].default  # the default


def test_serve_rejects_an_unknown_setting() -> None:
    args = cli.build_parser().parse_args(["serve", "--set", "no_such_setting=1"])
    with pytest.raises(serve_cli.ServeError, match="no_such_setting"):
        serve_cli.serve_environment(args)


def test_serve_bad_setting_is_an_error_line_and_status_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["serve", "--set", "no_such_setting=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("nmbatch serve: error: --set no_such_setting: no such setting")


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """``nmbatch serve`` on a free loopback port with its embedded Redis in ``tmp_path``."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("NMBATCH_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmbatch.cli", "serve", "--host", "127.0.0.1",
         "--port", str(port), "--k", "3", "--set", f"data_dir={tmp_path / 'data'}"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield proc, port
    finally:
        testkit.stop_process(proc)


def wait_for_healthz(proc: subprocess.Popen, port: int, deadline_s: float = 90) -> int:
    """Poll ``GET /healthz`` until it answers; return its status (fails if the process dies)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"service exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                return resp.status
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    pytest.fail("the service did not answer /healthz")


def http_json(url: str, body: object | None = None) -> tuple[int, object]:
    """GET (or POST ``body`` as JSON) and decode the answer: ``(status, document)``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_serve_runs_the_service_with_the_given_options(
    serving: tuple[subprocess.Popen, int],
) -> None:
    proc, port = serving
    assert wait_for_healthz(proc, port) == 200
    base = f"http://127.0.0.1:{port}"
    vectors = [[float(i % 3) * 10, float(i)] for i in range(30)]
    status, _ = http_json(f"{base}/samples", {"vectors": vectors})
    assert 200 <= status < 300
    deadline = time.monotonic() + 60
    while (answer := http_json(f"{base}/centroids"))[0] != 200:
        assert time.monotonic() < deadline, f"no centroids: {answer}"
        time.sleep(0.2)
    document = answer[1]
    assert isinstance(document, dict)
    assert document["k"] == 3  # --k 3
    assert document["dim"] == 2


# -- bench --------------------------------------------------------------------------------
def test_bench_help_is_the_benchmarks_own_help(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.options import build_parser

    monkeypatch.setenv("COLUMNS", "100")  # the same help width in both processes
    via_cli = run_cli("bench", "--help", env={"COLUMNS": "100"})
    assert via_cli.returncode == 0, via_cli.stderr
    assert via_cli.stdout == build_parser().format_help()


def test_bench_passes_a_usage_error_through() -> None:
    result = run_cli("bench", "--no-such-option")
    assert result.returncode == 2
    assert "--no-such-option" in result.stderr


def test_bench_finds_the_checkout_it_was_installed_from(tmp_path: Path) -> None:
    # From a folder outside the checkout: nmbatch is imported from the checkout (as after
    # an editable install), whose benchmarks/ it runs.
    result = subprocess.run(
        [sys.executable, "-m", "nmbatch.cli", "bench", "--help"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: python -m benchmarks" in result.stdout
    assert cli.benchmarks_checkout([tmp_path, REPO]) == REPO


def test_bench_without_a_checkout_says_where_the_benchmarks_are(tmp_path: Path) -> None:
    # The package alone, as a wheel installs it: no benchmarks/ beside it, none in the
    # current folder.
    site = tmp_path / "site"
    shutil.copytree(REPO / "nmbatch", site / "nmbatch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "nmbatch.cli", "bench", "--quick"],
        cwd=work, env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "the benchmarks live in a checkout of the repository" in result.stderr
    assert "python -m benchmarks" in result.stderr
    assert result.stdout == ""


def test_a_folder_is_a_checkout_only_with_benchmarks_and_the_projects_pyproject(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "cli.py").write_text("")
    assert cli.benchmarks_checkout([tmp_path]) is None  # no pyproject.toml
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert cli.benchmarks_checkout([tmp_path]) is None  # another project's
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "nmbatch"\n')
    assert cli.benchmarks_checkout([tmp_path]) == tmp_path
    assert cli.run_bench(["--help"], roots=[tmp_path / "benchmarks"]) == 2
    assert "checkout of the repository" in capsys.readouterr().err
