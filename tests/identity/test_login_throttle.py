"""Password guessing is bounded without letting anyone lock others out
(``identity.login_throttle``): failures pause one account from one address, slow an account's
new browsers (never its known ones), and spraying from an address pauses only the accounts
that failed there. Every pause or slow-down is visible in the audit log and ends by itself.

The first two tests are the attacks of issue 30, with the default limits: ten wrong passwords
for an account used to lock its right password out from everywhere, and fifty failures from
one address locked out everyone behind it. (The counters live in the suite's real cache, so
every test uses usernames and addresses of its own.)"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

import pytest
from django.conf import settings
from django.core import signing
from django.test import Client, override_settings
from django.urls import reverse

from identity.login_throttle import DEVICE_COOKIE, account_key
from portal.models import AuditEvent

pytestmark = pytest.mark.django_db

PASSWORD = "a long test passphrase"
LIMITS = {
    "TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT_ADDRESS": 3,
    "TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT": 6,
    "TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS": 8,
    "TAU_AUTH_LOGIN_LOCKOUT_SECONDS": 600,
    "TAU_AUTH_LOGIN_BACKOFF_SECONDS": 60,
}


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    """Hundreds of password checks: the cheap hasher keeps them quick (what is counted is
    the same)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def address() -> str:
    return f"192.168.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def new_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(
        username=f"lee{secrets.token_hex(4)}", password=PASSWORD
    )


def login(username: str, password: str, source: str, client: Client | None = None) -> Any:
    """One attempt at the login form, from a new browser unless ``client`` is given (one
    that logged in before keeps its cookies, and is logged out again afterwards)."""
    client = client or Client(REMOTE_ADDR=source)
    response: Any = client.post(
        reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=source
    )
    response.logged_in = "_auth_user_id" in client.session
    if response.logged_in:
        client.post(reverse("logout"), REMOTE_ADDR=source)
    return response


def known_browser(user: Any, source: str) -> Client:
    """A browser that has logged in to ``user`` once (and logged out)."""
    client = Client(REMOTE_ADDR=source)
    assert login(user.username, PASSWORD, source, client).logged_in
    assert DEVICE_COOKIE in client.cookies
    return client


def paused(response: Any) -> bool:
    return response.status_code == 429 and b"password login for it is paused here" in (
        response.content
    )


def slowed(response: Any) -> bool:
    return response.status_code == 429 and b"from new browsers are slowed" in response.content


def checked() -> int:
    """Passwords checked and found wrong so far (each is one login.failed event)."""
    return AuditEvent.objects.unscoped().filter(action="login.failed").count()


def events(action: str = "login.locked", **filters: Any) -> list[Any]:
    return list(AuditEvent.objects.unscoped().filter(action=action, **filters))


# --- The attacks of issue 30, with the default limits ----------------------------------------


def test_ten_wrong_passwords_do_not_lock_the_owner_out(django_user_model: Any) -> None:
    assert settings.TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT == 10
    admin = new_user(django_user_model)
    owner_browser = known_browser(admin, address())
    attacker = address()
    for _ in range(10):
        assert not login(admin.username, "wrong", attacker).logged_in
    # From another address, even a browser that never logged in gets in.
    assert login(admin.username, PASSWORD, address()).logged_in
    # From the attacker's own address too, in a browser that logged in before.
    assert login(admin.username, PASSWORD, attacker, owner_browser).logged_in


def test_fifty_failures_from_an_address_do_not_block_the_others_behind_it(
    django_user_model: Any,
) -> None:
    """Under ``make run`` every browser is 127.0.0.1: one person guessing must not lock out
    everyone else."""
    assert settings.TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS == 50
    shared = f"127.0.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"
    for _ in range(55):
        login(f"nobody{secrets.token_hex(4)}", "Summer2026!", shared)
    colleague = new_user(django_user_model)
    assert login(colleague.username, PASSWORD, shared).logged_in  # a new browser, first login


# --- Each limit ------------------------------------------------------------------------------


@override_settings(**LIMITS)
def test_guessing_from_one_address_pauses_that_account_there(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    attacker = address()
    responses = [login(user.username, "wrong", attacker) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert paused(responses[-1]), "the failure that reaches the limit says so at once"
    assert responses[-1]["Retry-After"] == "600"
    # Now even the right password is refused from there, before it is checked.
    before = checked()
    right = login(user.username, PASSWORD, attacker)
    assert paused(right)
    assert not right.logged_in
    assert b"Try again in 10 minutes." in right.content
    assert user.username.encode() in right.content  # the form keeps what was typed
    assert checked() == before
    # The pause is one audit event, naming the account and the address.
    [event] = events()
    assert (event.object_type, event.object_id) == ("auth.user", str(user.pk))
    assert user.username in event.object_repr
    assert attacker in event.object_repr
    assert "wrong" not in event.object_repr
    # Other accounts from that address, and this account from elsewhere, are not affected.
    assert login(new_user(django_user_model).username, PASSWORD, attacker).logged_in
    assert login(user.username, PASSWORD, address()).logged_in


@override_settings(**LIMITS)
def test_the_account_count_ignores_case_and_compatibility_forms(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    attacker = address()
    fullwidth = "".join(chr(ord(char) + 0xFEE0) for char in user.username)
    for typed in (user.username.upper(), fullwidth, user.username):
        login(typed, "wrong", attacker)
    assert paused(login(user.username, PASSWORD, attacker))


@override_settings(**LIMITS)
def test_guessing_from_many_addresses_slows_new_browsers_only(django_user_model: Any) -> None:
    """Six failures in a row from six addresses, then one guess at a time, each after a
    wait; the owner's known browser is never slowed."""
    user = new_user(django_user_model)
    owner_browser = known_browser(user, address())
    before = checked()
    for _ in range(6):
        assert login(user.username, "wrong", address()).status_code == 200
    # The seventh is checked (and sets a minute's wait); nothing else is, from anywhere.
    assert login(user.username, "wrong", address()).status_code == 200
    refused = [login(user.username, "wrong", address()) for _ in range(20)]
    assert all(slowed(response) for response in refused)
    assert checked() - before == 7
    assert 55 <= int(refused[-1]["Retry-After"]) <= 60
    assert re.search(rb"Try again in \d+ seconds", refused[0].content)
    # The right password from a new browser waits too; from the owner's browser it does not.
    assert slowed(login(user.username, PASSWORD, address()))
    assert login(user.username, PASSWORD, address(), owner_browser).logged_in
    [event] = events("login.slowed")
    assert event.object_id == str(user.pk)


@override_settings(**{**LIMITS, "TAU_AUTH_LOGIN_BACKOFF_SECONDS": 1})
def test_a_slowed_account_takes_a_new_browsers_right_password_after_the_wait(
    django_user_model: Any,
) -> None:
    user = new_user(django_user_model)
    for _ in range(7):
        login(user.username, "wrong", address())
    assert slowed(login(user.username, PASSWORD, address()))
    time.sleep(1.5)  # the seventh failure's wait: one second
    assert login(user.username, PASSWORD, address()).logged_in
    # The success forgave the failures: no more waiting.
    assert login(user.username, "wrong", address()).status_code == 200
    assert login(user.username, PASSWORD, address()).logged_in


@override_settings(**LIMITS)
def test_spraying_from_one_address_pauses_only_accounts_that_fail_there(
    django_user_model: Any,
) -> None:
    attacker = address()
    for _ in range(8):  # one guess each at many accounts: no account reaches its limit
        login(f"nobody{secrets.token_hex(4)}", "Summer2026!", attacker)
    [event] = events(object_type="address")
    assert (event.object_id, event.remote_addr) == (attacker, attacker)
    # From now on a single failure pauses an account there...
    victim = new_user(django_user_model)
    assert paused(login(victim.username, "Summer2026!", attacker))
    assert paused(login(victim.username, PASSWORD, attacker))
    # ...while everyone who did not fail there logs in, from the same address.
    assert login(new_user(django_user_model).username, PASSWORD, attacker).logged_in
    assert login(victim.username, PASSWORD, address()).logged_in


@override_settings(**LIMITS)
def test_a_known_browser_gets_only_a_few_guesses_of_its_own(django_user_model: Any) -> None:
    """A stolen cookie is worth the account-and-address limit's guesses, once: then that
    browser is a new one for the account (and at the same address, paused)."""
    user = new_user(django_user_model)
    source = address()
    browser = known_browser(user, source)
    before = checked()
    for _ in range(3):
        assert login(user.username, "wrong", source, browser).status_code == 200
    assert checked() - before == 3
    for _ in range(3):
        login(user.username, "wrong", source, browser)
    assert paused(login(user.username, PASSWORD, source, browser))
    assert checked() - before == 6


@override_settings(**LIMITS)
def test_a_cookie_is_good_only_for_its_own_accounts(django_user_model: Any) -> None:
    owner, other = new_user(django_user_model), new_user(django_user_model)
    source = address()
    browser = known_browser(owner, source)
    for _ in range(3):
        login(other.username, "wrong", source)
    assert paused(login(other.username, PASSWORD, source, browser))
    # A cookie someone wrote themselves naming the account is not signed by the portal.
    forged = Client(REMOTE_ADDR=source)
    forged.cookies[DEVICE_COOKIE] = signing.dumps(
        {"d": "x", "a": [account_key(other.username)]}, key="not-the-portals-secret"
    )
    assert paused(login(other.username, PASSWORD, source, forged))


@override_settings(**{**LIMITS, "TAU_AUTH_LOGIN_LOCKOUT_SECONDS": 1})
def test_the_right_password_works_again_after_the_pause(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    source = address()
    for _ in range(3):
        login(user.username, "wrong", source)
    assert paused(login(user.username, PASSWORD, source))
    time.sleep(1.5)
    assert login(user.username, PASSWORD, source).logged_in


@override_settings(**LIMITS)
def test_a_successful_login_clears_the_counts(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    source = address()
    for _ in range(2):
        login(user.username, "wrong", source)
    assert login(user.username, PASSWORD, source).logged_in
    for _ in range(2):
        login(user.username, "wrong", source)
    assert login(user.username, PASSWORD, source).logged_in
    assert events() == []


@override_settings(**LIMITS)
def test_successes_from_a_shared_address_do_not_count(django_user_model: Any) -> None:
    """An office behind one address logs in all day without pausing itself."""
    office = address()
    for _ in range(12):
        assert login(new_user(django_user_model).username, PASSWORD, office).logged_in
    assert events() == []


@override_settings(**LIMITS)
def test_an_incomplete_form_is_not_a_failure(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    source = address()
    for _ in range(10):
        assert login(user.username, "", source).status_code == 200
    assert login(user.username, PASSWORD, source).logged_in


@override_settings(**LIMITS, TAU_OIDC_ENABLED=True, TAU_OIDC_PROVIDER_NAME="Keycloak")
def test_the_refusal_points_to_single_sign_on(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    source = address()
    for _ in range(3):
        login(user.username, "wrong", source)
    response = login(user.username, PASSWORD, source)
    assert paused(response)
    assert b"Logging in with Keycloak still works." in response.content
