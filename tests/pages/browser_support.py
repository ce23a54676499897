"""Helpers for browser tests of the portal's pages: log in a browser context as a test user,
check a page with axe-core, collect Content Security Policy violations, take screenshots at
the two widths the portal is designed for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.test import Client

from tests.browser import ARTIFACTS

AXE = Path(__file__).resolve().parent / "browser_tools" / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = {"desktop": 1280, "phone": 390}


def log_in(context: Any, base_url: str, user: Any) -> None:
    """Give the browser a real session for ``user`` (made by Django's test client)."""
    client = Client()
    client.force_login(user)
    context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": base_url}]
    )


def watch_console(page: Any) -> list[str]:
    """Collect CSP violations and script errors the page reports."""
    problems: list[str] = []

    def on_console(message: Any) -> None:
        text = message.text
        if message.type == "error" and (
            "Content Security Policy" in text or "Uncaught" in text or "Refused to" in text
        ):
            location = message.location or {}
            problems.append(
                f"{page.url}: {text} ({location.get('url', '')}:{location.get('lineNumber', '')})"
            )

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    return problems


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """Serious and critical accessibility violations on the current page (axe-core)."""
    if not AXE.exists():
        raise AssertionError("axe-core is missing: make test-tools installs it")
    # Evaluated through the DevTools protocol, so the page's CSP does not block it.
    page.evaluate(AXE.read_text())
    result = page.evaluate(
        "async () => { const r = await axe.run(document, {resultTypes: ['violations']});"
        " return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)})); }"
    )
    return [v for v in result if v["impact"] in {"serious", "critical"}]


def check_page(page: Any, name: str) -> None:
    """Screenshots at both widths, and no serious accessibility problem at either."""
    for label, width in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(150)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"page-{name}-{label}.png"), full_page=True)
        violations = axe_violations(page)
        assert violations == [], f"{name} at {width}px: {json.dumps(violations, indent=1)}"
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{name} scrolls sideways at {width}px (by {overflow}px)"
    page.set_viewport_size({"width": WIDTHS["desktop"], "height": 900})
