"""Under ``make run`` every browser is 127.0.0.1: someone guessing a colleague's password
from another browser on the same machine must not lock the colleague out. In real Chromium
(so the ``tau_device`` cookie is kept and sent as a browser does, only to the login page):
the owner's browser logs in after the guesses; a browser that never logged in to that
account is told, on the page, that password login for it is paused here."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from portal.models import AuditEvent
from tests.browser import screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "a long test passphrase"


def submit_login(page: Any, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def test_guesses_from_another_browser_on_the_machine_do_not_lock_the_owner_out(
    live_server: Any, browser: Any, settings: Any, django_user_model: Any
) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    owner = django_user_model.objects.create_user(
        username=f"ada{secrets.token_hex(4)}", password=PASSWORD
    )
    base = live_server.url
    owners_browser = browser.new_context()
    attackers_browser = browser.new_context()
    new_browser = browser.new_context()
    try:
        page = owners_browser.new_page()
        submit_login(page, base, owner.username, PASSWORD)
        assert not page.url.startswith(f"{base}/login/")
        page.get_by_role("button", name="Log out").click()
        page.wait_for_url(f"{base}/login/")

        attacker = attackers_browser.new_page()
        for _ in range(10):
            submit_login(attacker, base, owner.username, "Summer2026!")
        assert attacker.locator("#login-paused").is_visible()
        assert "password login for it is paused here" in attacker.inner_text("#login-paused")

        # The owner's browser, at the same address: checked, and in.
        submit_login(page, base, owner.username, PASSWORD)
        assert not page.url.startswith(f"{base}/login/")
        assert (
            AuditEvent.objects.unscoped()
            .filter(action="login.success", actor_username=owner.username)
            .count()
            == 2
        )

        # A browser that never logged in to the account: paused here, and told so.
        fresh = new_browser.new_page()
        submit_login(fresh, base, owner.username, PASSWORD)
        assert fresh.url.startswith(f"{base}/login/")
        notice = fresh.inner_text("#login-paused")
        assert "Try again in 15 minutes." in notice
        screenshot(fresh, "login-paused-for-this-account")
    finally:
        for context in (owners_browser, attackers_browser, new_browser):
            context.close()
