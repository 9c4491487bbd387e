"""The documentation tells the truth about the code it documents.

The settings table of ``docs/configuration.md`` is the settings, both ways; every
``NMBATCH_*`` named anywhere is a setting or a variable of the benchmarks or the test
harness; and every command shown in the README or on a page of the site (``sh``,
``bash`` and ``console`` blocks, and inline ``python -m``, ``nmbatch``, ``make`` and
``curl`` spans) is checked against what it names: a module that exists and knows the
options given, an ``nmbatch`` subcommand and its options, a route of the app with that
method, a Makefile target, a file. ``python`` blocks compile and call real names with
real keyword arguments. ``mkdocs build --strict`` (in ``make test``) checks the links
between pages; the README's links are checked here.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
import itertools
import re
from pathlib import Path

import pytest

from nmbatch.service.config import Settings
from tests.docs_commands import (
    NMBATCH_VARIABLE,
    REPO,
    Command,
    bench_variables,
    doc_pages,
    harness_variables,
    long_flags,
    makefile_recipe,
    makefile_targets,
    module_sources,
    page_commands,
    python_blocks,
    resolve_module,
)

CONFIGURATION = REPO / "docs" / "configuration.md"
SETTINGS_ROW = re.compile(r"^\| `(NMBATCH_[A-Z_]+)` \| ([^|]*) \|", re.MULTILINE)
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: Where a curl command's URL starts: the sessions' variables, or the service's address.
URL_PREFIX = re.compile(r"^(?:\$URL|\$U|https?://(?:127\.0\.0\.1|localhost):8000)(/[^?\s]*)?")
CURL_DATA = {"-d", "--data", "--data-binary", "--data-raw", "--data-urlencode", "-F", "--json"}


def settings_fields() -> set[str]:
    return {"NMBATCH_" + name.upper() for name in Settings.model_fields}


# -- the settings --------------------------------------------------------------------


def test_every_setting_is_in_the_settings_table() -> None:
    rows = {name for name, _ in SETTINGS_ROW.findall(CONFIGURATION.read_text(encoding="utf-8"))}
    assert settings_fields() - rows == set(), "settings missing from docs/configuration.md"


def test_the_settings_table_lists_only_settings_and_each_once() -> None:
    rows = [name for name, _ in SETTINGS_ROW.findall(CONFIGURATION.read_text(encoding="utf-8"))]
    assert set(rows) - settings_fields() == set(), "rows that are no setting"
    assert len(rows) == len(set(rows)), "a setting listed twice"


def test_there_is_one_settings_table() -> None:
    others = [
        str(page.relative_to(REPO))
        for page in doc_pages()
        if page != CONFIGURATION and SETTINGS_ROW.search(page.read_text(encoding="utf-8"))
    ]
    assert others == [], "settings rows outside docs/configuration.md"


def _shown_default(value: object) -> str:
    """A field's default as the table shows it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, Path):
        return f"`./{value}`" if not str(value).startswith((".", "/")) else f"`{value}`"
    return f"`{value}`"


def test_the_settings_table_shows_the_defaults() -> None:
    """A default shown as a plain value (or "unset") is the field's; prose is not checked."""
    rows = dict(SETTINGS_ROW.findall(CONFIGURATION.read_text(encoding="utf-8")))
    checked = 0
    for name, field in Settings.model_fields.items():
        shown = rows["NMBATCH_" + name.upper()].strip()
        if field.default_factory is not None or not re.fullmatch(r"`[^`]*`|unset", shown):
            continue
        default = field.default
        if hasattr(default, "get_secret_value"):
            default = default.get_secret_value()
        assert shown == _shown_default(default), (name, shown, default)
        checked += 1
    assert checked >= 25


def test_the_docs_name_only_real_settings() -> None:
    known = settings_fields() | bench_variables() | harness_variables()
    for page in doc_pages():
        named = set(NMBATCH_VARIABLE.findall(page.read_text(encoding="utf-8")))
        assert named - known == set(), page.relative_to(REPO)


# -- the commands --------------------------------------------------------------------


@functools.cache
def app_routes() -> tuple[tuple[re.Pattern[str], frozenset[str]], ...]:
    """``(path pattern, methods)`` of every route of the app's OpenAPI document."""
    from nmbatch.service.main import create_app

    app = create_app(Settings(_env_file=None))
    routes = []
    for path, operations in app.openapi()["paths"].items():
        pattern = re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)) + "$")
        routes.append((pattern, frozenset(m.upper() for m in operations)))
    return tuple(routes)


@functools.cache
def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """The ``nmbatch`` parser ("") and one parser per subcommand."""
    from nmbatch.cli import build_parser

    parser = build_parser()
    parsers = {"": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.update(action.choices)
    return parsers


def check_module(module: str, args: list[str]) -> list[str]:
    """``python -m module args``: the module runs, and every ``--option`` is in its source."""
    path = resolve_module(module)
    if path is None:
        return [f"no module {module}"]
    if path.is_dir() and not (path / "__main__.py").is_file():
        return [f"package {module} has no __main__"]
    sources = "\n".join(p.read_text(encoding="utf-8") for p in module_sources(path))
    return [
        f"{module} has no option {flag}"
        for flag in long_flags(args)
        if f'"{flag}"' not in sources and f"'{flag}'" not in sources
    ]


def check_python(args: list[str]) -> list[str]:
    if args[:1] == ["-m"] and len(args) > 1:
        return check_module(args[1], args[2:])
    if args[:1] == ["-c"] and len(args) > 1:
        compile(args[1], "<python -c>", "exec")
        return []
    return [f"python {' '.join(args)}: neither -m nor -c"]


def check_nmbatch(args: list[str]) -> list[str]:
    parsers = cli_parsers()
    if not args or args[0].startswith("-"):
        sub, options = "", args
    else:
        sub, options = args[0], args[1:]
    if sub not in parsers:
        return [f"nmbatch has no subcommand {sub}"]
    if sub == "bench":  # its arguments go to `python -m benchmarks` untouched
        return check_module("benchmarks", options)
    known = parsers[sub]._option_string_actions
    words = [w.split("=", 1)[0] for w in options if re.match(r"^--?[A-Za-z]", w)]
    return [f"nmbatch {sub} has no option {w}" for w in words if w not in known]


def check_curl(args: list[str]) -> list[str]:
    method = "GET"
    if any(a in CURL_DATA for a in args):
        method = "POST"
    for flag in ("-X", "--request"):
        if flag in args:
            method = args[args.index(flag) + 1].upper()
    urls = [m for a in args if (m := URL_PREFIX.match(a))]
    if len(urls) != 1:
        return [f"curl {' '.join(args)}: one URL of the service expected"]
    path = urls[0].group(1) or "/"
    for pattern, methods in app_routes():
        if pattern.match(path):
            return [] if method in methods else [f"{method} {path} is not a route"]
    return [f"{path} is not a path of the API"]


def check_make(args: list[str]) -> list[str]:
    targets = [a for a in args if not a.startswith("-") and "=" not in a]
    return [f"make has no target {t}" for t in targets if t not in makefile_targets()]


def check_docker(args: list[str]) -> list[str]:
    if args[:1] == ["compose"]:
        compose = (REPO / "docker-compose.yml").read_text(encoding="utf-8")
        services = set(re.findall(r"^  ([a-z][\w-]*):", compose, re.MULTILINE))
        names = [a for a in args[2:] if not a.startswith("-")]
        return [f"docker compose: no service {n}" for n in names if n not in services]
    if args[:1] == ["build"] and "-f" in args:
        dockerfile = args[args.index("-f") + 1]
        return [] if (REPO / dockerfile).is_file() else [f"no file {dockerfile}"]
    return [] if args[:1] == ["run"] else [f"docker {' '.join(args)}: not checked"]


def check_pytest(args: list[str]) -> list[str]:
    """Test paths exist; a ``-m`` marker is one pyproject.toml declares."""
    problems, paths = [], []
    words = iter(args)
    for word in words:
        if word == "-m":
            marker = next(words)
            pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
            if not re.search(rf'^\s*"{re.escape(marker)}:', pyproject, re.MULTILINE):
                problems.append(f"no pytest marker {marker}")
        elif word in {"-k", "-p", "-o", "-c"}:
            next(words)
        elif not word.startswith("-"):
            paths.append(word.split("::")[0])
    return problems + [f"no test path {p}" for p in paths if not (REPO / p).exists()]


def check_mkdocs(args: list[str]) -> list[str]:
    from mkdocs.__main__ import cli

    return [] if args and args[0] in cli.commands else [f"mkdocs {' '.join(args)}"]


def check_kubectl(args: list[str]) -> list[str]:
    """A Kustomize folder (``-k``) holds a kustomization.yaml; a ``service/NAME`` is a
    Service of the Kubernetes base (deploy/kubernetes)."""
    problems = []
    if args[:1] not in (["create"], ["apply"], ["port-forward"], ["kustomize"], ["-n"]):
        problems.append(f"kubectl {' '.join(args)}: not checked")
    for flag, value in itertools.pairwise(args):
        if flag == "-k" and not (REPO / value / "kustomization.yaml").is_file():
            problems.append(f"no Kustomize base {value}")
    base = (REPO / "deploy" / "kubernetes").glob("*.yaml")
    services = set()
    for manifest in base:
        text = manifest.read_text(encoding="utf-8")
        if re.search(r"^kind: Service$", text, re.MULTILINE):
            services.update(re.findall(r"^  name: ([\w-]+)$", text, re.MULTILINE))
    for word in args:
        if word.startswith("service/") and word.removeprefix("service/") not in services:
            problems.append(f"no Service {word} in deploy/kubernetes")
    return problems


CHECKS = {
    "python": check_python,
    "nmbatch": check_nmbatch,
    "curl": check_curl,
    "make": check_make,
    "docker": check_docker,
    "pytest": check_pytest,
    "mkdocs": check_mkdocs,
    "kubectl": check_kubectl,
    # Other programs' own commands, not this project's: only what they are is checked.
    "ray": lambda args: [] if args[:1] == ["start"] else [f"ray {args}"],
    "pip": lambda args: [] if args[:1] == ["install"] else [f"pip {args}"],
}


def command_problems(words: list[str]) -> list[str]:
    """What is wrong with one simple command (empty when nothing)."""
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]
    if not words:
        return []
    if words[0] == "export":
        return [] if all(ASSIGNMENT.match(w) for w in words[1:]) else [f"export {words[1:]}"]
    program = Path(words[0]).name
    program = "python" if program in {"python", "python3"} else program
    if program not in CHECKS:
        return [f"no check for the program {words[0]}: add one to tests/test_docs.py"]
    return CHECKS[program](list(words[1:]))


def all_commands() -> list[Command]:
    return [c for page in doc_pages() for c in page_commands(page)]


def test_every_command_in_the_docs_is_right() -> None:
    problems = [f"{c}: {p}" for c in all_commands() for p in command_problems(list(c.words))]
    assert problems == []


def test_the_commands_are_read() -> None:
    """The reader finds the commands (a parser that found none would pass any check)."""
    by_program: dict[str, int] = {}
    for command in all_commands():
        words = [w for w in command.words if not ASSIGNMENT.match(w)]
        if words:
            by_program[Path(words[0]).name] = by_program.get(Path(words[0]).name, 0) + 1
    assert by_program.get("curl", 0) >= 30
    assert by_program.get("python", 0) >= 20
    assert by_program.get("nmbatch", 0) >= 5
    assert by_program.get("docker", 0) >= 8
    readme = {c.words for c in page_commands(REPO / "README.md")}
    assert ("make", "serve") in readme and ("make", "test") in readme


@pytest.mark.parametrize(
    "typo",
    [
        "python -m benchmarks --budgett 10",
        "python -m benchmarks.phasez --threads 1,2",
        "python -m benchmarks.phases --threads 1 --peer x.json",
        "python -m nmbatch.engine.nothing",
        "nmbatch fit data.npy -k 50 --centroid c.npy",
        "nmbatch pull vectors.npy",
        "nmbatch bench --dataset mnist --seedz 5",
        "curl -s $URL/centroid",
        "curl -s -X PUT $URL/samples -d '{}'",
        "curl -s http://127.0.0.1:8000/models/a/asign",
        "make tset",
        "docker compose logs -f nmbatc",
        "pytest -m faults",
        "pytest tests/fault",
        "NMBATCH_K=3 pyton -m nmbatch",
        "kubectl apply -n nmbatch -k deploy/kubernets",
        "kubectl -n nmbatch port-forward service/nmbatc 8000:8000",
    ],
)
def test_a_typo_in_a_command_is_caught(typo: str) -> None:
    from tests.docs_commands import split_commands

    (words,) = split_commands(typo)
    assert command_problems(words) != []


# -- python blocks -------------------------------------------------------------------


def _classes(tree: ast.Module, problems: list[str]) -> dict[str, object]:
    """The names a block imports from ``nmbatch``, as objects."""
    import nmbatch

    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "nmbatch":
            for alias in node.names:
                if hasattr(nmbatch, alias.name):
                    names[alias.asname or alias.name] = getattr(nmbatch, alias.name)
                else:
                    problems.append(f"nmbatch has no {alias.name}")
    return names


def _base_class(node: ast.AST, classes: dict[str, object]) -> object | None:
    """The class of ``Cls(...)`` or of ``Cls(...).fit(...)`` (fluent calls return self)."""
    while isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            return classes.get(node.func.id)
        if not isinstance(node.func, ast.Attribute):
            return None
        node = node.func.value
    return None


def _keyword_problems(target: object, call: ast.Call, what: str) -> list[str]:
    parameters = inspect.signature(target).parameters  # type: ignore[arg-type]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    return [
        f"{what}() takes no {k.arg}="
        for k in call.keywords
        if k.arg is not None and k.arg not in parameters
    ]


def python_block_problems(body: str) -> list[str]:
    """What is wrong with a ``python`` block: it compiles, imports real names from
    ``nmbatch``, and calls their constructors and methods with real keyword arguments."""
    tree = ast.parse(body)
    problems: list[str] = []
    classes = _classes(tree, problems)
    objects: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            value, name = node.value, node.targets[0].id
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            value, name = node.context_expr, node.optional_vars.id
        else:
            continue
        cls = _base_class(value, classes)
        if cls is not None:
            objects[name] = cls
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in classes:
            problems += _keyword_problems(classes[func.id], node, func.id)
        elif isinstance(func, ast.Attribute):
            cls = objects.get(func.value.id) if isinstance(func.value, ast.Name) else None
            if cls is None and isinstance(func.value, ast.Call):
                cls = _base_class(func.value, classes)
            if cls is None:
                continue
            if not hasattr(cls, func.attr):
                problems.append(f"{getattr(cls, '__name__', cls)} has no {func.attr}")
            else:
                problems += _keyword_problems(getattr(cls, func.attr), node, func.attr)
    return problems


def test_python_blocks_call_real_names() -> None:
    blocks = [(page, body) for page in doc_pages() for body in python_blocks(page)]
    assert len(blocks) >= 5
    problems = [
        f"{page.relative_to(REPO)}: {p}"
        for page, body in blocks
        for p in python_block_problems(body)
    ]
    assert problems == []


KMEANS = "from nmbatch import NestedMiniBatchKMeans"


@pytest.mark.parametrize(
    "typo",
    [
        "from nmbatch import NestedMiniBatchKMean",
        f"{KMEANS}\nNestedMiniBatchKMeans(n_cluster=5)",
        f"{KMEANS}\nkm = NestedMiniBatchKMeans().fit(X)\nkm.partial_fitt(X)",
        "from nmbatch import Client\nwith Client('u') as c:\n    c.push(X, chunk=3)",
        f"{KMEANS}\nNestedMiniBatchKMeans(n_clusters=5).fit(X, y, weights=1)",
    ],
)
def test_a_typo_in_a_python_block_is_caught(typo: str) -> None:
    assert python_block_problems(typo) != []


# -- links and the build -------------------------------------------------------------


def test_the_readme_links_resolve() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#")[0] for link in links if not re.match(r"^[a-z]+:", link)]
    assert len(local) >= 10
    assert [link for link in local if not (REPO / link).is_file()] == []


def test_pages_link_to_files_not_folders() -> None:
    """The site's build lets a link to a folder through; the pages have none."""
    for page in doc_pages():
        links = re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))
        folders = [link for link in links if not re.match(r"^[a-z]+:", link) and link.endswith("/")]
        assert folders == [], page.relative_to(REPO)


def test_make_test_builds_the_site_strictly() -> None:
    recipe = makefile_recipe("test")
    assert "mkdocs build --strict" in recipe
    assert recipe.index("mkdocs build") < recipe.index("pytest")
