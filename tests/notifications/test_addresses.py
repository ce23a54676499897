"""Where a webhook may point (portal/addresses.py), attacked the way issue 30's attacker
did: a 6to4 address embedding 127.0.0.1, the cloud metadata address and the portal itself
with private addresses allowed, and every other IPv6 form that carries an IPv4 address.
Documentation ranges are called what they are."""

from __future__ import annotations

import ipaddress
import socket
import time
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from notifications import services
from notifications.models import Webhook
from portal import addresses
from tests.notifications.helpers import SECRET

#: Where the portal is served in these tests (TAU_API_URL / TAU_PUBLIC_URL below).
PORTAL_PORT = 8000


@pytest.fixture
def portal_urls(settings: Any) -> Any:
    settings.TAU_API_URL = f"http://127.0.0.1:{PORTAL_PORT}"
    settings.TAU_PUBLIC_URL = "https://taugrid.example.org"
    settings.ALLOWED_HOSTS = ["taugrid.example.org", "127.0.0.1", "localhost", ".example.net"]
    return settings


def teredo(server: str, client: str) -> str:
    """A Teredo address (2001::/32) of ``server`` for ``client`` (stored inverted)."""
    value = (0x20010000 << 96) | (int(ipaddress.IPv4Address(server)) << 64)
    value |= 0xFFFF << 32  # flags and port: anything
    value |= int(ipaddress.IPv4Address(client)) ^ 0xFFFFFFFF
    return str(ipaddress.IPv6Address(value))


def refusal(text: str, port: int = 9999) -> str | None:
    return addresses.refusal(ipaddress.ip_address(text), port)


# -- IPv6 forms that lead to an IPv4 address ------------------------------------------------------

LOOPBACK_IN_DISGUISE = [
    ("2002:7f00:1::", "6to4"),  # the issue's attack
    ("::ffff:127.0.0.1", "IPv4-mapped"),
    ("::ffff:0:7f00:1", "IPv4-translated"),
    ("::127.0.0.1", "IPv4-compatible"),
    ("64:ff9b::127.0.0.1", "NAT64"),
    ("64:ff9b:1:7f00:0:100::", "NAT64"),  # the local-use /48: 127.0 at bits 48-63, 0.1 at 72-87
    (teredo("65.54.227.120", "127.0.0.1"), "Teredo client"),
]


@pytest.mark.parametrize(("address", "form"), LOOPBACK_IN_DISGUISE)
def test_an_ipv6_form_of_loopback_is_refused_as_loopback(
    portal_urls: Any, address: str, form: str
) -> None:
    why = refusal(address)
    assert why is not None, f"{address} passed the check"
    assert f"which leads to 127.0.0.1 ({form})" in why
    assert "loopback address" in why


def test_the_issues_6to4_url_is_refused_when_saved(world: Any, portal_urls: Any, db: Any) -> None:
    with pytest.raises(ValidationError, match=r"leads to 127\.0\.0\.1 \(6to4\).*loopback"):
        services.create_webhook(
            workspace=world.alpha,
            url="http://[2002:7f00:1::]:8080/hook",
            secret=SECRET,
            events=[],
            by=world.users["workspace_admin"],
        )
    assert not Webhook.objects.for_workspace(world.alpha).exists()


def test_an_ipv6_form_of_a_public_address_is_allowed(portal_urls: Any) -> None:
    assert refusal("2002:5db8:d70e::") is None  # 6to4 of 93.184.215.14
    assert refusal("64:ff9b::93.184.215.14") is None  # what a NAT64 cluster resolves to
    assert refusal("2606:4700::1111") is None


# -- never, whatever TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES says ------------------------------------

NEVER = [
    ("169.254.169.254", "link-local address (cloud metadata"),
    ("2002:a9fe:a9fe::", "link-local address"),  # 6to4 of 169.254.169.254
    ("::ffff:169.254.169.254", "link-local address"),
    ("64:ff9b::169.254.169.254", "link-local address"),
    (teredo("65.54.227.120", "169.254.169.254"), "link-local address"),
    ("fe80::1", "link-local address"),
    ("fd00:ec2::254", "cloud metadata address"),
    ("100.100.100.200", "cloud metadata address"),
    ("168.63.129.16", "cloud metadata address"),
    ("0.0.0.0", "unspecified address"),  # noqa: S104 - an address refused, not bound
    ("::", "unspecified address"),
    ("224.0.0.1", "multicast address"),
    ("ff02::1", "multicast address"),
    ("255.255.255.255", "broadcast address"),
    ("240.0.0.1", "reserved address"),
    ("192.0.2.10", "documentation (TEST-NET) address"),
    ("198.51.100.7", "documentation (TEST-NET) address"),
    ("203.0.113.99", "documentation (TEST-NET) address"),
    ("2001:db8::5", "documentation (TEST-NET) address"),
]


@pytest.mark.parametrize("allow_private", [False, True])
@pytest.mark.parametrize(("address", "words"), NEVER)
def test_metadata_link_local_and_documentation_addresses_are_never_allowed(
    portal_urls: Any, allow_private: bool, address: str, words: str
) -> None:
    portal_urls.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = allow_private
    why = refusal(address)
    assert why is not None, f"{address} passed the check"
    assert words in why
    assert "never go there" in why
    assert "private address" not in why


# -- private: refused unless allowed ------------------------------------------------------------

PRIVATE = [
    ("127.0.0.1", "a loopback address"),
    ("::1", "a loopback address"),
    ("10.1.2.3", "a private address"),
    ("172.20.0.1", "a private address"),
    ("192.168.1.10", "a private address"),
    ("fd12:3456::1", "a private (unique local) address"),
    ("100.64.0.1", "a shared (carrier-grade NAT) address"),
    ("198.18.0.1", "a benchmarking address"),
]


@pytest.mark.parametrize(("address", "words"), PRIVATE)
def test_private_addresses_are_refused_unless_allowed(
    portal_urls: Any, address: str, words: str
) -> None:
    why = refusal(address, port=9999)
    assert why is not None
    assert f"{address} is {words}: webhooks go to public addresses only" in why
    portal_urls.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    assert refusal(address, port=9999) is None


# -- the portal itself --------------------------------------------------------------------------


def this_machines_address() -> str | None:
    """An address of one of this machine's interfaces other than loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks a source
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


@pytest.mark.parametrize(
    "url",
    [
        f"http://127.0.0.1:{PORTAL_PORT}/api/v1/",
        f"http://localhost:{PORTAL_PORT}/metrics",
        f"http://[::ffff:127.0.0.1]:{PORTAL_PORT}/",
        f"http://[2002:7f00:1::]:{PORTAL_PORT}/",
        f"http://127.0.0.2:{PORTAL_PORT}/",  # all of 127/8 is this machine
        "https://taugrid.example.org/api/v1/",  # its public name: refused by name, unresolved
        "https://TaugriD.example.org./",
    ],
)
def test_the_portal_itself_is_refused_even_with_private_addresses_allowed(
    portal_urls: Any, url: str
) -> None:
    portal_urls.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    with pytest.raises(addresses.RefusedAddress, match="is this portal itself"):
        addresses.check_url(url)


def test_this_machines_own_address_at_the_portals_port_is_the_portal(portal_urls: Any) -> None:
    own = this_machines_address()
    assert own is not None, "the test machine has no address but loopback"
    portal_urls.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    why = refusal(own, port=PORTAL_PORT)
    assert why is not None
    assert "is this portal itself" in why
    # Another port of this machine is not the portal (a receiver the platform team may run
    # there is judged like any address), and a name under ALLOWED_HOSTS' pattern
    # (.example.net) is another host.
    assert "this portal" not in (refusal(own, port=PORTAL_PORT + 1) or "")
    assert not addresses.is_portal_name("hooks.example.net", 443)


def test_the_portal_check_is_made_again_when_connecting(
    portal_urls: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that resolved elsewhere when saved and to the portal when delivering (DNS
    rebinding) is refused at the connection, with private addresses allowed."""
    portal_urls.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    real = socket.getaddrinfo

    def rebound(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "hooks.example.com" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    with pytest.raises(addresses.RefusedAddress, match="this portal itself"):
        addresses.connect("hooks.example.com", PORTAL_PORT, deadline=time.monotonic() + 10)


def test_a_service_address_of_the_portals_name_is_the_portal(
    portal_urls: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Kubernetes the portal's Service name (in ALLOWED_HOSTS) resolves to a cluster IP:
    that address at the portal's port is the portal, whatever name a webhook uses for it."""
    portal_urls.TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    portal_urls.ALLOWED_HOSTS = ["taugrid.taugrid.svc.cluster.local"]
    real = socket.getaddrinfo
    answers = {
        "taugrid.taugrid.svc.cluster.local": "10.96.12.34",
        "sneaky.example.com": "10.96.12.34",
        "taugrid.example.org": "93.184.215.14",  # the ingress: public, so not the portal's
    }

    def cluster_dns(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real(answers.get(host, host), port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", cluster_dns)
    monkeypatch.setattr(addresses, "_portal_addresses_cache", None)
    with pytest.raises(addresses.RefusedAddress, match=r"10\.96\.12\.34 at port 8000 is this"):
        addresses.check_url(f"http://sneaky.example.com:{PORTAL_PORT}/")
    addresses.check_url("http://sneaky.example.com:9000/")  # another port: another service
