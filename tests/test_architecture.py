"""The layers of the code: the import graph has no cycle and no forbidden arrow.

The graph is computed from the source (every ``import`` and ``from ... import``,
those inside functions included, since a deferred import is still a dependency) of
the installed packages (``nmbatch``, ``engine/`` as ``nmbatch.engine``, ``service/`` as
``nmbatch.service``) and of the benchmarks (``benchmarks/``, run from a checkout).
An arrow ``a -> b`` means that module ``a`` imports module ``b`` (or a name defined in
it); importing a package's submodule is not counted as importing the package.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Folder -> the import name of its top package.
PACKAGES = {
    "nmbatch": "nmbatch",
    "engine": "nmbatch.engine",
    "service": "nmbatch.service",
    "client/nmbatch_client": "nmbatch_client",
    "benchmarks": "benchmarks",
}

# What the client's package (client/nmbatch_client, the nmbatch-client distribution)
# imports besides itself: the standard library and its dependencies; pyarrow (its arrow
# extra) and orjson (when installed) only inside a guard.
CLIENT_MAY_IMPORT = frozenset(sys.stdlib_module_names) | {"httpx", "numpy", "pyarrow", "orjson"}

# Modules of the HTTP layer: what storage must never reach.
HTTP_THIRD_PARTY = ("fastapi", "starlette", "uvicorn")

# The HTTP side: routes, their dependencies and the use cases they call.
HTTP_SIDE = ("nmbatch.service.routes", "nmbatch.service.context", "nmbatch.service.usecases")

# What storage may import of the service: itself, the settings, the published model's
# record (data, no behaviour) and the process's cgroup limits (files of the OS read with
# the standard library). Nothing of HTTP, the use cases or the worker.
STORAGE_MAY_IMPORT = (
    "nmbatch.service.storage",
    "nmbatch.service.config",
    "nmbatch.service.state",
    "nmbatch.service.identities",  # the lineage of a published model, as state.py
    "nmbatch.service.cgroups",
)


def module_files() -> dict[str, Path]:
    """Every module of the tree: import name -> file (a package is its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        root = REPO / folder
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = module_files()


def _resolve(name: str) -> str | None:
    """The module of the tree that ``name`` (a module or ``module.attribute``) lies in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every absolute name ``module`` imports, at any depth of its syntax tree."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, up level - 1 packages
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for alias in node.names:
                yield f"{source}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports (and the third-party tops, as is)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets: set[str] = set()
        for name in imported_names(module, path):
            resolved = _resolve(name)
            if resolved is not None:
                if resolved != module:
                    targets.add(resolved)
            else:
                targets.add(name.partition(".")[0])
        graph[module] = targets
    return graph


GRAPH = import_graph()


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def forbidden(source: str, target: str) -> str | None:
    """Why the arrow ``source -> target`` is not allowed, or None."""
    if _in(source, "nmbatch.engine") and _in(target, "nmbatch.service", "benchmarks"):
        return "the engine knows nothing of the service or the benchmarks"
    if _in(source, "nmbatch.service") and _in(target, "benchmarks"):
        return "the service knows nothing of the benchmarks"
    if _in(source, "nmbatch_client") and (
        _in(target, "nmbatch", "benchmarks")
        or not (_in(target, "nmbatch_client") or target in CLIENT_MAY_IMPORT)
    ):
        return "the client is its own distribution: the standard library, httpx and numpy"
    if _in(source, "nmbatch.service.storage") and (
        target in HTTP_THIRD_PARTY
        or (_in(target, "nmbatch.service") and not _in(target, *STORAGE_MAY_IMPORT))
    ):
        return "storage knows nothing of HTTP, the use cases or the worker"
    if (
        _in(source, "nmbatch.service.routes")
        and _in(target, "nmbatch.service.routes")
        and source != "nmbatch.service.routes"
        and target != "nmbatch.service.routes"
    ):
        return "a route never imports another route"
    if _in(source, *HTTP_SIDE) and _in(target, "nmbatch.service.worker", "nmbatch.engine.hosting"):
        return "the HTTP side reaches the worker only through what start-up hands it"
    if _in(source, "nmbatch.engine.kernels") and _in(target, "nmbatch.engine.algorithms"):
        return "kernels are below the algorithms"
    return None


def test_the_graph_is_read_from_the_whole_tree() -> None:
    # A checker that read nothing would pass everything: the tree's known layers are there.
    assert "nmbatch.engine.kernels" in MODULES
    assert "nmbatch.service.routes" in MODULES
    assert any(_in(m, "nmbatch.service.storage") for m in MODULES)
    assert "nmbatch.engine" in GRAPH["nmbatch.service.worker.loop"] or any(
        _in(t, "nmbatch.engine") for t in GRAPH["nmbatch.service.worker.loop"]
    )


def test_deferred_imports_count(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text(
        "import numpy\n"
        "def f():\n"
        "    from nmbatch.service.config import Settings\n"
        "    from .kernels import common\n"
        "    return Settings, common\n",
        encoding="utf-8",
    )
    names = list(imported_names("nmbatch.engine.x", path))
    assert names == [
        "numpy",
        "nmbatch.service.config.Settings",
        "nmbatch.engine.kernels.common",
    ]
    assert forbidden("nmbatch.engine.x", _resolve(names[1]) or "") is not None


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    assert cycles(GRAPH) == []


@pytest.mark.parametrize(
    "source, target",
    [
        ("nmbatch.engine.fit", "nmbatch.service.config"),
        ("nmbatch.service.storage.log", "fastapi"),
        ("nmbatch.service.storage.log", "nmbatch.service.problems"),
        ("nmbatch.service.storage.log", "nmbatch.service.usecases.serving"),
        ("nmbatch.service.storage.log", "nmbatch.service.worker.loop"),
        ("nmbatch.service.routes.assign", "nmbatch.service.routes.samples"),
        ("nmbatch.engine.kernels.dense", "nmbatch.engine.algorithms.nested"),
        ("nmbatch.service.context", "nmbatch.service.worker"),
        ("nmbatch.service.usecases.serving", "nmbatch.service.worker.loop"),
        ("nmbatch_client.operations", "nmbatch.service.models.registry"),
        ("nmbatch_client.errors", "tenacity"),
    ],
)
def test_the_rules_catch_each_forbidden_arrow(source: str, target: str) -> None:
    assert forbidden(source, target) is not None


def test_no_forbidden_arrow() -> None:
    bad = [
        f"{source} -> {target}: {why}"
        for source, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if (why := forbidden(source, target)) is not None
    ]
    assert bad == []


def test_no_benchmark_code_in_the_product() -> None:
    # The benchmarks live in benchmarks/ (run from a checkout), not in the wheel's packages.
    assert not (REPO / "engine" / "bench").exists()
    assert not [m for m in MODULES if _in(m, "nmbatch") and ".bench" in m]


# The application layer: the use cases and the model registry they share.
APPLICATION = ("nmbatch.service.usecases", "nmbatch.service.models")

# The HTTP edge, which the application layer never imports: problem documents, parsing
# and validating request bodies, the API key.
HTTP_EDGE = ("nmbatch.service.problems", "nmbatch.service.parsing", "nmbatch.service.security")


def _constructs(tree: ast.AST, name: str) -> list[int]:
    """Lines of ``tree`` that call ``name`` (``name(...)`` or ``module.name(...)``)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    ]


def test_the_application_layer_knows_nothing_of_http() -> None:
    # The use cases raise domain errors; which status and problem type answers each is
    # decided by the one table of nmbatch.service.problems, not here.
    modules = [m for m in MODULES if _in(m, *APPLICATION)]
    assert (
        "nmbatch.service.usecases.serving" in modules
        and "nmbatch.service.models.manager" in modules
    )
    bad = [
        f"{module} -> {target}"
        for module in sorted(modules)
        for target in sorted(GRAPH[module])
        if target in HTTP_THIRD_PARTY or target in HTTP_EDGE
    ]
    bad += [
        f"{module}:{line} constructs ProblemError"
        for module in sorted(modules)
        for line in _constructs(
            ast.parse(MODULES[module].read_text(encoding="utf-8")), "ProblemError"
        )
    ]
    assert bad == []


def test_a_problem_constructed_is_found() -> None:
    tree = ast.parse("def f():\n    raise problems.ProblemError(409, 'x', 'y')\n")
    assert _constructs(tree, "ProblemError") == [2]


def _domain_errors() -> set[type]:
    """Every subclass of ``DomainError``, at any depth (the base excluded)."""
    from nmbatch.service.usecases.errors import DomainError

    found: set[type] = set()
    todo = [DomainError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def _example(cls: type) -> Exception:
    """An instance of ``cls`` built from its signature (ints 1, strings, None)."""
    import inspect

    values = {"int": 1, "str": "x"}
    kwargs = {
        name: values.get(str(param.annotation))
        for name, param in inspect.signature(cls).parameters.items()
    }
    return cls(**kwargs)


def test_every_domain_error_has_exactly_one_answer() -> None:
    # A domain error missing from the table would reach the client as a 500.
    from nmbatch.service import problems
    from nmbatch.service.usecases import errors

    classes = _domain_errors()
    declared = {
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, errors.DomainError)
        and obj is not errors.DomainError
    }  # fmt: skip
    assert declared <= classes and len(classes) >= 13
    assert set(problems.DOMAIN_PROBLEMS) == classes  # a dict: one entry per class
    for cls in sorted(classes, key=lambda c: c.__name__):
        exc = _example(cls)
        problem = problems.problem_of(exc)  # every member is an attribute of the error
        rule = problems.DOMAIN_PROBLEMS[cls]
        assert 400 <= problem.status < 600 and problem.detail == exc.detail
        assert list(problem.extensions) == list(rule.members)
        body = problems.problem_document(exc)
        assert body["type"] == f"urn:nmbatch:problem:{rule.slug}"
