"""Fixtures of the dashboard's browser tests: Debian's headless Chromium driven by
Playwright (never a browser download), and real service processes to point it at.

When no ``chromium`` executable is found the tests skip, saying why, in a plain
``pytest`` run; with ``NMBATCH_REQUIRE_BROWSER=1`` (set by ``make test``, which first runs
``tools/ensure_chromium.sh`` to install it) they fail instead.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, sync_playwright

from tests.faults.fault_helpers import ServiceProcess

#: The launch arguments the dashboard's tests use (a fresh profile comes with each context).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LAPTOP = {"width": 1366, "height": 768}


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The system Chromium's path. When there is none: fails the test with
    ``NMBATCH_REQUIRE_BROWSER=1``, else skips it."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    why = (
        "no chromium executable on PATH: install Debian's chromium and chromium-driver "
        "(tools/ensure_chromium.sh, which `make test` runs)"
    )
    if os.environ.get("NMBATCH_REQUIRE_BROWSER") == "1":
        pytest.fail(why + "; NMBATCH_REQUIRE_BROWSER=1 makes it an error")
    pytest.skip(why)


@pytest.fixture
def browser(chromium_path: str, tmp_path: Path) -> Iterator[BrowserContext]:
    """A headless Chromium context with a fresh user-data folder, at a laptop's size."""
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=chromium_path,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=LAPTOP,
        )
        try:
            yield context
        finally:
            context.close()


class WatchedPage:
    """A page with its console errors, uncaught exceptions and requests recorded.

    A console error is recorded as ``console error: <text> [<url>]``, the URL being the
    message's source (for a failed request, the request's address).
    """

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("request", lambda r: self.requests.append((r.url, r.headers)))

    def _console(self, message: Any) -> None:
        if message.type in ("error", "assert"):
            where = message.location.get("url", "")
            self.errors.append(f"console {message.type}: {message.text} [{where}]")


@pytest.fixture
def open_page(browser: BrowserContext) -> Callable[[], WatchedPage]:
    """``open_page()``: a new tab of the browser, watched."""
    return lambda: WatchedPage(browser.new_page())


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start ``python -m nmbatch`` processes (real redis-server); all stopped at the end."""
    procs: list[ServiceProcess] = []

    def start(name: str, **settings: Any) -> ServiceProcess:
        proc = ServiceProcess(tmp_path, name, **settings).start()
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            proc.close()
