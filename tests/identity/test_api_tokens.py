"""API tokens: what is stored, what is refused, and that every refusal looks the same."""

from __future__ import annotations

import io
import secrets
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from identity import tokens
from identity.models import ApiToken
from portal.models import AuditEvent
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

WORKSPACE = reverse("api:workspace-detail", kwargs={"workspace_slug": "alpha"})
MEMBERS = reverse("api:member-list", kwargs={"workspace_slug": "alpha"})


def bearer(plaintext: str, address: str = "10.0.0.1") -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def issue(world: Any, who: str = "workspace_admin", **options: Any) -> tokens.IssuedToken:
    return tokens.issue_token(user=world.users[who], name="test", **options)


def test_token_format_and_storage(world: Any) -> None:
    issued = issue(world)
    assert tokens.TOKEN_PATTERN.match(issued.plaintext)
    assert issued.plaintext.startswith("tau_")
    secret = issued.plaintext.split("_")[2]
    # Nowhere in the database: not in the token row, not in the audit log.
    with connection.cursor() as cursor:
        for table in ("portal_apitoken", "portal_auditevent"):
            cursor.execute(f"SELECT * FROM {table}")  # noqa: S608 - fixed table names
            dump = repr(cursor.fetchall())
            assert secret not in dump
            assert issued.plaintext not in dump
    row = ApiToken.objects.get(pk=issued.token.pk)
    assert len(row.secret_hash) == 64
    assert row.secret_hash != secret


def test_a_valid_token_reaches_the_api(world: Any) -> None:
    issued = issue(world)
    response = bearer(issued.plaintext).get(WORKSPACE)
    assert response.status_code == 200
    assert response.json()["role"] == "admin"


def refusal(client: APIClient) -> tuple[int, Any, str]:
    response = client.get(WORKSPACE)
    return response.status_code, response.json(), response.get("WWW-Authenticate", "")


def test_every_failure_gets_the_same_answer(world: Any) -> None:
    issued = issue(world)
    key = issued.token.key
    unknown_key = refusal(bearer("tau_" + "z" * 12 + "_" + "A" * 40))
    wrong_secret = refusal(bearer(f"tau_{key}_" + "B" * 40, address="10.0.0.2"))
    malformed = refusal(bearer("not-a-token", address="10.0.0.3"))
    assert unknown_key == wrong_secret == malformed
    assert unknown_key[0] == 401
    assert unknown_key[1] == {"detail": "Invalid or expired token."}
    assert unknown_key[2].startswith("Bearer")


def test_expired_and_revoked_tokens_are_refused(world: Any) -> None:
    expired = issue(world)
    ApiToken.objects.filter(pk=expired.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    revoked = issue(world)
    tokens.revoke_token(token=revoked.token)
    assert refusal(bearer(expired.plaintext, "10.0.1.1"))[:2] == (
        401,
        {"detail": "Invalid or expired token."},
    )
    assert refusal(bearer(revoked.plaintext, "10.0.1.2"))[:2] == (
        401,
        {"detail": "Invalid or expired token."},
    )
    expired_use = AuditEvent.objects.unscoped().get(action="token.expired_use")
    assert expired_use.actor_username == "alice"
    assert AuditEvent.objects.unscoped().filter(action="token.revoke").count() == 1


def test_inactive_users_tokens_are_refused(world: Any) -> None:
    issued = issue(world)
    user = world.users["workspace_admin"]
    user.is_active = False
    user.save()
    assert refusal(bearer(issued.plaintext))[0] == 401


def test_read_only_tokens_cannot_write(world: Any) -> None:
    issued = issue(world, read_only=True)
    client = bearer(issued.plaintext)
    assert client.get(MEMBERS).status_code == 200
    response = client.post(MEMBERS, {"username": "otto", "role": "viewer"}, format="json")
    assert response.status_code == 403
    assert response.json() == {"detail": "This token is read-only."}
    assert not Membership.objects.for_workspace(world.alpha).filter(user__username="otto").exists()


def test_a_workspace_token_cannot_see_other_workspaces(world: Any) -> None:
    Membership.objects.create(
        workspace=world.beta, user=world.users["workspace_admin"], role="viewer"
    )
    issued = issue(world, workspace=world.beta)
    client = bearer(issued.plaintext)
    assert client.get(WORKSPACE).status_code == 404
    assert (
        client.get(reverse("api:workspace-detail", kwargs={"workspace_slug": "beta"})).status_code
        == 200
    )
    listed = client.get(reverse("api:workspace-list")).json()
    assert [item["slug"] for item in listed] == ["beta"]


def test_a_removed_members_token_stops_working_at_once(world: Any) -> None:
    issued = issue(world, who="researcher")
    client = bearer(issued.plaintext)
    assert client.get(WORKSPACE).status_code == 200
    Membership.objects.for_workspace(world.alpha).filter(user=world.users["researcher"]).delete()
    assert client.get(WORKSPACE).status_code == 404


def test_a_token_never_does_more_than_its_user(world: Any) -> None:
    issued = issue(world, who="viewer")
    response = bearer(issued.plaintext).post(
        MEMBERS, {"username": "otto", "role": "viewer"}, format="json"
    )
    assert response.status_code == 403


def fresh_address() -> str:
    """An address no other test used: the rate-limit counters live in the suite's real cache."""
    return f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def random_token() -> str:
    return f"tau_{secrets.token_hex(6)}_" + secrets.token_hex(20)


def test_a_valid_token_is_served_after_100_failures_from_its_address(world: Any) -> None:
    """Acceptance: failures from a shared address never lock out the valid tokens there."""
    issued = issue(world)
    shared = fresh_address()
    answers = [refusal(bearer(random_token(), shared))[0] for _ in range(100)]
    assert 429 in answers  # the attacker was slowed down (default limit: 30 per address)
    response = bearer(issued.plaintext, shared).get(WORKSPACE)
    assert response.status_code == 200
    assert response.json()["slug"] == "alpha"


@override_settings(TAU_AUTH_FAILURES_PER_ADDRESS=5, TAU_AUTH_FAILURES_PER_KEY=100)
def test_failures_past_the_address_limit_answer_429(world: Any) -> None:
    issued = issue(world)
    attacker = fresh_address()
    for _ in range(5):
        assert refusal(bearer(random_token(), attacker))[0] == 401
    # Past the limit, further failures from that address wait...
    blocked = bearer(random_token(), attacker).get(WORKSPACE)
    assert blocked.status_code == 429
    assert int(blocked["Retry-After"]) > 0
    assert refusal(bearer("not-a-token", attacker))[0] == 429
    # ...while a valid token from the same address is served, and other addresses are untouched.
    assert bearer(issued.plaintext, attacker).get(WORKSPACE).status_code == 200
    assert refusal(bearer(random_token(), fresh_address()))[0] == 401
    # The moment the address went past its limit is in the audit log, once.
    events = AuditEvent.objects.unscoped().filter(action="token.throttled", object_id=attacker)
    assert events.count() == 1
    assert events.get().object_type == "address"
    assert events.get().remote_addr == attacker


@override_settings(TAU_AUTH_FAILURES_PER_ADDRESS=100, TAU_AUTH_FAILURES_PER_KEY=3)
def test_guessing_one_keys_secret_is_limited_per_key(world: Any) -> None:
    issued = issue(world)
    key = issued.token.key
    for _ in range(3):  # from different addresses: the per-address limit does not apply
        assert refusal(bearer(f"tau_{key}_" + "D" * 40, fresh_address()))[0] == 401
    # Every further guess at this key's secret, from anywhere, answers 429.
    for _ in range(3):
        assert refusal(bearer(f"tau_{key}_" + "E" * 40, fresh_address()))[0] == 429
    # Other keys are unaffected.
    assert refusal(bearer(random_token(), fresh_address()))[0] == 401
    # The right secret is still served: keys are not secret, so refusing it would let anyone
    # who saw a key lock its owner out, and a 238-bit secret is out of reach of guessing.
    assert bearer(issued.plaintext, fresh_address()).get(WORKSPACE).status_code == 200
    event = AuditEvent.objects.unscoped().get(
        action="token.throttled", object_type="portal.apitoken"
    )
    assert event.object_id == str(issued.token.pk)
    assert key in event.object_repr
    assert issued.plaintext.split("_")[2] not in event.object_repr


@override_settings(TAU_AUTH_FAILURES_PER_ADDRESS=2, TAU_AUTH_FAILURES_PER_KEY=2)
def test_an_unknown_key_is_limited_like_a_real_one(world: Any) -> None:
    """The per-key answer must not reveal which keys exist."""
    real = issue(world).token.key
    unknown = secrets.token_hex(6)
    answers = {
        which: [refusal(bearer(f"tau_{key}_" + "F" * 40, fresh_address()))[0] for _ in range(4)]
        for which, key in (("real", real), ("unknown", unknown))
    }
    assert answers["real"] == answers["unknown"] == [401, 401, 429, 429]


def test_last_used_is_written_at_most_once_a_minute(world: Any) -> None:
    issued = issue(world)
    client = bearer(issued.plaintext)
    client.get(WORKSPACE)
    first = ApiToken.objects.get(pk=issued.token.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        client.get(WORKSPACE)
    assert not any(q["sql"].startswith("UPDATE") for q in queries.captured_queries)
    assert ApiToken.objects.get(pk=issued.token.pk).last_used_at == first
    ApiToken.objects.filter(pk=issued.token.pk).update(last_used_at=first - timedelta(minutes=2))
    client.get(WORKSPACE)
    refreshed = ApiToken.objects.get(pk=issued.token.pk).last_used_at
    assert refreshed is not None
    assert refreshed > first - timedelta(minutes=1)


def test_peppers_rotate_without_breaking_tokens(world: Any) -> None:
    with override_settings(TAU_TOKEN_PEPPERS="1:the-first-pepper-0123456789"):
        old = issue(world)
    with override_settings(
        TAU_TOKEN_PEPPERS="2:the-second-pepper-0123456789,1:the-first-pepper-0123456789"
    ):
        new = issue(world)
        assert new.token.pepper_id == 2
        assert bearer(old.plaintext).get(WORKSPACE).status_code == 200
        assert bearer(new.plaintext).get(WORKSPACE).status_code == 200
    with override_settings(TAU_TOKEN_PEPPERS="2:the-second-pepper-0123456789"):
        assert bearer(old.plaintext, "10.7.0.1").get(WORKSPACE).status_code == 401
        assert bearer(new.plaintext).get(WORKSPACE).status_code == 200


def test_expiry_policy(world: Any) -> None:
    with (
        override_settings(TAU_TOKEN_MAX_DAYS=30),
        pytest.raises(tokens.TokenPolicyError, match="between 1 and 30"),
    ):
        issue(world, expires_in_days=31)
    with override_settings(TAU_TOKEN_DEFAULT_DAYS=7):
        issued = issue(world)
    assert (
        timedelta(days=6, hours=23) < issued.token.expires_at - timezone.now() <= timedelta(days=7)
    )


def test_create_token_command(world: Any) -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "create_token",
        "rob",
        "--workspace",
        "alpha",
        "--read-only",
        "--expires-days",
        "5",
        stdout=out,
        stderr=err,
    )
    plaintext = out.getvalue().strip()
    assert tokens.TOKEN_PATTERN.match(plaintext)
    assert "read-only" in err.getvalue()
    token = ApiToken.objects.get(key=tokens.key_of(plaintext))
    assert (token.user.username, token.workspace, token.read_only) == ("rob", world.alpha, True)
    event = AuditEvent.objects.unscoped().get(action="token.create", object_id=str(token.pk))
    assert event.source == "cli"
    assert bearer(plaintext).get(WORKSPACE).status_code == 200
    with pytest.raises(CommandError, match="no access to a workspace 'beta'"):
        call_command(
            "create_token", "rob", "--workspace", "beta", stdout=io.StringIO(), stderr=io.StringIO()
        )
    with pytest.raises(CommandError, match="no active user"):
        call_command("create_token", "nobody", stdout=io.StringIO(), stderr=io.StringIO())


def test_tokens_page_shows_the_secret_once(world: Any) -> None:
    client = world.client_for("researcher")
    created = client.post(
        reverse("tokens"), {"name": "laptop", "workspace": "alpha", "expires_in_days": "30"}
    )
    assert created.status_code == 201
    token = ApiToken.objects.get(user=world.users["researcher"], name="laptop")
    html = created.content.decode()
    start = html.index('id="issued-token"')
    plaintext = html[start:].split('value="', 1)[1].split('"', 1)[0]
    assert tokens.key_of(plaintext) == token.key
    listing = client.get(reverse("tokens")).content.decode()
    assert token.display_prefix in listing
    assert plaintext not in listing
    # Someone else cannot revoke it; its owner can.
    assert (
        world.client_for("viewer").post(reverse("token-revoke", args=[token.pk])).status_code == 404
    )
    assert client.post(reverse("token-revoke", args=[token.pk])).status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_tokens_page_refuses_a_workspace_the_user_cannot_see(world: Any) -> None:
    client = world.client_for("researcher")
    response = client.post(
        reverse("tokens"), {"name": "sneaky", "workspace": "beta", "expires_in_days": "30"}
    )
    assert response.status_code == 400
    assert not ApiToken.objects.filter(name="sneaky").exists()


def test_session_api_calls_still_need_csrf(world: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["workspace_admin"])
    response = client.post(
        MEMBERS, {"username": "otto", "role": "viewer"}, content_type="application/json"
    )
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]


def test_every_api_view_checks_token_scope() -> None:
    """Read-only and run tokens are enforced by TokenScopePermission; a view that replaces
    the default permission classes must keep it."""
    from django.urls import get_resolver

    from identity.tokens import TokenScopePermission

    def views(patterns: list[Any]) -> list[Any]:
        found = []
        for pattern in patterns:
            if hasattr(pattern, "url_patterns"):
                found += views(pattern.url_patterns)
            elif hasattr(pattern.callback, "cls"):
                found.append(pattern.callback.cls)
        return found

    api_views = views(get_resolver().url_patterns)
    assert len(api_views) >= 5
    for view in api_views:
        assert TokenScopePermission in view.permission_classes, view


def test_the_page_showing_a_new_secret_is_never_cached(world: Any) -> None:
    response = world.client_for("researcher").post(
        reverse("tokens"), {"name": "cache check", "expires_in_days": "30"}
    )
    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
