"""Single sign-on against Dex, a second real provider (tests/identity/dex.py), in a real
browser: a static user with groups, a user without ``preferred_username`` (Dex's mock
connector, an opaque subject), logout where the provider offers no ``end_session_endpoint``,
an issuer published with a trailing slash, a key rotation (Dex restarted with new keys), and
an issuer written with another host name. Each checks what the user sees and what the log and
the audit log say."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache

from identity import oidc
from identity.models import OIDCIdentity
from portal.models import AuditEvent
from tests.browser import screenshot
from tests.identity.dex import PASSWORD, Dex, start_dex
from workspaces.models import Membership, Role

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def starts_with(prefix: str) -> Callable[[str], bool]:
    return lambda url: url.startswith(prefix)


def configure_portal(settings: Any, dex: Dex, *, issuer: str | None = None) -> None:
    settings.TAU_OIDC_ISSUER = (issuer or dex.issuer).rstrip("/")  # as settings.py reads it
    settings.TAU_OIDC_ENABLED = True
    settings.TAU_OIDC_PROVIDER_NAME = "Dex"
    settings.OIDC_RP_CLIENT_ID = dex.client_id
    settings.OIDC_RP_CLIENT_SECRET = dex.client_secret
    settings.OIDC_RP_SCOPES = "openid email profile groups"
    settings.TAU_OIDC_WORKSPACE_ROLES = [
        "alpha-researchers=alpha:researcher",
        "alpha-admins=alpha:admin",
        "authors=beta:viewer",
    ]
    settings.AUTHENTICATION_BACKENDS = [
        "identity.oidc.OIDCBackend",
        "django.contrib.auth.backends.ModelBackend",
    ]
    oidc._clients.clear()  # each test's Dex is a new provider
    cache.clear()


@pytest.fixture
def dex_dir(tmp_path: Path) -> Path:
    return tmp_path


def dex_fixture(issuer_path: str) -> Any:
    @pytest.fixture
    def fixture(live_server: Any, settings: Any, dex_dir: Path) -> Iterator[Dex]:
        for dex in start_dex(live_server.url, dex_dir, issuer_path=issuer_path):
            configure_portal(settings, dex)
            yield dex
        oidc._clients.clear()

    return fixture


dex = dex_fixture("/dex")
dex_with_slash = dex_fixture("/dex/")


def log_in_at_dex(page: Any, dex: Dex, email: str) -> None:
    page.wait_for_url(starts_with(dex.issuer.rstrip("/")), wait_until="commit")
    page.get_by_text("Log in with Email").click()
    page.fill("#login", email)
    page.fill("#password", PASSWORD)
    page.click("#submit-login")


def test_a_static_user_logs_in_with_groups_and_out(
    world: Any, live_server: Any, dex: Dex, page: Any, caplog: pytest.LogCaptureFixture
) -> None:
    page.goto(f"{live_server.url}/w/alpha/")
    page.click("#sso-login")
    log_in_at_dex(page, dex, "ada@example.org")

    page.wait_for_url(f"{live_server.url}/w/alpha/")
    assert page.get_by_role("heading", name="Alpha").is_visible()
    assert page.locator(".usermenu strong").inner_text() == "Ada Lovelace"
    screenshot(page, "dex-after-login")
    identity = OIDCIdentity.objects.select_related("user").get(issuer=dex.issuer)
    user = identity.user
    assert user.username == "ada"  # Dex's preferredUsername
    assert (user.email, user.get_full_name()) == ("ada@example.org", "Ada Lovelace")
    membership = Membership.objects.for_workspace(world.alpha).get(user=user)
    assert (membership.role, membership.source) == (Role.RESEARCHER, "oidc")
    assert AuditEvent.objects.unscoped().filter(action="login.success", actor_id=user.pk).exists()

    # Dex offers no end_session_endpoint: the portal session ends, and the page says Dex's
    # own session may still be open (the discovery document was asked again, in case).
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{live_server.url}/login/?logged_out=portal")
    notice = page.locator("#logged-out-locally").inner_text()
    assert "Dex does not let other sites end its session" in notice
    assert AuditEvent.objects.unscoped().filter(action="logout", actor_id=user.pk).exists()
    page.goto(f"{live_server.url}/w/alpha/")
    assert page.url.startswith(f"{live_server.url}/login/")
    assert "misconfigured" not in caplog.text
    assert "refused" not in caplog.text

    # A static user without preferredUsername gets the e-mail's local part, not the subject.
    page.click("#sso-login")
    log_in_at_dex(page, dex, "linus@example.org")
    page.wait_for_url(f"{live_server.url}/w/alpha/")
    linus = OIDCIdentity.objects.select_related("user").get(
        issuer=dex.issuer, user__email="linus@example.org"
    )
    assert linus.user.username == "linus"
    admin = Membership.objects.for_workspace(world.alpha).get(user=linus.user)
    assert admin.role == Role.ADMIN


def test_a_user_without_preferred_username_gets_a_readable_name(
    world: Any, live_server: Any, dex: Dex, page: Any
) -> None:
    page.goto(f"{live_server.url}/")
    page.click("#sso-login")
    page.wait_for_url(starts_with(dex.issuer), wait_until="commit")
    page.get_by_text("Log in with Example").click()  # the mock connector: no password
    page.wait_for_url(f"{live_server.url}/")

    identity = OIDCIdentity.objects.select_related("user").get(issuer=dex.issuer)
    assert identity.subject.startswith("Cg0wLTM4NS0y")  # opaque: user id + connector id
    user = identity.user
    assert user.username == "kilgore", "not the opaque subject"
    assert page.locator(".usermenu strong").inner_text() == "Kilgore Trout"
    assert page.get_by_role("link", name="Beta").is_visible()  # group "authors" → beta viewer
    event = AuditEvent.objects.unscoped().get(action="login.success", actor_id=user.pk)
    assert event.object_repr == "kilgore (oidc)"


def test_an_issuer_published_with_a_trailing_slash_logs_users_in(
    world: Any, live_server: Any, dex_with_slash: Dex, page: Any
) -> None:
    dex = dex_with_slash
    assert dex.issuer.endswith("/dex/")
    from django.conf import settings

    assert not settings.TAU_OIDC_ISSUER.endswith("/")  # the portal is written without it
    page.goto(f"{live_server.url}/w/alpha/")
    page.click("#sso-login")
    log_in_at_dex(page, dex, "ada@example.org")
    page.wait_for_url(f"{live_server.url}/w/alpha/")
    assert page.get_by_role("heading", name="Alpha").is_visible()
    # Users are keyed by the issuer as the portal writes it: a slash added later keeps them.
    identity = OIDCIdentity.objects.select_related("user").get()
    assert identity.issuer == dex.issuer.rstrip("/")
    assert AuditEvent.objects.unscoped().filter(action="login.success", actor_id=identity.user.pk)


def test_a_key_rotation_fails_no_login(
    world: Any, live_server: Any, dex: Dex, page: Any, caplog: pytest.LogCaptureFixture
) -> None:
    page.goto(f"{live_server.url}/")
    page.click("#sso-login")
    log_in_at_dex(page, dex, "ada@example.org")
    page.wait_for_url(f"{live_server.url}/")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(starts_with(f"{live_server.url}/login/"))

    keys_before = dex.keys()
    dex.restart()  # in-memory storage: new signing keys
    assert dex.keys() != keys_before

    # Seconds after the portal last fetched the keys (the first login), not minutes.
    with caplog.at_level(logging.INFO, logger="identity.oidc"):
        page.click("#sso-login")
        log_in_at_dex(page, dex, "ada@example.org")
        page.wait_for_url(f"{live_server.url}/")
    assert page.locator(".usermenu strong").inner_text() == "Ada Lovelace"
    assert f"fetched the provider's key set again for key id '{dex.keys()[0]}'" in caplog.text
    logins = AuditEvent.objects.unscoped().filter(action="login.success").count()
    assert logins == 2
    assert not AuditEvent.objects.unscoped().filter(action="login.failed").exists()


@pytest.fixture
def dex_on_localhost(live_server: Any, settings: Any, dex_dir: Path) -> Iterator[Dex]:
    """Dex whose issuer names ``localhost`` while the portal is configured with its address."""
    for dex in start_dex(live_server.url, dex_dir, issuer_path="/dex"):
        written = dex.issuer
        dex.issuer = written.replace("127.0.0.3", "localhost")
        dex.restart()
        configure_portal(settings, dex, issuer=written)
        yield dex
        oidc._clients.clear()


def test_an_issuer_with_another_host_name_says_what_to_fix(
    world: Any,
    live_server: Any,
    dex_on_localhost: Dex,
    page: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dex = dex_on_localhost
    from django.conf import settings

    written = settings.TAU_OIDC_ISSUER
    with caplog.at_level(logging.ERROR, logger="identity.oidc"):
        page.goto(f"{live_server.url}/login/")
        page.click("#sso-login")
        page.wait_for_url(f"{live_server.url}/login/?oidc=misconfigured")
    problem = page.locator("#sso-problem").inner_text()
    assert "Single sign-on with Dex is not set up correctly" in problem
    assert "ask your platform team" in problem
    assert "cannot be reached" not in problem
    assert dex.issuer not in page.content(), "the details are for staff only"
    screenshot(page, "dex-misconfigured")
    # The log names both values.
    assert f"says its issuer is '{dex.issuer}', but TAU_OIDC_ISSUER is '{written}'" in caplog.text

    # Staff, logged in with a local account, see what to change on every page.
    staff = world.users["platform_admin"]
    staff.set_password("a-long-staff-password")
    staff.save()
    page.fill("#id_username", staff.username)
    page.fill("#id_password", "a-long-staff-password")
    page.get_by_role("button", name="Log in", exact=True).click()
    page.wait_for_url(f"{live_server.url}/")
    banner = page.locator("#sso-banner").inner_text()
    assert f"Set TAU_OIDC_ISSUER to '{dex.issuer}' exactly" in banner
    assert "'localhost' and '127.0.0.1' are different issuers" in banner
    ready = page.request.get(f"{live_server.url}/readyz").json()
    assert ready["oidc"]["status"] == "misconfigured"
    assert dex.issuer in ready["oidc"]["detail"]
