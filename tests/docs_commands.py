"""Reading the documentation's commands, and resolving what they name in the repository.

``tests/test_docs.py`` checks every command the README and the pages under ``docs/`` show
(the benchmark result folders under ``docs/bench/`` are records of runs, not
documentation, and are not read). This module only parses: fenced blocks, the commands in
``sh``/``bash``/``console`` blocks and in inline code spans, and module names resolved
to the files that implement them.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
#: Inline code spans that are commands (the rest are names, values, snippets).
INLINE_COMMAND = re.compile(r"`((?:python -m|nmbatch|make|curl|pytest|docker)\s[^`]+)`")
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
NMBATCH_VARIABLE = re.compile(r"NMBATCH_[A-Z][A-Z_]*[A-Z]")


def doc_pages() -> list[Path]:
    """The README and every page of the documentation site, without ``docs/bench/``."""
    pages = [REPO / "README.md"]
    pages += sorted(p for p in DOCS.rglob("*.md") if (DOCS / "bench") not in p.parents)
    return pages


@dataclass(frozen=True)
class Command:
    """One shell command as a page shows it: ``words`` after shell parsing."""

    page: str
    words: tuple[str, ...]
    text: str

    def __str__(self) -> str:
        return f"{self.page}: {self.text}"


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced code block of a markdown text."""
    return [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(text)]


def _words(text: str) -> list[str] | None:
    """Shell words of ``text`` (comments dropped), or None while a quote is still open."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def block_commands(language: str, body: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comments and output left.

    In a ``console`` block only lines after a ``$`` prompt are commands (the rest is
    output). In ``sh``/``bash`` blocks a command continues over a trailing backslash or an
    open quote; a line that starts with ``#`` outside a command is a comment (or shown
    output).
    """
    if language == "console":
        return [line[2:] for line in body.splitlines() if line.startswith("$ ")]
    commands: list[str] = []
    pending = ""
    for line in body.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        if _words(pending) is None:
            continue
        commands.append(pending)
        pending = ""
    assert not pending, f"unterminated command: {pending!r}"
    return commands


def split_commands(line: str) -> list[list[str]]:
    """The simple commands of a line: split at ``&&``, ``||``, ``;``, ``|`` and ``&``."""
    words = _words(line)
    assert words is not None, f"unbalanced quotes: {line!r}"
    commands: list[list[str]] = [[]]
    for word in words:
        if word in {"&&", "||", ";", "|", "&"}:
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def page_commands(page: Path) -> list[Command]:
    """Every command shown on ``page``: in its shell blocks and in inline code spans."""
    text = page.read_text(encoding="utf-8")
    name = str(page.relative_to(REPO))
    lines: list[str] = []
    for language, body in fenced_blocks(text):
        if language in SHELL_LANGUAGES:
            lines += block_commands(language, body)
    prose = FENCE.sub("", text)
    lines += [" ".join(m.group(1).split()) for m in INLINE_COMMAND.finditer(prose)]
    out = []
    for line in lines:
        for words in split_commands(line):
            out.append(Command(name, tuple(words), " ".join(line.split())))
    return out


def python_blocks(page: Path) -> list[str]:
    """The bodies of the ``python`` blocks of a page."""
    text = page.read_text(encoding="utf-8")
    return [body for language, body in fenced_blocks(text) if language == "python"]


def resolve_module(name: str) -> Path | None:
    """The file (``x.py``) or package folder that ``python -m name`` runs, or None."""
    parts = name.split(".")
    roots: list[tuple[Path, list[str]]]
    if parts[:2] == ["nmbatch", "engine"]:
        roots = [(REPO / "engine", parts[2:])]
    elif parts[:2] == ["nmbatch", "service"]:
        roots = [(REPO / "service", parts[2:])]
    else:
        roots = [(REPO / parts[0], parts[1:])]
    for base, rest in roots:
        target = base.joinpath(*rest)
        if rest and target.with_suffix(".py").is_file():
            return target.with_suffix(".py")
        if any((target / name).is_file() for name in ("__init__.py", "__main__.py")):
            return target
    return None


def _imported_files(current: Path, node: ast.ImportFrom) -> list[Path]:
    """Files in the repository that one ``from ... import ...`` of ``current`` may load."""
    if node.level:
        package = current.parent
        for _ in range(node.level - 1):
            package = package.parent
        base = package.joinpath(*node.module.split(".")) if node.module else package
        names = [base, *(base / alias.name for alias in node.names)]
        files = [n.with_suffix(".py") for n in names] + [n / "__init__.py" for n in names]
    else:
        modules = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        resolved = [m for m in map(resolve_module, modules) if m is not None]
        files = [m / "__init__.py" if m.is_dir() else m for m in resolved]
    return [f for f in files if f.is_file()]


def module_sources(path: Path) -> list[Path]:
    """Source files whose argument parsers a ``python -m`` of ``path`` may use.

    A package: all its files. A module: the file and, transitively, the modules it
    imports from its own folder (``from .x import``, ``from benchmarks.x import``), so
    that a parser moved into a helper module still counts.
    """
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    seen: list[Path] = []
    todo = [path]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.append(current)
        for node in ast.walk(ast.parse(current.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                todo += [f for f in _imported_files(current, node) if path.parent in f.parents]
    return seen


def long_flags(words: tuple[str, ...] | list[str]) -> list[str]:
    """The ``--long`` options among ``words`` (a ``--name=value`` counts as ``--name``)."""
    flags = []
    for word in words:
        flags += re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", word)
    return flags


def makefile_targets() -> set[str]:
    """The targets the Makefile defines."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w.-]*):(?!=)", text, re.MULTILINE))


def makefile_recipe(target: str) -> str:
    """The recipe lines of one Makefile target."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)*)", text, re.MULTILINE)
    assert match, target
    return match.group(1)


def bench_variables() -> set[str]:
    """``NMBATCH_*`` environment variables the benchmarks read (not service settings)."""
    found: set[str] = set()
    for path in (REPO / "benchmarks").rglob("*.py"):
        found |= set(NMBATCH_VARIABLE.findall(path.read_text(encoding="utf-8")))
    return found


def harness_variables() -> set[str]:
    """``NMBATCH_*`` variables of the test harness (the Makefile, the tests' conftest files)."""
    paths = [REPO / "Makefile", *(REPO / "tests").rglob("conftest.py")]
    found: set[str] = set()
    for path in paths:
        found |= set(NMBATCH_VARIABLE.findall(path.read_text(encoding="utf-8")))
    return found
