"""What a verified OpenID login does: who it logs in as, what it keeps in step, how the
session is refreshed and ended. (The full flow against a real provider in a real browser
is in test_browser_login.py.)"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import BACKEND_SESSION_KEY
from django.test import Client, override_settings
from django.urls import reverse

from identity.models import OIDCIdentity
from identity.oidc import OIDCBackend, apply_group_mapping
from portal.models import AuditEvent
from tests.identity.issuer import CLIENT_ID, CLIENT_SECRET, Issuer
from workspaces.models import Membership, Role

pytestmark = pytest.mark.django_db

OIDC_BACKEND = "identity.oidc.OIDCBackend"


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    server = Issuer()
    with override_settings(
        TAU_OIDC_ISSUER=server.url,
        TAU_OIDC_ENABLED=True,
        OIDC_RP_CLIENT_ID=CLIENT_ID,
        OIDC_RP_CLIENT_SECRET=CLIENT_SECRET,
        AUTHENTICATION_BACKENDS=[OIDC_BACKEND, "django.contrib.auth.backends.ModelBackend"],
    ):
        yield server
    server.close()


def login_as(backend: OIDCBackend, issuer: Issuer, **claims: Any) -> Any:
    payload = issuer.claims(**claims)
    backend.get_userinfo = lambda *args: {}  # type: ignore[method-assign]
    return backend.get_or_create_user("access-token", "id-token", payload)


def test_users_are_identified_by_issuer_and_subject_not_email(
    issuer: Issuer, django_user_model: Any
) -> None:
    local = django_user_model.objects.create_user(username="mallory", email="ceo@example.org")
    user = login_as(
        OIDCBackend(), issuer, sub="s-42", email="ceo@example.org", preferred_username="mallory"
    )
    assert user.pk != local.pk, "an e-mail match must never log into someone else's account"
    assert user.username == "mallory-2"  # the name was taken by a local account
    assert OIDCIdentity.objects.get(issuer=issuer.url, subject="s-42").user == user
    again = login_as(
        OIDCBackend(), issuer, sub="s-42", email="new@example.org", name="Ada Lovelace"
    )
    assert again.pk == user.pk
    again.refresh_from_db()
    assert (again.email, again.first_name, again.last_name) == (
        "new@example.org",
        "Ada",
        "Lovelace",
    )


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        ("ada", "ada"),
        ("ada.lovelace@example.org", "ada.lovelace@example.org"),
        ("Jos\u00e9", "Jose"),  # accents dropped
        ("\uff41\uff44\uff41", "ada"),  # fullwidth letters folded
    ],
)
def test_a_username_claim_becomes_an_ascii_username(
    issuer: Issuer, claim: str, expected: str
) -> None:
    user = login_as(OIDCBackend(), issuer, sub=f"s-{claim}", preferred_username=claim)
    assert user.username == expected


@pytest.mark.parametrize(
    "claim",
    [
        "r\u0435searcher",  # a Cyrillic e: reads exactly like "researcher"
        "\u0440\u043e\u0431",  # Cyrillic letters only, looking like "po6"
        "ada lovelace",
        "auth0|1234",
    ],
)
def test_a_username_claim_outside_the_rule_gets_a_neutral_name(
    issuer: Issuer, django_user_model: Any, claim: str
) -> None:
    django_user_model.objects.create_user(username="researcher")
    user = login_as(OIDCBackend(), issuer, sub="s-odd", preferred_username=claim)
    assert re.fullmatch(r"user-[0-9a-f]{12}", user.username), user.username


def test_a_username_differing_only_in_case_is_not_created(
    issuer: Issuer, django_user_model: Any
) -> None:
    django_user_model.objects.create_user(username="researcher")
    user = login_as(OIDCBackend(), issuer, sub="s-case", preferred_username="Researcher")
    assert user.username == "Researcher-2"


def test_the_same_subject_at_another_issuer_is_another_person(issuer: Issuer) -> None:
    first = login_as(OIDCBackend(), issuer, sub="s-1")
    other = OIDCBackend()
    other.get_userinfo = lambda *args: {}  # type: ignore[method-assign]
    second = other.get_or_create_user(
        "a", "i", {**issuer.claims(sub="s-1"), "iss": "https://other-idp.example"}
    )
    assert first.pk != second.pk


def test_userinfo_about_someone_else_is_refused(issuer: Issuer) -> None:
    backend = OIDCBackend()
    backend.get_userinfo = lambda *args: {"sub": "someone-else", "email": "x@example.org"}  # type: ignore[method-assign]
    with pytest.raises(Exception, match="different subject"):
        backend.get_or_create_user("a", "i", issuer.claims(sub="s-1"))


@override_settings(
    TAU_OIDC_STAFF_GROUPS=["platform-team"],
    TAU_OIDC_WORKSPACE_ROLES=[
        "alpha-leads=alpha:admin",
        "alpha=alpha:researcher",
        "beta=beta:viewer",
    ],
)
def test_group_mapping_follows_the_groups_at_each_login(world: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="gina")
    before = AuditEvent.objects.unscoped().count()
    apply_group_mapping(user, ["alpha", "alpha-leads", "platform-team"])
    user.refresh_from_db()
    assert user.is_staff
    alpha = Membership.objects.for_workspace(world.alpha).get(user=user)
    assert (alpha.role, alpha.source) == (Role.ADMIN, "oidc")
    assert not Membership.objects.for_workspace(world.beta).filter(user=user).exists()
    # Next login: left the leads and the platform team, joined beta.
    apply_group_mapping(user, ["alpha", "beta"])
    user.refresh_from_db()
    assert not user.is_staff
    assert Membership.objects.for_workspace(world.alpha).get(user=user).role == Role.RESEARCHER
    assert Membership.objects.for_workspace(world.beta).get(user=user).role == Role.VIEWER
    # And then no groups at all: the memberships from groups go.
    apply_group_mapping(user, [])
    assert Membership.objects.for_workspace(world.alpha).filter(user=user).count() == 0
    events = list(AuditEvent.objects.unscoped().filter(pk__gt=0).order_by("id"))[before:]
    assert {e.source for e in events} == {"oidc"}
    actions = [(e.action, e.object_type) for e in events]
    assert actions.count(("user.role_change", "auth.user")) == 2
    assert ("create", "workspaces.membership") in actions
    assert ("update", "workspaces.membership") in actions
    assert ("delete", "workspaces.membership") in actions


@override_settings(TAU_OIDC_WORKSPACE_ROLES=["alpha=alpha:viewer"])
def test_memberships_added_by_an_admin_are_left_alone(world: Any) -> None:
    rob = world.users["researcher"]
    apply_group_mapping(rob, [])
    apply_group_mapping(rob, ["alpha"])
    membership = Membership.objects.for_workspace(world.alpha).get(user=rob)
    assert (membership.role, membership.source) == (Role.RESEARCHER, "manual")


@override_settings(TAU_OIDC_WORKSPACE_ROLES=["broken-entry"])
def test_a_broken_mapping_says_what_is_wrong(django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(username="gus")
    with pytest.raises(ValueError, match="must look like group=workspace:role"):
        apply_group_mapping(user, ["x"])


def oidc_session_client(user: Any, *, expires_in: float, id_token: str = "the-id-token") -> Client:
    client = Client()
    client.force_login(user, backend=OIDC_BACKEND)
    session = client.session
    session[BACKEND_SESSION_KEY] = OIDC_BACKEND
    session["oidc_id_token_expiration"] = time.time() + expires_in
    session["oidc_id_token"] = id_token
    session.save()
    return client


def test_login_page_offers_single_sign_on(issuer: Issuer) -> None:
    html = Client().get(reverse("login")).content.decode()
    assert 'id="sso-login"' in html
    start = Client().get(reverse("oidc-login") + "?next=/w/alpha/")
    assert start.status_code == 302
    target = urlsplit(start["Location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == f"{issuer.url}/auth"
    query = parse_qs(target.query)
    assert query["client_id"] == [CLIENT_ID]
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["nonce"][0]) >= 32
    assert query["redirect_uri"] == ["http://testserver/oidc/callback/"]


def test_session_refresh_answers_htmx_with_hx_redirect(issuer: Issuer, world: Any) -> None:
    client = oidc_session_client(world.users["researcher"], expires_in=-1)
    url = reverse("workspace-home", kwargs={"workspace_slug": "alpha"})
    htmx = client.get(url, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 200
    assert htmx["HX-Redirect"].startswith(f"{issuer.url}/auth?")
    assert "prompt=none" in htmx["HX-Redirect"]
    plain = client.get(url)
    assert plain.status_code == 302
    assert plain["Location"].startswith(f"{issuer.url}/auth?")
    fresh = oidc_session_client(world.users["researcher"], expires_in=600)
    assert fresh.get(url).status_code == 200


def test_callback_with_an_unknown_state_is_refused_and_audited(issuer: Issuer) -> None:
    client = Client()
    client.get(reverse("oidc-login"))
    response = client.get(reverse("oidc-callback") + "?code=abc&state=forged")
    assert response.status_code == 302
    assert response["Location"] == "/login/?oidc=failed"
    event = AuditEvent.objects.unscoped().filter(action="login.failed").latest("id")
    assert "state not found" in event.object_repr


def test_logout_ends_the_provider_session_too(issuer: Issuer, world: Any) -> None:
    client = oidc_session_client(
        world.users["researcher"], expires_in=600, id_token="id.token.value"
    )
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    target = urlsplit(response["Location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == f"{issuer.url}/session/end"
    query = parse_qs(target.query)
    assert query["id_token_hint"] == ["id.token.value"]
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"]
    assert client.get(reverse("home")).status_code == 302  # logged out locally as well
    assert AuditEvent.objects.unscoped().filter(action="logout", actor_username="rob").exists()


@override_settings(TAU_LOCAL_LOGIN=False)
def test_password_login_can_be_switched_off(issuer: Issuer, django_user_model: Any) -> None:
    django_user_model.objects.create_user(username="lee", password="a long test passphrase")
    with override_settings(AUTHENTICATION_BACKENDS=[OIDC_BACKEND]):
        page = Client().get(reverse("login")).content.decode()
        assert 'name="password"' not in page
        assert 'id="sso-login"' in page
        response = Client().post(
            reverse("login"), {"username": "lee", "password": "a long test passphrase"}
        )
        assert response.status_code == 403
