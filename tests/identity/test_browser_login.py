"""The whole single sign-on round trip in a real browser against a real OpenID provider:
portal → provider login page → consent → back, see my workspaces, log out everywhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from identity.models import OIDCIdentity
from portal.models import AuditEvent
from tests.browser import screenshot
from tests.identity.openid_provider import OpenIDProvider, start_provider
from workspaces.models import Membership, Role

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def starts_with(prefix: str) -> Callable[[str], bool]:
    return lambda url: url.startswith(prefix)


@pytest.fixture
def openid_provider(live_server: Any, settings: Any) -> Iterator[OpenIDProvider]:
    for provider in start_provider(live_server.url):
        settings.TAU_OIDC_ISSUER = provider.issuer
        settings.TAU_OIDC_ENABLED = True
        settings.TAU_OIDC_PROVIDER_NAME = "Test IdP"
        settings.OIDC_RP_CLIENT_ID = provider.client_id
        settings.OIDC_RP_CLIENT_SECRET = provider.client_secret
        settings.OIDC_RP_SCOPES = "openid email profile groups"
        settings.TAU_OIDC_WORKSPACE_ROLES = ["alpha-researchers=alpha:researcher"]
        settings.AUTHENTICATION_BACKENDS = [
            "identity.oidc.OIDCBackend",
            "django.contrib.auth.backends.ModelBackend",
        ]
        yield provider


def test_single_sign_on_round_trip(
    world: Any, live_server: Any, openid_provider: OpenIDProvider, page: Any
) -> None:
    page.goto(f"{live_server.url}/w/alpha/")
    assert page.url.startswith(f"{live_server.url}/login/")
    screenshot(page, "login-page")
    page.click("#sso-login")

    # The provider's own login page (any password is fine for a known login there).
    page.wait_for_url(starts_with(openid_provider.issuer), wait_until="commit")
    page.fill("input[name=login]", "grace")
    page.fill("input[name=password]", "whatever-the-provider-accepts")
    page.click("button[type=submit]")
    # Its consent page.
    page.get_by_role("button", name="Continue").click()

    # Back in the portal, on the page first asked for, with the workspace from the groups claim.
    page.wait_for_url(f"{live_server.url}/w/alpha/")
    assert page.get_by_role("heading", name="Alpha").is_visible()
    screenshot(page, "after-sso-login")
    page.goto(f"{live_server.url}/")
    assert page.get_by_role("link", name="Alpha").is_visible()
    assert not page.get_by_role("link", name="Beta").is_visible()

    identity = OIDCIdentity.objects.select_related("user").get(
        issuer=openid_provider.issuer, subject="grace"
    )
    user = identity.user
    assert (user.email, user.get_full_name()) == ("grace@example.org", "Grace Hopper")
    membership = Membership.objects.for_workspace(world.alpha).get(user=user)
    assert (membership.role, membership.source) == (Role.RESEARCHER, "oidc")
    assert (
        AuditEvent.objects.unscoped()
        .filter(action="login.success", actor_username=user.username)
        .exists()
    )

    # Log out: the portal session ends, then the provider asks to end its session too.
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(starts_with(openid_provider.issuer), wait_until="commit")
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url(starts_with(f"{live_server.url}/login/"))
    assert (
        AuditEvent.objects.unscoped().filter(action="logout", actor_username=user.username).exists()
    )

    # Logged out for real: the portal asks to log in again, and so does the provider.
    page.goto(f"{live_server.url}/")
    assert page.url.startswith(f"{live_server.url}/login/")
    page.click("#sso-login")
    page.wait_for_url(starts_with(openid_provider.issuer), wait_until="commit")
    assert page.locator("input[name=login]").is_visible()
