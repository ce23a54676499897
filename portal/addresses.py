"""Where the portal may connect to a URL someone gave it — a webhook (notifications), a file
to ingest (catalog.url_ingest): http(s) only, never at places only the portal can reach, and
never at the portal itself.

A webhook URL is chosen by a workspace admin, and the portal POSTs to it from inside the
installation's network: without a check, a webhook at ``http://169.254.169.254/`` or
``http://redis.internal:6379/`` would make the portal a relay into places only it can
reach (server-side request forgery). Two kinds of address are told apart:

* **Never**, whatever the settings say: link-local addresses (``169.254.0.0/16``,
  ``fe80::/10``: where cloud metadata services answer) and the other metadata addresses
  (``100.100.100.200``, ``168.63.129.16``, ``fd00:ec2::254``), unspecified addresses
  (``0.0.0.0`` reaches this very machine), multicast, broadcast and reserved ranges, and the
  documentation ranges (TEST-NET ``192.0.2.0/24``, ``198.51.100.0/24``, ``203.0.113.0/24``,
  ``2001:db8::/32``, ``3fff::/20``), which reach no real receiver.
* **Private**: loopback, RFC 1918 and unique-local addresses, shared (carrier-grade NAT) and
  benchmarking ranges, and anything else that is not public. Refused unless
  ``TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES`` says that this installation posts to its own
  network on purpose.

IPv6 forms that carry an IPv4 address are judged by the IPv4 address they lead to:
IPv4-mapped (``::ffff:0:0/96``), IPv4-translated (``::ffff:0:0:0/96``), IPv4-compatible
(``::/96``), NAT64 (``64:ff9b::/96`` and the local-use ``64:ff9b:1::/48``), 6to4
(``2002::/16``) and Teredo (``2001::/32``, its server and its client). So
``2002:7f00:1::`` is 127.0.0.1, and refused as loopback.

**The portal itself** is refused always, even with private addresses allowed (a POST from the
portal to itself comes from loopback or from inside the installation, which some routes
trust more than the outside). The portal is, at the ports it is served on (those of
``TAU_PUBLIC_URL`` and ``TAU_API_URL``): any address of this machine (loopback, or one it can
bind to: its own interfaces), the names it is served under (the hosts of those two URLs and
each exact name in ``ALLOWED_HOSTS``), and the non-public addresses those names resolve to
(a Service's cluster IP). A public address a name of the portal resolves to (an ingress) is
not refused by address: an ingress is shared with other services and is reached like from
anywhere else; the name itself is refused.

The check is made twice: when the URL is saved (every address the name resolves to), and
when a delivery connects, against the very address connected to (:func:`connect`). Checking
only at save would let a name that resolved to a public address then be pointed at an
internal one (DNS rebinding); resolving once more and connecting to a name would reopen the
race. The connection is opened to the checked address and the request still names the host
(``Host`` header, TLS server name and certificate check), so virtual hosts and HTTPS work.

Not checked here: services the platform team configured (the S3 store, ``TAU_STORAGE_…``, and
the S3 service ``s3://`` sources are read from, ``TAU_DATA_SOURCE_…``). An ``s3://bucket/key``
a user gives names a bucket and a key, never a host (``catalog.s3_ingest`` checks the bucket's
name by S3's rules and connects only to the configured endpoint), so there is no address of
the user's choosing to judge; which buckets a workspace may read is that module's rule.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: How long the non-public addresses of the portal's own names are remembered.
PORTAL_ADDRESSES_SECONDS = 60.0


class RefusedAddress(ValueError):
    """A webhook URL, or the address it resolves to, that the portal will not post to. The
    message says why and what to do."""


@dataclass(frozen=True)
class _Range:
    network: Network
    words: str
    #: Refused even where private addresses are allowed.
    always: bool


def _ranges(*rows: tuple[str, str, bool]) -> tuple[_Range, ...]:
    return tuple(_Range(ipaddress.ip_network(cidr), words, always) for cidr, words, always in rows)


_METADATA = "a cloud metadata address"
_LINK_LOCAL = "a link-local address (cloud metadata services answer there)"
_DOCUMENTATION = "a documentation (TEST-NET) address, reserved for examples"

#: The first range an address is in says what it is; specific ranges come first.
_RANGES = _ranges(
    ("169.254.0.0/16", _LINK_LOCAL, True),
    ("100.100.100.200/32", _METADATA, True),
    ("168.63.129.16/32", _METADATA, True),
    ("0.0.0.0/8", "an unspecified address (it reaches this machine)", True),
    ("127.0.0.0/8", "a loopback address", False),
    ("10.0.0.0/8", "a private address", False),
    ("172.16.0.0/12", "a private address", False),
    ("192.168.0.0/16", "a private address", False),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address", False),
    ("198.18.0.0/15", "a benchmarking address", False),
    ("192.0.2.0/24", _DOCUMENTATION, True),
    ("198.51.100.0/24", _DOCUMENTATION, True),
    ("203.0.113.0/24", _DOCUMENTATION, True),
    ("192.0.0.0/24", "an IETF protocol address", True),
    ("192.88.99.0/24", "a 6to4 relay address", True),
    ("224.0.0.0/4", "a multicast address", True),
    ("255.255.255.255/32", "the broadcast address", True),
    ("240.0.0.0/4", "a reserved address", True),
    ("::/128", "an unspecified address (it reaches this machine)", True),
    ("::1/128", "a loopback address", False),
    ("fe80::/10", _LINK_LOCAL, True),
    ("fd00:ec2::254/128", _METADATA, True),
    ("fc00::/7", "a private (unique local) address", False),
    ("fec0::/10", "a private (site-local) address", False),
    ("ff00::/8", "a multicast address", True),
    ("2001:db8::/32", _DOCUMENTATION, True),
    ("3fff::/20", _DOCUMENTATION, True),
    ("100::/64", "a discard-only address", True),
)

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


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


def default_port(parts: SplitResult) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


# -- what an address leads to -------------------------------------------------------------------


def embedded_ipv4(address: Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address leads to, and the form that carries it; None for
    an IPv4 address or an IPv6 address that carries none. (A Teredo address carries two, its
    server and its client: :func:`leads_to` judges both.)"""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    value = int(address)
    if address in _MAPPED:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF), "IPv4-mapped"
    if address in _TRANSLATED:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF), "IPv4-translated"
    if address in _NAT64:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF), "NAT64"
    if address in _NAT64_LOCAL:
        # RFC 6052 with a /48 prefix: the IPv4 address's first two bytes are bits 48-63, the
        # last two bits 72-87 (bits 64-71 are the "u" octet).
        high = (value >> 64) & 0xFFFF
        low = (value >> 40) & 0xFFFF
        return ipaddress.IPv4Address((high << 16) | low), "NAT64"
    if address.sixtofour is not None:
        return address.sixtofour, "6to4"
    if address in _COMPATIBLE and value > 1:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF), "IPv4-compatible"
    return None


def leads_to(address: Address) -> list[tuple[Address, str]]:
    """The addresses a connection to ``address`` ends up at, with how (``""``: itself)."""
    if isinstance(address, ipaddress.IPv6Address) and address.teredo is not None:
        server, client = address.teredo
        return [(server, "Teredo server"), (client, "Teredo client")]
    embedded = embedded_ipv4(address)
    if embedded is not None:
        return [embedded]
    return [(address, "")]


def _range_of(address: Address) -> _Range | None:
    for candidate in _RANGES:
        if address.version == candidate.network.version and address in candidate.network:
            return candidate
    return None


def _described(address: Address, how: str, original: Address) -> str:
    """How a refusal names the address: itself, or the address in it that it leads to."""
    return str(address) if not how else f"{original}, which leads to {address} ({how}),"


def refusal(address: Address, port: int) -> str | None:
    """Why the portal will not post to ``address`` at ``port``, or None if it may."""
    for target, how in leads_to(address):
        shown = _described(target, how, address)
        if is_portal_address(target, port):
            return f"{shown} at port {port} is this portal itself: a webhook must go elsewhere."
        found = _range_of(target)
        if found is not None and found.always:
            return (
                f"{shown} is {found.words}: webhooks never go there (not even with "
                "TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES)."
            )
        if _allow_private():
            continue
        words = found.words if found is not None else None
        if words is None and not target.is_global:
            words = "not a public address"
        if words is not None:
            return (
                f"{shown} is {words}: webhooks go to public addresses only (the platform "
                "team can allow private ones with TAU_WEBHOOK_ALLOW_PRIVATE_ADDRESSES)."
            )
    return None


# -- the portal itself --------------------------------------------------------------------------


def _url_host_and_port(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower().rstrip("."), port or (443 if parts.scheme == "https" else 80)


def portal_ports() -> set[int]:
    """The ports the portal is served on: those of TAU_PUBLIC_URL and TAU_API_URL."""
    ports = set()
    for url in (getattr(settings, "TAU_PUBLIC_URL", ""), getattr(settings, "TAU_API_URL", "")):
        found = _url_host_and_port(str(url or ""))
        if found is not None:
            ports.add(found[1])
    return ports


def portal_names() -> set[str]:
    """The names the portal is served under: the hosts of TAU_PUBLIC_URL and TAU_API_URL and
    each exact name in ALLOWED_HOSTS (patterns such as ``.example.org`` name other hosts too)."""
    names = set()
    for url in (getattr(settings, "TAU_PUBLIC_URL", ""), getattr(settings, "TAU_API_URL", "")):
        found = _url_host_and_port(str(url or ""))
        if found is not None:
            names.add(found[0])
    for host in getattr(settings, "ALLOWED_HOSTS", []):
        host = str(host).lower().strip("[]").rstrip(".")
        if host and not host.startswith((".", "*")):
            names.add(host)
    return names


def is_portal_name(host: str, port: int) -> bool:
    """Whether ``host:port`` names the portal itself."""
    return port in portal_ports() and host.lower().strip("[]").rstrip(".") in portal_names()


def is_portal_address(address: Address, port: int) -> bool:
    """Whether a connection to ``address:port`` reaches the portal itself: at one of its
    ports, an address of this machine or a non-public address of one of its names."""
    if port not in portal_ports():
        return False
    return _is_this_machine(address) or address in _portal_addresses()


def _is_this_machine(address: Address) -> bool:
    """Loopback, or an address of one of this machine's interfaces: one it can bind to."""
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))
    except OSError:
        return False
    return True


_portal_addresses_cache: tuple[float, frozenset[str], frozenset[Address]] | None = None
_portal_addresses_lock = threading.Lock()


def _portal_addresses() -> frozenset[Address]:
    """The non-public addresses the portal's names resolve to, remembered for a minute."""
    global _portal_addresses_cache
    names = frozenset(portal_names())
    now = time.monotonic()
    with _portal_addresses_lock:
        cached = _portal_addresses_cache
        if cached is not None and cached[1] == names and now - cached[0] < PORTAL_ADDRESSES_SECONDS:
            return cached[2]
    found: set[Address] = set()
    for name in names:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            continue
        for info in infos:
            for target, _ in leads_to(_parse(str(info[4][0]))):
                if not target.is_global:
                    found.add(target)
    result = frozenset(found)
    with _portal_addresses_lock:
        _portal_addresses_cache = (now, names, result)
    return result


# -- resolving and connecting -------------------------------------------------------------------


def _parse(text: str) -> Address:
    return ipaddress.ip_address(text.split("%", 1)[0])


def resolve(host: str, port: int, *, timeout: float | None = None) -> list[Address]:
    """Every address ``host`` resolves to (an address literal: itself), within ``timeout``
    seconds when one is given (the system's resolver has no timeout of its own to ask for, so
    it is asked in a thread that is left behind if it takes longer)."""
    outcome: list[object] = []

    def lookup() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:
            outcome.append(exc)

    if timeout is None:
        lookup()
    else:
        worker = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
        worker.start()
        worker.join(max(timeout, 0.0))
        if not outcome:
            raise RefusedAddress(f"The host {host} could not be resolved within {timeout:.0f}s.")
    answer = outcome[0]
    if isinstance(answer, BaseException):
        raise RefusedAddress(f"The host {host} could not be resolved ({answer}).") from None
    addresses: list[Address] = []
    for info in answer:  # type: ignore[attr-defined]
        address = _parse(str(info[4][0]))
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise RefusedAddress(f"The host {host} has no address.")
    return addresses


def check_url(url: str) -> None:
    """Refuse (``RefusedAddress``) a URL that is not http(s), that names the portal itself,
    or whose host resolves to any address the portal will not post to. For saving: the
    delivery checks again."""
    parts = split_url(url)
    assert parts.hostname is not None
    port = default_port(parts)
    if is_portal_name(parts.hostname, port):
        raise RefusedAddress(
            f"{parts.hostname}:{port} is this portal itself: a webhook must go elsewhere."
        )
    for address in resolve(parts.hostname, port):
        why = refusal(address, port)
        if why is not None:
            raise RefusedAddress(why)


def connect(host: str, port: int, *, deadline: float) -> socket.socket:
    """A TCP connection to ``host``, made to an address that was checked just before: the
    first of its addresses that is allowed and answers, before ``deadline`` (a
    ``time.monotonic()`` value). Refuses (``RefusedAddress``) when none is allowed."""
    if is_portal_name(host, port):
        raise RefusedAddress(f"{host}:{port} is this portal itself: a webhook must go elsewhere.")
    reasons: list[str] = []
    last_error: OSError | None = None
    for address in resolve(host, port, timeout=deadline - time.monotonic()):
        why = refusal(address, port)
        if why is not None:
            reasons.append(why)
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        try:
            return socket.create_connection((str(address), port), timeout=left)
        except OSError as exc:
            last_error = exc
    if last_error is not None:
        raise last_error
    raise RefusedAddress(reasons[0] if reasons else f"{host} has no address to post to.")
