"""Driving Debian's Chromium with Playwright in tests.

Playwright's own browser download is blocked here, so it launches /usr/bin/chromium (installed
by ``make test``), headless, as root-safe, with the network features that phone home turned
off. Screenshots go to ``test-artifacts/`` for people to look at after a run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("TAU_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    # Chromium 15x preloads the omnibox's pop-ups (WebUI pages) in every window, which in
    # headless mode means every browser context: they cost more CPU than the page under test
    # (~1 s a context; 10 contexts: 14.4 s of CPU with them, 4.1 s without).
    "--disable-features=Translate,MediaRouter,OptimizationHints,"
    "WebUIOmniboxPopup,WebUIOmniboxAimPopup",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: make test installs Debian's chromium package")
        pytest.skip(f"{CHROMIUM} is missing; run `make test-tools` to install it")
    # Playwright's sync API keeps an event loop in this thread; Django's ORM calls made by the
    # test itself (not by the live server, which has its own thread) are still synchronous.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    # Playwright gives every launch a fresh, temporary profile of its own.
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    new_page = context.new_page()
    try:
        yield new_page
    finally:
        context.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
