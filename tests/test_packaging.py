"""The distribution installs the namespace ``nmbatch`` and the client's package
``nmbatch_client``, and nothing else at the top.

``engine/`` installs as ``nmbatch.engine``, ``service/`` as ``nmbatch.service`` and
``client/nmbatch_client`` (also the ``nmbatch-client`` distribution, ``client/``) as
``nmbatch_client`` (``package-dir`` in ``pyproject.toml``); every package folder must be
listed there, or a wheel would silently lack it. ``engine`` imports nothing from ``service``. The
benchmarks (``benchmarks/``) run from a checkout: the wheel, built here, holds none.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {
    "nmbatch": "nmbatch",
    "nmbatch.engine": "engine",
    "nmbatch.service": "service",
    "nmbatch_client": "client/nmbatch_client",
}


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def package_folders() -> dict[str, Path]:
    """Every folder with an ``__init__.py`` under the three roots, by its import name."""
    found: dict[str, Path] = {}
    for root_name, folder in FOLDERS.items():
        for init in sorted((REPO / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(REPO / folder).parts
            if "__pycache__" in relative:
                continue
            found[".".join((root_name, *relative))] = init.parent
    return found


def test_every_package_folder_is_installed_and_nothing_else() -> None:
    setuptools = pyproject()["tool"]["setuptools"]
    assert setuptools["package-dir"] == FOLDERS
    assert sorted(setuptools["packages"]) == sorted(package_folders())


def test_the_console_script_and_the_top_level_imports(tmp_path: Path) -> None:
    assert pyproject()["project"]["scripts"] == {"nmbatch": "nmbatch.cli:main"}
    # From a folder outside the checkout: only what the installation provides.
    probe = (
        "import importlib.util, nmbatch\n"
        "from nmbatch import NestedMiniBatchKMeans\n"
        "import nmbatch.service.main, nmbatch.engine.kernels\n"
        "print(importlib.util.find_spec('engine'), importlib.util.find_spec('service'),\n"
        "      importlib.util.find_spec('benchmarks'), importlib.util.find_spec('tools'))\n"
        "print(NestedMiniBatchKMeans.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "None None None None"
    assert out[1] == "nmbatch.engine.estimator"


def test_engine_imports_nothing_from_the_service() -> None:
    for path in (REPO / "engine").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(("nmbatch.service", "service")), (path, name)


def test_the_wheel_holds_the_nmbatch_package_alone(tmp_path: Path) -> None:
    # Built from a copy of the sources with benchmarks/ and tests/ beside them, as in a
    # checkout (pip's isolated build; the checkout itself gets no build/ or egg-info).
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc")
    for folder in ("nmbatch", "engine", "service", "client", "benchmarks", "tests"):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "out"),
         str(src)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "out").glob("nmbatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {name.split("/")[0] for name in names} == {"nmbatch", "nmbatch_client", dist_info}
    assert [n for n in names if "bench" in n] == []  # no benchmarks/, no engine/bench/
    assert "nmbatch/engine/kernels/grouped.py" in names
    assert "nmbatch/service/main.py" in names
    assert "nmbatch_client/sources.py" in names and "nmbatch/service/client/__init__.py" in names
