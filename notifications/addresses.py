"""Where a webhook may point: http(s) only, and never at the portal's own networks.

A webhook URL is chosen by a workspace admin, and the portal POSTs to it from inside the
installation's network: without a check, a webhook at ``http://169.254.169.254/`` or
``http://redis.internal:6379/`` would make the portal a relay into places only it can
reach (server-side request forgery). So loopback, private, link-local, multicast, reserved
and unspecified addresses are refused, unless ``TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES`` says
that this installation posts to its own network on purpose.

The check is made twice: when the URL is saved (every address the name resolves to), and
when a delivery connects, against the very address connected to (:func:`connect`). Checking
only at save would let a name that resolved to a public address then be pointed at an
internal one (DNS rebinding); resolving once more and connecting to a name would reopen the
race. The connection is opened to the checked address and the request still names the host
(``Host`` header, TLS server name and certificate check), so virtual hosts and HTTPS work.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedAddress(ValueError):
    """A webhook URL, or the address it resolves to, that the portal will not post to. The
    message says why and what to do."""


def _allow_private() -> bool:
    return bool(getattr(settings, "TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES", False))


def split_url(url: str) -> SplitResult:
    """The URL's parts, if it is one a webhook may have: http(s), a host, no credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise RefusedAddress(f"This is not a valid URL ({exc}).") from None
    if parts.scheme not in {"http", "https"}:
        raise RefusedAddress("A webhook URL must start with https:// (or http://).")
    if not parts.hostname:
        raise RefusedAddress("A webhook URL must name a host, e.g. https://hooks.example.org/.")
    if parts.username or parts.password:
        raise RefusedAddress(
            "A webhook URL may not hold a user name or password; receivers check the "
            "X-TauGrid-Signature header instead."
        )
    if port == 0:
        raise RefusedAddress("Port 0 is no port to post to.")
    return parts


def refusal(address: Address) -> str | None:
    """Why the portal will not post to ``address``, or None if it may."""
    if _allow_private():
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for flag, words in (
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_unspecified", "an unspecified address"),
        ("is_reserved", "a reserved address"),
        ("is_private", "a private address"),
    ):
        if getattr(address, flag):
            return (
                f"{address} is {words}: webhooks go to public addresses only (the platform "
                "team can allow private ones with TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES)."
            )
    if not address.is_global:
        return f"{address} is not a public address: webhooks go to public addresses only."
    return None


def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (an address literal: itself)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise RefusedAddress(f"The host {host} could not be resolved ({exc}).") from None
    addresses: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise RefusedAddress(f"The host {host} has no address.")
    return addresses


def default_port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


def check_url(url: str) -> None:
    """Refuse (``RefusedAddress``) a URL that is not http(s), or whose host resolves to any
    address the portal will not post to. For saving: the delivery checks again."""
    parts = split_url(url)
    assert parts.hostname is not None
    for address in resolve(parts.hostname, default_port(parts)):
        why = refusal(address)
        if why is not None:
            raise RefusedAddress(why)


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``host``, made to an address that was checked just before: the
    first of its addresses that is allowed and answers. Refuses (``RefusedAddress``) when
    none is allowed."""
    reasons: list[str] = []
    last_error: OSError | None = None
    for address in resolve(host, port):
        why = refusal(address)
        if why is not None:
            reasons.append(why)
            continue
        try:
            return socket.create_connection((str(address), port), timeout=timeout)
        except OSError as exc:
            last_error = exc
    if last_error is not None:
        raise last_error
    raise RefusedAddress(reasons[0] if reasons else f"{host} has no address to post to.")
