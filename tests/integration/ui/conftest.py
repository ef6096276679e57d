"""The headless browser of the web UI tests: Debian's chromium (deploy/local/browser.sh install),
driven by Playwright with a fresh profile; never a browser downloaded by `playwright install`."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Page, Request, sync_playwright

from tests.conftest import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 900}
SCREENSHOTS = ("ui-overview", "ui-job-graph", "ui-checkpoints", "ui-checkpoint-timeline", "ui-exceptions")
DOCS_IMAGES = REPO_ROOT / "docs" / "images"


@pytest.fixture(scope="session")
def chromium() -> str:
    """/usr/bin/chromium, installed by deploy/local/browser.sh when missing (idempotent)."""
    result = subprocess.run(
        [str(REPO_ROOT / "deploy/local/browser.sh"), "install"], capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        pytest.fail(f"chromium did not install:\n{result.stderr[-3000:]}", pytrace=False)
    return CHROMIUM


@dataclass
class BrowserPage:
    """A page with what it logged: console errors, uncaught exceptions and every URL it requested."""

    page: Page
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[BrowserPage]:
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as playwright:
        context: BrowserContext = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, args=CHROMIUM_ARGS, headless=True, viewport=VIEWPORT
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(30_000)
            logged = BrowserPage(page)

            def on_console(message: ConsoleMessage) -> None:
                if message.type == "error":
                    logged.console_errors.append(f"{message.text} ({message.location.get('url', '')})")

            def on_request(request: Request) -> None:
                logged.requests.append(request.url)

            page.on("console", on_console)
            page.on("pageerror", lambda error: logged.page_errors.append(str(error)))
            page.on("request", on_request)
            yield logged
        finally:
            context.close()


@dataclass(frozen=True)
class Screenshots:
    """Where a test's screenshots go: always into ``directory``; into docs/images/ as well when
    WEIR_UI_SCREENSHOTS=1 (the images docs/ui.md shows come from such a run)."""

    directory: Path
    publish: bool

    def take(self, page: Page, name: str, *, full_page: bool = True) -> Path:
        assert name in SCREENSHOTS, name
        path = self.directory / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        if self.publish:
            DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, DOCS_IMAGES / path.name)
        return path


@pytest.fixture
def screenshots(tmp_path: Path) -> Screenshots:
    directory = tmp_path / "screenshots"
    directory.mkdir()
    return Screenshots(directory, publish=os.environ.get("WEIR_UI_SCREENSHOTS") == "1")
