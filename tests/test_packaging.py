"""The distribution installs one namespace, ``nmbatch``, and nothing else at the top.

``engine/`` installs as ``nmbatch.engine`` and ``service/`` as ``nmbatch.service``
(``package-dir`` in ``pyproject.toml``); every package folder must be listed there, or a
wheel would silently lack it. ``engine`` imports nothing from ``service``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"nmbatch": "nmbatch", "nmbatch.engine": "engine", "nmbatch.service": "service"}


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
        "print(importlib.util.find_spec('engine'), importlib.util.find_spec('service'))\n"
        "print(NestedMiniBatchKMeans.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "None None"
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
