"""Request-scoped context: who the client is (behind a trusted proxy), a request id for logs
and responses, and who is acting for audit."""

from __future__ import annotations

import functools
import ipaddress
import re
import uuid
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from portal import audit
from portal.request_id import current_request_id

_REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{8,64}$")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Where the address of the peer that really connected is kept once REMOTE_ADDR names the client.
PEER_ADDR_KEY = "TAU_PEER_ADDR"


@functools.lru_cache(maxsize=8)
def trusted_networks(proxies: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    """TAU_TRUSTED_PROXIES as networks (portal/settings.py has already refused bad entries)."""
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in proxies)


def parse_address(text: str) -> IPAddress | None:
    """An address as proxies write it: ``192.0.2.1``, ``192.0.2.1:4711``, ``2001:db8::1`` or
    ``[2001:db8::1]:4711``; None for anything else (``unknown``, a host name, garbage)."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: IPAddress | None, networks: Iterable[IPNetwork]) -> bool:
    return address is not None and any(address in network for network in networks)


def client_address(peer: str, forwarded_for: str, networks: tuple[IPNetwork, ...]) -> str:
    """The client's address: the peer itself unless it is a trusted proxy; then the right-most
    address in ``X-Forwarded-For`` that is not a trusted proxy.

    Each proxy appends the address it received the request from, so reading from the right,
    every entry up to and including the first untrusted one was written by a proxy we trust;
    anything further left was written by the client and may be invented. If every entry is a
    trusted proxy, the left-most one is the client (a request from inside). An entry that is
    not an address ends the walk at the last address a trusted proxy vouched for.
    """
    current = parse_address(peer)
    if current is None:
        return peer
    for entry in reversed(forwarded_for.split(",") if forwarded_for else []):
        if not _trusted(current, networks):
            break
        previous = parse_address(entry)
        if previous is None:
            break
        current = previous
    return str(current)


class TrustedProxyMiddleware:
    """Honour ``X-Forwarded-For`` and ``X-Forwarded-Proto`` only from a trusted proxy.

    Runs first. When the connecting peer (REMOTE_ADDR) is one of ``TAU_TRUSTED_PROXIES``,
    REMOTE_ADDR becomes the real client address (see :func:`client_address`) and the peer is
    kept under ``TAU_PEER_ADDR``; everything after this (rate limits, the audit log, Django
    itself) reads the client from REMOTE_ADDR. From any other peer both headers are removed,
    so neither Django's ``SECURE_PROXY_SSL_HEADER`` (set by ``TAU_BEHIND_TLS_PROXY``) nor
    anything else can be told a request came over https, or from somewhere else, by a client
    that merely says so. gunicorn is started with ``--forwarded-allow-ips ""`` so that it
    trusts nobody by itself and this is the only place the decision is made.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        peer = str(meta.get("REMOTE_ADDR", ""))
        networks = trusted_networks(tuple(settings.TAU_TRUSTED_PROXIES))
        meta[PEER_ADDR_KEY] = peer
        if _trusted(parse_address(peer), networks):
            meta["REMOTE_ADDR"] = client_address(
                peer, str(meta.get("HTTP_X_FORWARDED_FOR", "")), networks
            )
        else:
            meta.pop("HTTP_X_FORWARDED_FOR", None)
            meta.pop("HTTP_X_FORWARDED_PROTO", None)
        return self.get_response(request)


class RequestIdMiddleware:
    """Give every request an id (a proxy's ``X-Request-ID`` if well-formed) and echo it back."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _REQUEST_ID_PATTERN.match(incoming) else uuid.uuid4().hex
        request.request_id = request_id  # type: ignore[attr-defined]
        token = current_request_id.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        response["X-Request-ID"] = request_id
        return response


class AuditContextMiddleware:
    """Make the acting user, request id and client address available to audit records.

    The user is read when an event is written, not now, so API authentication that runs
    later inside the view (tokens) is what the record shows.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        source = (
            "admin"
            if request.path.startswith("/admin/")
            else ("api" if request.path.startswith("/api/") else "web")
        )
        with audit.request_context(request, source=source):
            return self.get_response(request)


class PortalCSPMiddleware(CSPMiddleware):
    """The Content Security Policy from settings, plus the identity provider as a form
    target: logging out posts to the portal, which redirects to the provider to end its
    session, and browsers apply ``form-action`` to that redirect too."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if settings.TAU_OIDC_ENABLED and not report_only:
            issuer = urlsplit(settings.TAU_OIDC_ISSUER)
            update = dict(parts.update or {})
            update["form-action"] = [
                *update.get("form-action", []),
                f"{issuer.scheme}://{issuer.netloc}",
            ]
            parts.update = update
        return parts
