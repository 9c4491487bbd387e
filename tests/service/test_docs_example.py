"""The example page (docs/example.md) is real: both of its sessions run against a live
service and answer what the page shows.

Each session gets its own ``python -m nmbatch`` (``NMBATCH_METRIC=cosine NMBATCH_K=2
NMBATCH_SEED=1``, the default model) on a fresh redis-server. The ``console`` block's
``curl`` commands are sent as they are written (method, path, body; ``-w`` appends the
status) and each answer is compared with the line the page prints under it, but for
``version`` and ``updated_at`` (a ``GET /centroids`` is polled until the model
converged on the samples the page shows). The ``pycon`` block runs as a doctest, its
URL the live service's.
"""

from __future__ import annotations

import doctest
import json
import math
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nmbatch.service.embedded_redis import EmbeddedRedis
from tests.docs_commands import DOCS, fenced_blocks
from tests.faults.fault_helpers import ServiceProcess
from tests.testkit import wait_until

PAGE = DOCS / "example.md"
SHOWN_URL = "http://127.0.0.1:8000"
UNSTABLE = {"version", "updated_at"}  # differ from run to run


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    """A ready service on a fresh redis-server, as the page starts it."""
    server = EmbeddedRedis(tmp_path / "redis", port=0)
    server.start()
    proc = ServiceProcess(tmp_path, "example", redis_url=server.url, metric="cosine", k=2,
                          seed=1, worker_threads=1, poll_seconds=0.05).start()  # fmt: skip
    try:
        proc.ready(60)
        yield proc
    finally:
        proc.close()
        server.stop()


def _block(language: str) -> str:
    (body,) = [body for lang, body in fenced_blocks(PAGE.read_text()) if lang == language]
    return body


def _console(body: str) -> list[tuple[list[str], str]]:
    """``(words, printed)`` of each ``$ curl`` line and the line under it."""
    lines = body.splitlines()
    return [(shlex.split(line[2:]), lines[i + 1]) for i, line in enumerate(lines)
            if line.startswith("$ ")]  # fmt: skip


def _request(words: list[str]) -> tuple[str, str, bytes | None, bool]:
    """``(method, path, body, with_status)`` of a ``curl`` command of the page."""
    assert words[0] == "curl"
    method, body, path, with_status = "GET", None, "", False
    args = iter(words[1:])
    for word in args:
        if word == "-X":
            method = next(args)
        elif word == "-d":
            body, method = next(args).encode(), "POST" if method == "GET" else method
        elif word == "-H":
            next(args)
        elif word == "-w":
            with_status = next(args) == " (%{http_code})"
        elif word.startswith("$U"):
            path = word[2:]
    return method, path, body, with_status


def _same(got: Any, shown: Any) -> bool:
    """JSON values equal but for :data:`UNSTABLE` members, floats to 1e-6."""
    if isinstance(shown, dict):
        keys = set(shown) - UNSTABLE
        return isinstance(got, dict) and keys == set(got) - UNSTABLE and \
            all(_same(got[key], shown[key]) for key in keys)  # fmt: skip
    if isinstance(shown, list):
        return isinstance(got, list) and len(got) == len(shown) and \
            all(_same(a, b) for a, b in zip(got, shown, strict=True))  # fmt: skip
    if isinstance(shown, float) or isinstance(got, float):
        return isinstance(got, int | float) and math.isclose(got, shown, rel_tol=1e-6,
                                                             abs_tol=1e-7)  # fmt: skip
    return bool(got == shown)


def test_the_curl_session_answers_what_the_page_shows(service: ServiceProcess) -> None:
    for words, printed in _console(_block("console")):
        method, path, body, with_status = _request(words)
        status = None
        if with_status:
            printed, _, code = printed.rpartition(" ")
            status = int(code.strip("()"))
        shown = json.loads(printed)

        def send(method: str = method, path: str = path, body: bytes | None = body) -> Any:
            headers = {"content-type": "application/json"}
            return httpx.request(method, service.base + path, content=body, headers=headers,
                                 timeout=30)  # fmt: skip

        if path == "/centroids":  # the page shows the model once converged on its samples

            def settled(send: Any = send, shown: dict[str, Any] = shown) -> Any:
                doc = send().json()
                ok = doc.get("converged") and doc.get("n_samples") == shown["n_samples"]
                return doc if ok else None

            got = wait_until(settled, 60, f"centroids as shown: {printed}")
        else:
            answer = send()
            got = answer.json()
            if status is not None:
                assert answer.status_code == status, (words, answer.text)
        assert _same(got, shown), f"{shlex.join(words)}\n shown: {printed}\n   got: {got}"


def test_the_python_session_answers_what_the_page_shows(service: ServiceProcess) -> None:
    source = _block("pycon").replace(SHOWN_URL, service.base)
    test = doctest.DocTestParser().get_doctest(source, {}, "example", str(PAGE), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=False)
    test.globs["client"].close()
    assert runner.failures == 0, "".join(report)
