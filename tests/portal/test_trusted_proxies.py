"""The client behind a proxy: X-Forwarded-For and X-Forwarded-Proto count only when they come
from one of TAU_TRUSTED_PROXIES, for rate limits, the audit log and https alike; gunicorn
itself trusts nobody."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse
from rest_framework.test import APIClient

from portal.middleware import client_address, trusted_networks
from portal.models import AuditEvent
from web.management.commands.runportal import Command

ROOT = Path(__file__).resolve().parents[2]
PROXIES = ["10.1.0.0/16", "2001:db8:1::/48"]
PROXY = "10.1.2.3"
HTTPS_BEHIND_PROXY = {
    "TAU_TRUSTED_PROXIES": PROXIES,
    "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https"),
    "SECURE_SSL_REDIRECT": True,
}


def addr() -> str:
    """A client address no other test used (rate-limit counters live in the real cache)."""
    return f"198.18.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        # Not from a proxy: the header is whatever the client wants it to be.
        ("192.0.2.50", "203.0.113.5", "192.0.2.50"),
        # From the proxy: the address it received the request from.
        (PROXY, "203.0.113.5", "203.0.113.5"),
        # The client wrote the left part itself: only the right-most untrusted entry counts.
        (PROXY, "1.2.3.4, 203.0.113.5", "203.0.113.5"),
        # Through two trusted proxies.
        (PROXY, "203.0.113.5, 10.1.9.9", "203.0.113.5"),
        # Every hop trusted: the request came from inside, the left-most is the client.
        (PROXY, "10.1.7.7, 10.1.9.9", "10.1.7.7"),
        # No header at all: the proxy itself.
        (PROXY, "", PROXY),
        # Garbage from a trusted hop stops the walk at the last address vouched for.
        (PROXY, "203.0.113.5, unknown", PROXY),
        # Ports and IPv6 as proxies write them.
        (PROXY, "203.0.113.5:4711", "203.0.113.5"),
        ("2001:db8:1::2", "[2001:db8:99::1]:4711", "2001:db8:99::1"),
        ("::ffff:10.1.2.3", "203.0.113.5", "203.0.113.5"),
    ],
)
def test_client_address(peer: str, forwarded: str, client: str) -> None:
    assert client_address(peer, forwarded, trusted_networks(tuple(PROXIES))) == client


def test_without_trusted_proxies_nothing_is_forwarded() -> None:
    assert client_address("127.0.0.1", "203.0.113.5", trusted_networks(())) == "127.0.0.1"


def failed_login_address(client: Client) -> Any:
    client.post(reverse("login"), {"username": f"u{secrets.token_hex(4)}", "password": "wrong"})
    return AuditEvent.objects.unscoped().filter(action="login.failed").latest("id").remote_addr


@pytest.mark.django_db
@override_settings(TAU_TRUSTED_PROXIES=PROXIES)
def test_the_audit_log_records_the_client_behind_a_trusted_proxy() -> None:
    client = addr()
    behind = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=f"6.6.6.6, {client}")
    assert failed_login_address(behind) == client


@pytest.mark.django_db
@override_settings(TAU_TRUSTED_PROXIES=PROXIES)
def test_x_forwarded_for_from_an_untrusted_peer_is_ignored() -> None:
    peer = addr()
    spoofer = Client(REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR="203.0.113.5")
    assert failed_login_address(spoofer) == peer


@pytest.mark.django_db
def test_no_proxy_is_trusted_by_default() -> None:
    """Not even 127.0.0.1, where local workloads connect from."""
    local = Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.5")
    assert failed_login_address(local) == "127.0.0.1"


def bad_token(address: str, forwarded: str | None = None) -> int:
    token = f"tau_{secrets.token_hex(6)}_{secrets.token_hex(20)}"
    headers: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if forwarded is not None:
        headers["HTTP_X_FORWARDED_FOR"] = forwarded
    response = APIClient(REMOTE_ADDR=address).get(reverse("api:workspace-list"), **headers)
    return int(response.status_code)


@pytest.mark.django_db
@override_settings(
    TAU_TRUSTED_PROXIES=PROXIES, TAU_AUTH_FAILURES_PER_ADDRESS=2, TAU_AUTH_FAILURES_PER_KEY=100
)
def test_token_failures_are_counted_per_real_client() -> None:
    attacker, neighbour = addr(), addr()
    # Behind the proxy, the attacker's failures are its own...
    assert [bad_token(PROXY, attacker) for _ in range(3)] == [401, 401, 429]
    # ...and do not slow down another client of the same proxy.
    assert bad_token(PROXY, neighbour) == 401
    # Without a trusted proxy, a made-up X-Forwarded-For does not escape the count.
    peer = addr()
    assert [bad_token(peer, addr()) for _ in range(3)] == [401, 401, 429]


@pytest.mark.django_db
@override_settings(**HTTPS_BEHIND_PROXY)
def test_x_forwarded_proto_from_an_untrusted_peer_is_ignored() -> None:
    spoofed = Client(REMOTE_ADDR=addr()).get(reverse("login"), HTTP_X_FORWARDED_PROTO="https")
    assert spoofed.status_code == 301
    assert spoofed["Location"].startswith("https://")


@pytest.mark.django_db
@override_settings(**HTTPS_BEHIND_PROXY)
def test_x_forwarded_proto_from_a_trusted_proxy_is_believed() -> None:
    proxied = Client(REMOTE_ADDR=PROXY).get(reverse("login"), HTTP_X_FORWARDED_PROTO="https")
    assert proxied.status_code == 200
    plain = Client(REMOTE_ADDR=PROXY).get(reverse("login"), HTTP_X_FORWARDED_PROTO="http")
    assert plain.status_code == 301


@pytest.mark.django_db
@override_settings(**HTTPS_BEHIND_PROXY, SECURE_REDIRECT_EXEMPT=[r"^api/"])
def test_the_api_over_plain_http_is_answered_not_redirected() -> None:
    """Run pods call the portal's Service over plain HTTP inside the cluster: the API answers
    them (its bearer token was sent with the request already); pages still redirect."""
    inside = Client(REMOTE_ADDR="10.244.3.7")
    assert inside.get("/api/v1/workspaces/").status_code == 401  # not 301: the API answered
    assert inside.get(reverse("login")).status_code == 301


def test_make_run_starts_a_web_server_trusting_no_forwarded_headers() -> None:
    """make run's uvicorn (web.http_server), as gunicorn with --forwarded-allow-ips "": it
    must not rewrite the client from X-Forwarded-For or the scheme from X-Forwarded-Proto
    (uvicorn's default trusts 127.0.0.1, where local runs connect from)."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from web import http_server
    from web.management.commands.runportal import web_command

    assert Command()._commands("127.0.0.1", 8000)["web"] == web_command("127.0.0.1", 8000)
    config = http_server.config("127.0.0.1", 8000)
    config.load()
    assert config.proxy_headers is False
    app: Any = config.loaded_app
    while app is not None:
        assert not isinstance(app, ProxyHeadersMiddleware)
        app = getattr(app, "app", None)


def test_the_readme_production_example_starts_gunicorn_trusting_nobody() -> None:
    readme = (ROOT / "docs" / "install.md").read_text()  # once the README's
    gunicorn_lines = [line for line in readme.splitlines() if line.startswith("gunicorn ")]
    assert gunicorn_lines
    assert all("--forwarded-allow-ips" in line for line in gunicorn_lines)
