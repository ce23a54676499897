"""Single sign-on setup mistakes are told apart from outages and from one refused login, and
say what does not match (both values) and what to change: in the log, on the login page
(the details for staff only), on staff pages and in /readyz. Also: the trailing slash a
provider's issuer may carry, discovery and keys fetched again when something changed at the
provider, and usernames when the provider sends no ``preferred_username``.

The same cases against a real provider (Dex) in a real browser are in test_browser_dex.py.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
import requests
from django.test import Client, override_settings
from django.urls import reverse

from identity import oidc
from identity.oidc import (
    OIDCBackend,
    OIDCError,
    OIDCSetupError,
    OIDCUnavailable,
    ProviderClient,
    username_source,
    verify_id_token,
)
from tests.identity.issuer import CLIENT_ID, CLIENT_SECRET, Issuer, Key

pytestmark = pytest.mark.django_db

OIDC_BACKEND = "identity.oidc.OIDCBackend"


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    server = Issuer()
    with override_settings(
        TAU_OIDC_ISSUER=server.url,
        TAU_OIDC_ENABLED=True,
        TAU_OIDC_PROVIDER_NAME="Corp SSO",
        OIDC_RP_CLIENT_ID=CLIENT_ID,
        OIDC_RP_CLIENT_SECRET=CLIENT_SECRET,
        AUTHENTICATION_BACKENDS=[OIDC_BACKEND, "django.contrib.auth.backends.ModelBackend"],
    ):
        oidc._clients.clear()
        yield server
        oidc._clients.clear()
    server.close()


@pytest.fixture
def client_for(issuer: Issuer) -> ProviderClient:
    return ProviderClient(issuer.url)


def nonce() -> str:
    return uuid.uuid4().hex


# --- The issuer's trailing slash ------------------------------------------------------------


def test_an_issuer_published_with_a_trailing_slash_logs_users_in(issuer: Issuer) -> None:
    """Dex with ``issuer: http://host/dex/`` and the portal configured without the slash:
    tokens carry the published value exactly, and are accepted."""
    issuer.published_issuer = issuer.url + "/"
    client = ProviderClient(issuer.url)
    n = nonce()
    claims = verify_id_token(issuer.token(iss=issuer.url + "/", nonce=n), nonce=n, client=client)
    assert claims["iss"] == issuer.url + "/"


def test_a_configured_trailing_slash_the_provider_does_not_publish_is_fine(
    issuer: Issuer,
) -> None:
    client = ProviderClient(issuer.url + "/")
    n = nonce()
    assert verify_id_token(issuer.token(nonce=n), nonce=n, client=client)["iss"] == issuer.url


def test_a_token_whose_issuer_differs_from_the_published_one_names_both(issuer: Issuer) -> None:
    issuer.published_issuer = issuer.url + "/"
    client = ProviderClient(issuer.url)
    n = nonce()
    with pytest.raises(OIDCSetupError) as caught:
        verify_id_token(issuer.token(iss=issuer.url, nonce=n), nonce=n, client=client)
    assert f"iss) is '{issuer.url}'" in caught.value.problem
    assert f"says its issuer is '{issuer.url}/'" in caught.value.problem
    assert "KC_HOSTNAME" in caught.value.fix


def test_users_keep_their_account_when_the_published_issuer_gains_a_slash(
    issuer: Issuer,
) -> None:
    backend = OIDCBackend()
    backend.get_userinfo = lambda *args: {}  # type: ignore[method-assign]
    first = backend.get_or_create_user("a", "i", issuer.claims(sub="s-1"))
    again = backend.get_or_create_user("a", "i", issuer.claims(sub="s-1", iss=issuer.url + "/"))
    assert first.pk == again.pk


# --- Setup mistakes, outages and refusals -----------------------------------------------------


def test_another_host_in_the_published_issuer_is_a_setup_mistake(issuer: Issuer) -> None:
    published = issuer.url.replace("127.0.0.1", "localhost")
    issuer.published_issuer = published
    with pytest.raises(OIDCSetupError) as caught:
        ProviderClient(issuer.url).metadata()
    assert f"says its issuer is '{published}'" in caught.value.problem
    assert f"TAU_OIDC_ISSUER is '{issuer.url}'" in caught.value.problem
    assert f"Set TAU_OIDC_ISSUER to '{published}' exactly" in caught.value.fix
    assert "'localhost' and '127.0.0.1' are different issuers" in caught.value.fix


def test_no_discovery_document_is_a_setup_mistake(issuer: Issuer) -> None:
    issuer.discovery_status = 404
    with pytest.raises(OIDCSetupError, match="answered HTTP 404") as caught:
        ProviderClient(issuer.url).metadata()
    assert "/realms/REALM" in caught.value.fix


@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_server_error_is_an_outage(issuer: Issuer, status: int) -> None:
    issuer.discovery_status = status
    with pytest.raises(OIDCUnavailable, match=f"HTTP {status}"):
        ProviderClient(issuer.url).metadata()


def test_a_provider_that_does_not_answer_is_an_outage() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(OIDCUnavailable, match="cannot be fetched"):
        ProviderClient(f"http://127.0.0.1:{port}").metadata()


def test_a_token_for_another_client_is_a_setup_mistake(
    issuer: Issuer, client_for: ProviderClient
) -> None:
    n = nonce()
    with pytest.raises(OIDCSetupError, match="TAU_OIDC_CLIENT_ID is 'taugrid-test'") as caught:
        verify_id_token(issuer.token(aud="portal-prod", nonce=n), nonce=n, client=client_for)
    assert "'portal-prod'" in caught.value.problem


def test_a_forged_token_for_another_client_is_refused_not_a_setup_mistake(
    issuer: Issuer, client_for: ProviderClient
) -> None:
    """Only a token the provider really signed can say the client id is wrong: a forged one
    must not put a misconfiguration banner in front of staff."""
    n = nonce()
    impostor = Key("key-1")  # the provider's key id, someone else's key
    with pytest.raises(OIDCError) as refused:
        verify_id_token(
            issuer.token(key=impostor, aud="portal-prod", nonce=n), nonce=n, client=client_for
        )
    assert not isinstance(refused.value, OIDCSetupError)
    assert "Signature verification failed" in str(refused.value)


def test_an_algorithm_not_allowed_is_a_setup_mistake_but_hmac_is_an_attack(
    issuer: Issuer, client_for: ProviderClient
) -> None:
    issuer.keys = [Key("ec-1", "ES256")]
    n = nonce()
    with override_settings(TAU_OIDC_SIGNING_ALGORITHMS=["RS256"]):
        with pytest.raises(OIDCSetupError, match="signs ID tokens with ES256") as caught:
            verify_id_token(issuer.token(nonce=n), nonce=n, client=client_for)
        assert "Add ES256 to TAU_OIDC_SIGNING_ALGORITHMS" in caught.value.fix
    shared_secret = "a-shared-secret-of-thirty-two-bytes!"
    forged = jwt.encode(issuer.claims(nonce=n), shared_secret, algorithm="HS256")
    with pytest.raises(OIDCError) as refused:
        verify_id_token(forged, nonce=n, client=client_for)
    assert not isinstance(refused.value, OIDCSetupError)


def _token_response(status: int, body: str) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = body.encode()
    response.headers["Content-Type"] = "application/json"
    response.url = "http://idp.example/token"
    return response


def test_token_endpoint_answers_are_classified() -> None:
    backend = OIDCBackend()
    with pytest.raises(OIDCSetupError, match="refused TauGrid's client credentials") as caught:
        backend.raise_token_response_error(
            _token_response(401, '{"error": "invalid_client", "error_description": "bad"}')
        )
    assert "TAU_OIDC_CLIENT_SECRET_BASIC" in caught.value.fix
    with pytest.raises(OIDCUnavailable, match="HTTP 503"):
        backend.raise_token_response_error(_token_response(503, "down"))
    with pytest.raises(OIDCError, match="invalid_grant") as refused:
        backend.raise_token_response_error(_token_response(400, '{"error": "invalid_grant"}'))
    assert not isinstance(refused.value, OIDCSetupError)
    backend.raise_token_response_error(_token_response(200, "{}"))  # fine: nothing raised


# --- What people and operators see ----------------------------------------------------------


def test_a_misconfiguration_is_not_shown_as_an_outage(
    issuer: Issuer, caplog: pytest.LogCaptureFixture, django_user_model: Any, settings: Any
) -> None:
    # The local accounts below are signed in by force_login: their passwords are never
    # checked, and the cheap hasher makes each in microseconds instead of 0.3-0.6 s.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    published = issuer.url.replace("127.0.0.1", "localhost")
    issuer.published_issuer = published
    browser = Client()
    with caplog.at_level(logging.ERROR, logger="identity.oidc"):
        response = browser.get(reverse("oidc-login"))
    assert response.status_code == 302
    assert response["Location"] == "/login/?oidc=misconfigured"
    logged = caplog.text
    assert f"says its issuer is '{published}'" in logged
    assert issuer.url in logged

    page = browser.get(response["Location"]).content.decode()
    assert "not set up correctly" in page
    assert "ask your platform team" in page
    assert "cannot be reached" not in page
    assert published not in page, "the details are for staff, not for everyone"

    # A staff member (signed in with a local account) sees what to change on every page,
    # and /readyz says so.
    staff = django_user_model.objects.create_user("ops", password="pw-ops-1234", is_staff=True)
    browser.force_login(staff, backend="django.contrib.auth.backends.ModelBackend")
    home = browser.get("/").content.decode()
    assert 'id="sso-banner"' in home
    assert "Single sign-on is misconfigured" in home
    assert f"Set TAU_OIDC_ISSUER to &#x27;{published}&#x27; exactly" in home
    ready = Client().get("/readyz").json()
    assert ready["status"] == "ok", "single sign-on never makes the portal unready"
    assert ready["oidc"]["status"] == "misconfigured"
    assert published in ready["oidc"]["detail"]
    assert "TAU_OIDC_ISSUER" in ready["oidc"]["fix"]

    researcher = django_user_model.objects.create_user("res", password="pw-res-1234")
    browser.force_login(researcher, backend="django.contrib.auth.backends.ModelBackend")
    assert 'id="sso-banner"' not in browser.get("/").content.decode()


def test_an_outage_says_try_again_and_readyz_says_unavailable(
    issuer: Issuer, caplog: pytest.LogCaptureFixture
) -> None:
    issuer.discovery_status = 503
    browser = Client()
    with caplog.at_level(logging.WARNING, logger="identity.oidc"):
        response = browser.get(reverse("oidc-login"))
    assert response["Location"] == "/login/?oidc=unavailable"
    assert "the OpenID provider is unavailable" in caplog.text
    page = browser.get(response["Location"]).content.decode()
    assert "Corp SSO cannot be reached right now. Try again in a minute." in page
    assert Client().get("/readyz").json()["oidc"]["status"] == "unavailable"


def test_readyz_checks_the_provider_itself_and_a_fix_clears_the_problem(
    issuer: Issuer,
) -> None:
    ready = Client().get("/readyz").json()
    assert ready["oidc"]["status"] == "ok"
    asked = issuer.discovery_requests
    Client().get("/readyz")
    assert issuer.discovery_requests == asked, "a fresh state is not checked again"

    # Found at a login; the discovery check alone cannot clear it (the document is fine).
    oidc.record_status(oidc.Problem("misconfigured", "wrong client", "fix it"))
    oidc.sso_status(check=True)
    assert oidc.sso_status()["status"] == "misconfigured"  # type: ignore[index]
    # Corrected settings (a restart with another client id): the old problem is gone.
    with override_settings(OIDC_RP_CLIENT_ID="taugrid-fixed"):
        assert oidc.sso_status() is None  # nothing known yet about the new settings


def test_a_provider_error_on_the_callback_is_classified(issuer: Issuer) -> None:
    browser = Client()
    response = browser.get(
        reverse("oidc-callback"), {"error": "invalid_scope", "error_description": "groups"}
    )
    assert response["Location"] == "/login/?oidc=misconfigured"
    assert oidc.sso_status()["detail"].endswith("(invalid_scope: groups)")  # type: ignore[index]
    response = browser.get(reverse("oidc-callback"), {"error": "access_denied"})
    assert response["Location"] == "/login/?oidc=failed"


# --- Changes at the provider ----------------------------------------------------------------


def test_a_rotated_key_is_used_seconds_after_the_last_fetch(
    issuer: Issuer, client_for: ProviderClient
) -> None:
    n = nonce()
    verify_id_token(issuer.token(nonce=n), nonce=n, client=client_for)
    issuer.keys = [Key("key-after-restart")]
    client_for._jwks.fetched_at -= oidc.JWKS_MIN_REFRESH_SECONDS + 0.5  # type: ignore[union-attr]
    n = nonce()
    assert verify_id_token(issuer.token(nonce=n), nonce=n, client=client_for)["sub"]


def test_a_rotation_right_after_a_fetch_waits_instead_of_failing(
    issuer: Issuer, client_for: ProviderClient
) -> None:
    n = nonce()
    verify_id_token(issuer.token(nonce=n), nonce=n, client=client_for)
    issuer.keys = [Key("key-after-restart")]  # the provider restarted a moment later
    started = time.monotonic()
    n = nonce()
    assert verify_id_token(issuer.token(nonce=n), nonce=n, client=client_for)["sub"]
    assert time.monotonic() - started <= oidc.JWKS_MIN_REFRESH_SECONDS + 1


def test_forged_key_ids_do_not_flood_the_provider(
    issuer: Issuer, client_for: ProviderClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oidc, "JWKS_MIN_REFRESH_SECONDS", 0.2)
    n = nonce()
    verify_id_token(issuer.token(nonce=n), nonce=n, client=client_for)
    before = issuer.jwks_requests
    started = time.monotonic()
    for index in range(10):  # one after the other
        token = issuer.token(headers={"kid": f"forged-{index}"}, nonce=nonce())
        with pytest.raises(OIDCError, match="no signing key"):
            verify_id_token(token, nonce=nonce(), client=client_for)
    elapsed = time.monotonic() - started
    assert issuer.jwks_requests - before <= 1 + elapsed / 0.2

    # Many at once: they share one fetch.
    before = issuer.jwks_requests
    forged = [issuer.token(headers={"kid": f"burst-{index}"}, nonce=nonce()) for index in range(8)]
    refused: list[bool] = []

    def attempt(token: str) -> None:
        try:
            verify_id_token(token, nonce=nonce(), client=client_for)
        except OIDCError:
            refused.append(True)

    threads = [threading.Thread(target=attempt, args=(token,)) for token in forged]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(refused) == 8
    assert issuer.jwks_requests - before <= 2


def test_a_token_from_a_changed_issuer_refetches_discovery(
    issuer: Issuer, client_for: ProviderClient
) -> None:
    client_for.metadata()
    issuer.published_issuer = issuer.url + "/"  # the provider's issuer setting changed
    client_for._metadata.fetched_at -= oidc.METADATA_MIN_REFRESH_SECONDS + 1  # type: ignore[union-attr]
    n = nonce()
    claims = verify_id_token(
        issuer.token(iss=issuer.url + "/", nonce=n), nonce=n, client=client_for
    )
    assert claims["iss"] == issuer.url + "/"


def sign_in_with_sso(browser: Client, user: Any) -> None:
    """A session as a single sign-on login leaves it (with the ID token logout needs)."""
    browser.force_login(user, backend=OIDC_BACKEND)
    session = browser.session
    session["oidc_id_token"] = "the-id-token"
    session["oidc_id_token_expiration"] = time.time() + 600
    session.save()


def test_logout_refetches_discovery_when_the_cached_copy_has_no_end_session(
    issuer: Issuer, django_user_model: Any
) -> None:
    issuer.discovery_changes = {"end_session_endpoint": None}
    user = django_user_model.objects.create_user("grace")
    browser = Client()
    sign_in_with_sso(browser, user)
    response = browser.post(reverse("logout"))
    assert response["Location"] == "/login/?logged_out=portal"
    page = browser.get(response["Location"]).content.decode()
    assert "Corp SSO does not let other sites end its session" in page

    # The provider starts offering it: the next logout uses it, without a portal restart.
    issuer.discovery_changes = {}
    oidc.provider()._metadata.fetched_at -= oidc.METADATA_MIN_REFRESH_SECONDS + 1  # type: ignore[union-attr]
    sign_in_with_sso(browser, user)
    response = browser.post(reverse("logout"))
    assert response["Location"].startswith(f"{issuer.url}/session/end?")


# --- Usernames ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"preferred_username": "ada"}, "ada"),
        ({"email": "kilgore@kilgore.trout", "name": "Kilgore Trout"}, "kilgore"),
        ({"name": "Kilgore Trout"}, "kilgore.trout"),
        ({}, "Cg0wLTM4NS0yODA4OS0wEgRtb2Nr"),
        ({"preferred_username": "  ", "email": "lin@example.org"}, "lin"),
        ({"upn": "ada@corp.example", "preferred_username": "ignored"}, "ada@corp.example"),
    ],
    ids=["preferred", "email-local-part", "name", "subject-last", "blank-skipped", "any-claim"],
)
def test_the_username_falls_back_sensibly(claims: dict[str, Any], expected: str) -> None:
    configured = "upn" if "upn" in claims else "preferred_username"
    with override_settings(TAU_OIDC_USERNAME_CLAIM=configured):
        assert username_source(claims, "Cg0wLTM4NS0yODA4OS0wEgRtb2Nr") == expected


def test_usernames_from_e_mail_are_made_unique(issuer: Issuer) -> None:
    backend = OIDCBackend()
    backend.get_userinfo = lambda *args: {}  # type: ignore[method-assign]
    first = backend.get_or_create_user(
        "a", "i", issuer.claims(sub="Cg0wLTM4NS0y", email="kilgore@kilgore.trout")
    )
    second = backend.get_or_create_user(
        "a", "i", issuer.claims(sub="other-subject", email="kilgore@elsewhere.example")
    )
    assert (first.username, second.username) == ("kilgore", "kilgore-2")
