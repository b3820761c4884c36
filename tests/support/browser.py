"""A headless browser for the tests: Playwright driving Debian's Chromium (the ``chromium``
package, which ``.ci/run`` installs), never a browser Playwright downloads itself.

``chromium()`` skips the test with a reason where Playwright or the Chromium binary is missing
(a failure under ``CI=true``). Screenshots go to ``test-artifacts/`` at the checkout's root
(ignored by git), where CI and a developer find them after the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_NAMES = ("chromium", "chromium-browser")  # Debian's binary, and Ubuntu's older name
WIDTHS = (1280, 390)  # a laptop and a phone, the widths every page must be readable at


def chromium_path() -> str | None:
    """The Chromium binary: ``RECAP_TEST_CHROMIUM``, else Debian's on the PATH."""
    given = os.environ.get("RECAP_TEST_CHROMIUM")
    if given:
        return given if Path(given).exists() else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def missing_browser() -> str | None:
    """Why no browser test can run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    if chromium_path() is None:
        return "Debian's Chromium is not installed (apt-get install -y chromium)"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (a Playwright ``Browser``), closed afterwards."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    assert path is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def screenshot(page: Any, name: str, *, full_page: bool = True) -> Path:
    """A screenshot under ``test-artifacts/`` (the whole page, or what the viewport shows); its
    path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def watch(page: Any, origin: str) -> tuple[list[str], list[str]]:
    """The errors a page logs (a script that failed, a resource the content-security policy
    refused) and the URLs it asks for outside ``origin``, collected as it runs."""
    errors: list[str] = []
    elsewhere: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda r: None if r.url.startswith(origin) else elsewhere.append(r.url))
    return errors, elsewhere
