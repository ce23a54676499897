"""Password guessing is paused per account and per address, visibly in the audit log, and the
pause ends by itself. (The counters live in the suite's real cache, so every test uses
usernames and addresses of its own.)"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse

from portal.models import AuditEvent

pytestmark = pytest.mark.django_db

PASSWORD = "a long test passphrase"
LIMITS = {
    "TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT": 3,
    "TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS": 5,
    "TAU_AUTH_LOGIN_LOCKOUT_SECONDS": 600,
}


def address() -> str:
    return f"192.168.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def new_user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(
        username=f"lee{secrets.token_hex(4)}", password=PASSWORD
    )


def login(username: str, password: str, source: str) -> Any:
    client = Client(REMOTE_ADDR=source)
    response: Any = client.post(reverse("login"), {"username": username, "password": password})
    response.logged_in = "_auth_user_id" in client.session
    return response


def paused(response: Any) -> bool:
    return response.status_code == 429 and b"password login is paused" in response.content


def locks(**filters: Any) -> list[Any]:
    return list(AuditEvent.objects.unscoped().filter(action="login.locked", **filters))


@override_settings(**LIMITS)
def test_guessing_one_accounts_password_pauses_it(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    for _ in range(3):  # from a new address each time: only the account's count grows
        response = login(user.username, "wrong", address())
        assert response.status_code in (200, 429)
        assert not response.logged_in
    assert paused(response), "the failure that reaches the limit says so at once"
    # Now even the right password is refused, from anywhere, before it is checked.
    failures_before = AuditEvent.objects.unscoped().filter(action="login.failed").count()
    right = login(user.username, PASSWORD, address())
    assert paused(right)
    assert not right.logged_in
    assert b"Try again in 10 minutes." in right.content
    assert user.username.encode() in right.content  # the form keeps what was typed
    assert AuditEvent.objects.unscoped().filter(action="login.failed").count() == failures_before
    # The pause is one audit event, naming the account.
    [event] = locks()
    assert event.object_type == "auth.user"
    assert event.object_id == str(user.pk)
    assert user.username in event.object_repr
    assert "wrong" not in event.object_repr
    # Other accounts are not affected.
    other = new_user(django_user_model)
    assert login(other.username, PASSWORD, address()).logged_in


@override_settings(**LIMITS)
def test_the_account_count_ignores_case_and_compatibility_forms(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    fullwidth = "".join(chr(ord(char) + 0xFEE0) for char in user.username)
    for typed in (user.username.upper(), fullwidth, user.username):
        login(typed, "wrong", address())
    assert paused(login(user.username, PASSWORD, address()))


@override_settings(**LIMITS)
def test_spraying_from_one_address_pauses_that_address(django_user_model: Any) -> None:
    attacker = address()
    for _ in range(5):  # one guess each at many accounts: no account reaches its limit
        login(f"nobody{secrets.token_hex(4)}", "Summer2026!", attacker)
    user = new_user(django_user_model)
    blocked = login(user.username, PASSWORD, attacker)
    assert paused(blocked)
    assert not blocked.logged_in
    [event] = locks()
    assert (event.object_type, event.object_id, event.remote_addr) == (
        "address",
        attacker,
        attacker,
    )
    # The same account from another address logs in.
    assert login(user.username, PASSWORD, address()).logged_in


@override_settings(
    TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT=2,
    TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS=100,
    TAU_AUTH_LOGIN_LOCKOUT_SECONDS=1,
)
def test_the_right_password_works_again_after_the_pause(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    login(user.username, "wrong", address())
    login(user.username, "wrong", address())
    assert paused(login(user.username, PASSWORD, address()))
    time.sleep(1.5)
    assert login(user.username, PASSWORD, address()).logged_in


@override_settings(**LIMITS)
def test_a_successful_login_clears_the_accounts_count(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    for _ in range(2):
        login(user.username, "wrong", address())
    assert login(user.username, PASSWORD, address()).logged_in
    for _ in range(2):
        login(user.username, "wrong", address())
    assert login(user.username, PASSWORD, address()).logged_in
    assert locks() == []


@override_settings(**LIMITS)
def test_successes_from_a_shared_address_do_not_count(django_user_model: Any) -> None:
    """An office behind one address logs in all day without pausing itself."""
    office = address()
    for _ in range(8):
        assert login(new_user(django_user_model).username, PASSWORD, office).logged_in
    assert locks() == []


@override_settings(**LIMITS)
def test_an_incomplete_form_is_not_a_failure(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    source = address()
    for _ in range(6):
        assert login(user.username, "", source).status_code == 200
    assert login(user.username, PASSWORD, source).logged_in


@override_settings(**LIMITS, TAU_OIDC_ENABLED=True, TAU_OIDC_PROVIDER_NAME="Keycloak")
def test_the_pause_points_to_single_sign_on(django_user_model: Any) -> None:
    user = new_user(django_user_model)
    for _ in range(3):
        login(user.username, "wrong", address())
    response = login(user.username, PASSWORD, address())
    assert paused(response)
    assert b"Logging in with Keycloak still works." in response.content
