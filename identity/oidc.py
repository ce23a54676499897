"""OpenID Connect login, hardened.

Built on mozilla-django-oidc, with what it leaves to the application done here:

- endpoints come from the provider's discovery document, cached for a few minutes and
  fetched again at once when a login or logout meets something the cached copy does not
  explain (a token from another issuer, a logout without an ``end_session_endpoint``);
- ID tokens must be signed with an allowed asymmetric algorithm (RS256/ES256 by default;
  ``none`` and HMAC algorithms are refused) by a key from the provider's JWKS, which is
  cached and fetched again when a token names a key id it does not know (at most every
  ``JWKS_MIN_REFRESH_SECONDS``, which a login then waits for, so a key rotation fails no
  login and forged key ids cannot flood the provider);
- ``iss`` must be exactly the ``issuer`` the provider publishes in its discovery document
  (which may differ from ``TAU_OIDC_ISSUER`` by a trailing slash, nothing else); ``aud`` (and
  ``azp``), ``exp``, ``iat`` and the ``nonce`` are checked, and a nonce is accepted once only;
- what goes wrong is told apart: a setup mistake (:class:`OIDCSetupError`, which no retry
  fixes: it says what to change), the provider being unreachable (:class:`OIDCUnavailable`),
  or one login refused (:class:`OIDCError`). The last setup or reachability problem is kept
  in the cache for the login page, staff pages and ``/readyz`` (:func:`sso_status`);
- users are identified by (issuer, subject), never by e-mail; e-mail and name follow the
  provider's claims at each login; a new user's username comes from
  ``TAU_OIDC_USERNAME_CLAIM``, else ``preferred_username``, the e-mail's local part or the
  name, and only then the (often opaque) subject; it is ASCII, never a look-alike of another
  (portal/usernames.py);
- optional mapping of a groups claim to platform staff and workspace roles, applied at each
  login and audited;
- a session refresh that answers HTMX requests with ``HX-Redirect``;
- logout that also ends the provider's session when the provider supports it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.crypto import get_random_string
from django.views import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import (
    absolutify,
    add_state_and_verifier_and_nonce_to_session,
    generate_code_challenge,
)
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, get_next_url

from identity.models import OIDCIdentity
from portal import audit, usernames
from workspaces.models import Membership, MembershipSource, Role, Workspace

if TYPE_CHECKING:
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)

#: How long a discovery document or key set is used before it is fetched again anyway.
METADATA_TTL_SECONDS = 300
#: The least time between two fetches that something unexplained asked for: a token naming
#: an unknown key id (a rotation: a login waits out the rest of this rather than fail), a
#: token from an issuer the cached document does not name, a logout the cached document
#: offers no endpoint for.
JWKS_MIN_REFRESH_SECONDS = 2
METADATA_MIN_REFRESH_SECONDS = 5
#: /readyz looks at the provider itself at most this often, with this short a timeout.
STATUS_CHECK_SECONDS = 300
STATUS_CHECK_TIMEOUT_SECONDS = 2
STATUS_KEY = "oidc:status"  # + a fingerprint of the settings
CLOCK_SKEW_SECONDS = 60
NONCE_MEMORY_SECONDS = 24 * 3600
ISSUER_HINT = (
    "TAU_OIDC_ISSUER must be the issuer URL the provider publishes, the one under which "
    "/.well-known/openid-configuration is served (Keycloak: https://HOST/realms/REALM; "
    "Dex: its `issuer` setting; Entra ID: https://login.microsoftonline.com/TENANT-ID/v2.0)."
)


class OIDCError(SuspiciousOperation):
    """A response from the provider that must not log anyone in."""


class OIDCSetupError(OIDCError):
    """The portal's settings and the provider's disagree: no retry helps until one of them
    is changed. ``problem`` says what does not match (both values), ``fix`` what to change."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


class OIDCUnavailable(Exception):
    """The provider cannot be reached or answered with a server error: try again later."""


@dataclass(frozen=True)
class Problem:
    """What the login page, staff and /readyz are told about a failed step."""

    kind: str  # "misconfigured", "unavailable" or "refused"
    detail: str
    fix: str = ""


def problem_of(exc: BaseException) -> Problem:
    if isinstance(exc, OIDCSetupError):
        return Problem("misconfigured", exc.problem, exc.fix)
    if isinstance(exc, OIDCUnavailable | requests.RequestException):
        return Problem("unavailable", str(exc))
    return Problem("refused", str(exc))


def _status_key() -> str:
    """Per configuration: once the settings are corrected (a restart), old problems are gone."""
    fingerprint = "\n".join(
        [
            settings.TAU_OIDC_ISSUER,
            settings.OIDC_RP_CLIENT_ID,
            settings.OIDC_RP_SCOPES,
            ",".join(settings.TAU_OIDC_SIGNING_ALGORITHMS),
        ]
    )
    return f"{STATUS_KEY}:{hashlib.sha256(fingerprint.encode()).hexdigest()[:16]}"


def record_status(problem: Problem | None, *, source: str = "login") -> None:
    """Keep the provider's state for the login page, staff pages and /readyz (shared by all
    processes through the cache). A refused login says nothing about the setup. ``source``
    is "login" (a real login or logout) or "discovery" (the /readyz check, which only
    fetches the discovery document and so cannot clear what a login found)."""
    if problem is not None and problem.kind == "refused":
        return
    key = _status_key()
    previous: dict[str, Any] = cache.get(key) or {}
    now = timezone.now().isoformat(timespec="seconds")
    if problem is None:
        if (
            source == "discovery"
            and previous.get("source") == "login"
            and previous.get("status") == "misconfigured"
        ):
            return  # the document is fine; what the last login met may still be wrong
        status: dict[str, Any] = {"status": "ok", "checked_at": now, "source": source}
    else:
        same = previous.get("status") == problem.kind and previous.get("detail") == problem.detail
        status = {
            "status": problem.kind,
            "detail": problem.detail,
            "checked_at": now,
            "since": previous.get("since", now) if same else now,
            "source": source,
        }
        if problem.fix:
            status["fix"] = problem.fix
    cache.set(key, status, timeout=24 * 3600)


def sso_status(*, check: bool = False) -> dict[str, Any] | None:
    """The last known state of single sign-on, or None when it is not configured. With
    ``check``, a state older than ``STATUS_CHECK_SECONDS`` (or none) is refreshed by fetching
    the discovery document with a short timeout."""
    if not settings.TAU_OIDC_ENABLED:
        return None
    status: dict[str, Any] | None = cache.get(_status_key())
    fresh = False
    if status is not None:
        try:
            checked = dt.datetime.fromisoformat(str(status.get("checked_at")))
            fresh = (timezone.now() - checked).total_seconds() < STATUS_CHECK_SECONDS
        except ValueError:
            fresh = False
    if check and not fresh:
        try:
            provider().metadata(refresh=True, timeout=STATUS_CHECK_TIMEOUT_SECONDS)
        except (OIDCError, OIDCUnavailable) as exc:
            record_status(problem_of(exc), source="discovery")
        else:
            record_status(None, source="discovery")
        status = cache.get(_status_key())
    return status


@dataclass
class _Cached:
    value: dict[str, Any]
    fetched_at: float

    @property
    def age(self) -> float:
        return time.monotonic() - self.fetched_at


class ProviderClient:
    """Discovery document and signing keys of the configured provider, cached per process."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer.rstrip("/")
        self._lock = threading.Lock()
        self._metadata: _Cached | None = None
        self._jwks: _Cached | None = None

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def _get_json(self, url: str, what: str, *, timeout: float | None = None) -> dict[str, Any]:
        try:
            response = requests.get(
                url, timeout=timeout or settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL
            )
        except requests.exceptions.SSLError as exc:
            raise OIDCSetupError(
                f"the TLS connection to {url} failed: {exc}",
                "If the provider's certificate is from a private CA, set TAU_OIDC_CA_BUNDLE to "
                "a file with that CA's certificate; else check that the URL's host name is on "
                "the provider's certificate.",
            ) from None
        except requests.RequestException as exc:
            raise OIDCUnavailable(f"{what} at {url} cannot be fetched: {exc}") from None
        if response.status_code >= 500 or response.status_code == 429:
            raise OIDCUnavailable(f"{what} at {url} answered HTTP {response.status_code}")
        if response.status_code != 200:
            raise OIDCSetupError(
                f"{what} at {url} answered HTTP {response.status_code}",
                ISSUER_HINT if what == "the discovery document" else "Check the provider.",
            )
        try:
            document = response.json()
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise OIDCSetupError(f"{what} at {url} is not a JSON object", ISSUER_HINT)
        return document

    def metadata(self, *, refresh: bool = False, timeout: float | None = None) -> dict[str, Any]:
        """The discovery document; ``refresh`` asks for a new copy unless the cached one is
        only seconds old."""
        with self._lock:
            cached = self._metadata
            if (
                cached is None
                or cached.age > METADATA_TTL_SECONDS
                or (refresh and cached.age > METADATA_MIN_REFRESH_SECONDS)
            ):
                document = self._get_json(
                    self.discovery_url, "the discovery document", timeout=timeout
                )
                published = document.get("issuer")
                # OpenID Connect Discovery 1.0, section 4.3: the document is for the issuer it
                # was fetched for. A trailing slash is the one difference tolerated (tokens
                # must then carry the issuer exactly as published: verify_id_token).
                if not isinstance(published, str) or published.rstrip("/") != self.issuer:
                    raise OIDCSetupError(
                        f"the provider at {self.discovery_url} says its issuer is "
                        f"{published!r}, but TAU_OIDC_ISSUER is {self.issuer!r}",
                        f"Set TAU_OIDC_ISSUER to {published!r} exactly, or change the "
                        "provider's issuer setting: the scheme, host name, port and path must "
                        "be the same ('localhost' and '127.0.0.1' are different issuers).",
                    )
                if cached is not None and cached.value.get("issuer") != published:
                    logger.info("the provider's issuer is now %r", published)
                cached = self._metadata = _Cached(document, time.monotonic())
            return cached.value

    def published_issuer(self, *, refresh: bool = False) -> str:
        return str(self.metadata(refresh=refresh)["issuer"])

    def endpoint(self, name: str) -> str:
        value = self.metadata().get(name)
        if not isinstance(value, str) or not value:
            raise OIDCSetupError(
                f"the provider's discovery document ({self.discovery_url}) has no {name}",
                ISSUER_HINT,
            )
        return value

    def signing_key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        """The provider key for ``kid``; refetches the key set once when ``kid`` is new."""
        key = self._find_key(kid, alg, refresh=False)
        if key is None:
            key = self._find_key(kid, alg, refresh=True)
        if key is None:
            raise OIDCError(
                f"the provider has no signing key {kid!r} for {alg} in its key set "
                f"({self.metadata().get('jwks_uri')})"
            )
        return key

    def _find_key(self, kid: str | None, alg: str, *, refresh: bool) -> jwt.PyJWK | None:
        jwks_uri = self.endpoint("jwks_uri")
        asked = time.monotonic()
        if refresh:
            # A new kid justifies a refetch (a rotation), but not a flood of them from forged
            # tokens: at most one every JWKS_MIN_REFRESH_SECONDS. A provider restarted
            # moments after the last fetch is the usual rotation, so wait out the rest of the
            # interval rather than fail the login.
            with self._lock:
                cached = self._jwks
                wait = 0.0 if cached is None else JWKS_MIN_REFRESH_SECONDS - cached.age
            if wait > 0:
                time.sleep(wait)
        with self._lock:
            cached = self._jwks
            stale = cached is None or cached.age > METADATA_TTL_SECONDS
            # Fetched by another request since this one asked: that copy will do.
            fetched_since = cached is not None and cached.fetched_at >= asked
            if stale or (refresh and not fetched_since):
                cached = self._jwks = _Cached(
                    self._get_json(jwks_uri, "the key set"), time.monotonic()
                )
                if refresh:
                    logger.info("fetched the provider's key set again for key id %r", kid)
        assert cached is not None
        candidates = [
            jwk
            for jwk in cached.value.get("keys", [])
            if isinstance(jwk, dict)
            and jwk.get("use", "sig") == "sig"
            and (kid is None or jwk.get("kid") == kid)
            and jwk.get("alg", alg) == alg
        ]
        if len(candidates) != 1:
            return None  # none, or ambiguous without a kid: refuse rather than guess
        try:
            return jwt.PyJWK(candidates[0], algorithm=alg)
        except jwt.PyJWKError as exc:
            raise OIDCError(f"the provider's key {kid!r} cannot be used: {exc}") from None


_clients: dict[str, ProviderClient] = {}
_clients_lock = threading.Lock()


def provider() -> ProviderClient:
    issuer = settings.TAU_OIDC_ISSUER
    with _clients_lock:
        client = _clients.get(issuer)
        if client is None:
            client = _clients[issuer] = ProviderClient(issuer)
        return client


#: Algorithms that are never acceptable for an ID token from a provider (alg=none, and HMAC,
#: whose "key" would be the client secret or, in the classic confusion, the public key).
_FORBIDDEN_ALGORITHMS = ("none", "HS256", "HS384", "HS512")


def verify_id_token(
    token: str, *, nonce: str | None, client: ProviderClient | None = None
) -> dict[str, Any]:
    """Check an ID token completely and return its claims, or raise :class:`OIDCError`
    (:class:`OIDCSetupError` when the token shows the settings disagree)."""
    client = client or provider()
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise OIDCError(f"the ID token is malformed: {exc}") from None
    alg = header.get("alg")
    allowed = settings.TAU_OIDC_SIGNING_ALGORITHMS
    if alg not in allowed:
        if alg in _FORBIDDEN_ALGORITHMS or not isinstance(alg, str):
            raise OIDCError(f"ID tokens signed with {alg!r} are not accepted")
        raise OIDCSetupError(
            f"the provider signs ID tokens with {alg}, which TAU_OIDC_SIGNING_ALGORITHMS "
            f"({', '.join(allowed)}) does not allow",
            f"Add {alg} to TAU_OIDC_SIGNING_ALGORITHMS, or have the provider sign this client's "
            f"ID tokens with one of {', '.join(allowed)}.",
        )
    client_id = settings.OIDC_RP_CLIENT_ID
    key = client.signing_key(header.get("kid"), alg)
    try:
        # The audience is checked below, once the signature is known to be the provider's,
        # so that a wrong client id can be told apart (and named) from a forged token.
        claims: dict[str, Any] = jwt.decode(
            token,
            key=key,
            algorithms=[alg],
            leeway=CLOCK_SKEW_SECONDS,
            options={"require": ["iss", "sub", "aud", "exp", "iat"], "verify_aud": False},
        )
    except (jwt.ExpiredSignatureError, jwt.ImmatureSignatureError) as exc:
        raise OIDCError(
            f"the ID token was refused: {exc} (if this repeats, compare the clocks of the "
            "portal and the provider)"
        ) from None
    except jwt.PyJWTError as exc:
        raise OIDCError(f"the ID token was refused: {exc}") from None
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if client_id not in audiences:
        raise OIDCSetupError(
            f"the ID token is for the client {', '.join(map(repr, audiences))}, "
            f"but TAU_OIDC_CLIENT_ID is {client_id!r}",
            "Set TAU_OIDC_CLIENT_ID to the client id registered at the provider for TauGrid.",
        )
    if claims["iss"] != client.published_issuer():
        # The cached discovery document may be older than a change at the provider.
        published = client.published_issuer(refresh=True)
        if claims["iss"] != published:
            raise OIDCSetupError(
                f"the ID token's issuer (iss) is {claims['iss']!r}, but the provider's "
                f"discovery document ({client.discovery_url}) says its issuer is {published!r}",
                "The provider signs tokens under another name than it publishes: make its "
                "public URL setting agree with the URL it is reached at (Keycloak: KC_HOSTNAME; "
                "Dex: `issuer`), then TAU_OIDC_ISSUER with both.",
            )
    if len(audiences) > 1 and claims.get("azp") != client_id:
        raise OIDCError("the ID token is for several parties and not authorised for this one")
    if nonce is None or not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
        raise OIDCError("the ID token's nonce does not match this login")
    # A nonce is good for one login: remember it until well after any token could expire.
    if not cache.add(f"oidc:nonce:{nonce}", 1, timeout=NONCE_MEMORY_SECONDS):
        raise OIDCError("this ID token was already used")
    return claims


@dataclass(frozen=True)
class RoleGrant:
    workspace_slug: str
    role: str


def workspace_role_mapping() -> dict[str, list[RoleGrant]]:
    """``TAU_OIDC_WORKSPACE_ROLES`` as group → grants."""
    mapping: dict[str, list[RoleGrant]] = {}
    for item in settings.TAU_OIDC_WORKSPACE_ROLES:
        group, _, target = item.partition("=")
        slug, _, role = target.partition(":")
        if not group or not slug or role not in Role.values:
            raise ValueError(
                f"TAU_OIDC_WORKSPACE_ROLES entry {item!r} must look like group=workspace:role "
                f"with role one of {', '.join(Role.values)}"
            )
        mapping.setdefault(group.strip(), []).append(RoleGrant(slug.strip(), role))
    return mapping


def apply_group_mapping(user: User, groups: list[str]) -> None:
    """Bring staff flags and group-sourced memberships in line with the user's groups."""
    group_set = set(groups)
    with audit.acting_as(None, source="oidc"):
        for flag, configured in (
            ("is_staff", settings.TAU_OIDC_STAFF_GROUPS),
            ("is_superuser", settings.TAU_OIDC_SUPERUSER_GROUPS),
        ):
            if not configured:
                continue
            wanted = bool(group_set & set(configured))
            if getattr(user, flag) != wanted:
                audit.record(
                    action="user.role_change",
                    object_type="auth.user",
                    object_id=str(user.pk),
                    object_repr=user.get_username(),
                    before={flag: not wanted},
                    after={flag: wanted},
                )
                setattr(user, flag, wanted)
                user.save(update_fields=[flag])
        mapping = workspace_role_mapping()
        if not mapping:
            return
        wanted_roles: dict[str, Role] = {}
        for group in group_set & set(mapping):
            for grant in mapping[group]:
                role = Role(grant.role)
                current = wanted_roles.get(grant.workspace_slug)
                if current is None or role.includes(current):
                    wanted_roles[grant.workspace_slug] = role
        mapped_slugs = {grant.workspace_slug for grants in mapping.values() for grant in grants}
        workspaces = {
            ws.slug: ws for ws in Workspace.objects.unscoped().filter(slug__in=mapped_slugs)
        }
        existing = {
            m.workspace.slug: m
            for m in Membership.objects.for_workspaces(workspaces.values())
            .filter(user=user)
            .select_related("workspace")
        }
        for slug, workspace in workspaces.items():
            membership = existing.get(slug)
            wanted_role = wanted_roles.get(slug)
            if membership is not None and membership.source != MembershipSource.OIDC:
                continue  # added by an admin: the admin's decision stands
            if wanted_role is None:
                if membership is not None:
                    membership.delete()
            elif membership is None:
                Membership.objects.create(
                    workspace=workspace, user=user, role=wanted_role, source=MembershipSource.OIDC
                )
            elif membership.role != wanted_role:
                membership.role = wanted_role
                membership.save(update_fields=["role"])


def username_source(claims: dict[str, Any], subject: str) -> str:
    """What a new user's username is made from: ``TAU_OIDC_USERNAME_CLAIM`` (any claim),
    else ``preferred_username``, else the e-mail's local part, else the name, and only then
    the subject, which many providers make opaque (Dex: ``Cg0wLTM4NS0y…``)."""
    for name in dict.fromkeys((settings.TAU_OIDC_USERNAME_CLAIM, "preferred_username")):
        value = claims.get(name)
        if isinstance(value, int | str) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip()
    email = claims.get(settings.TAU_OIDC_EMAIL_CLAIM)
    if isinstance(email, str) and "@" in email.strip("@"):
        return email.strip().rpartition("@")[0]
    full_name = claims.get(settings.TAU_OIDC_NAME_CLAIM)
    if isinstance(full_name, str) and full_name.strip():
        return ".".join(full_name.lower().split())
    return subject


def _unique_username(wanted: str) -> str:
    user_model = get_user_model()
    base = (wanted or "user")[:140]
    candidate = base
    suffix = 2
    # Case-insensitively: "Researcher" must not become a second account beside "researcher".
    while user_model._default_manager.filter(username__iexact=candidate).exists():
        candidate = f"{base}-{suffix}"
        suffix += 1
    return candidate


class OIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """The authorization-code flow with the checks described in the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Endpoints are looked up from discovery when a login happens, not at start-up.
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:
        return provider().endpoint("token_endpoint")

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:
        return provider().endpoint("userinfo_endpoint")

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        return verify_id_token(token, nonce=kwargs.get("nonce"))

    def get_token(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            token: dict[str, Any] = super().get_token(payload)
        except requests.RequestException as exc:
            raise OIDCUnavailable(f"the token endpoint cannot be reached: {exc}") from None
        return token

    def raise_token_response_error(self, response: requests.Response) -> None:
        """Tell a setup mistake (wrong client id or secret, wrong authentication method)
        from an outage and from one bad login code. The body is the provider's OAuth error,
        never our secret; only its error code and description are kept."""
        if response.status_code == 200:
            return
        try:
            body = response.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        error = str(body.get("error", ""))[:100]
        description = str(body.get("error_description", ""))[:300]
        said = f"{error}: {description}" if description else error or "no error code"
        where = f"the token endpoint ({response.url}) answered HTTP {response.status_code}"
        if response.status_code >= 500 or response.status_code == 429:
            raise OIDCUnavailable(f"{where} ({said})")
        if error in ("invalid_client", "unauthorized_client") or response.status_code == 401:
            raise OIDCSetupError(
                f"{where}: the provider refused TauGrid's client credentials ({said})",
                "Check TAU_OIDC_CLIENT_ID and TAU_OIDC_CLIENT_SECRET against the client "
                "registered at the provider, and TAU_OIDC_CLIENT_SECRET_BASIC (true: HTTP "
                "Basic, false: in the form) against the client's token endpoint authentication "
                "method.",
            )
        raise OIDCError(f"{where} ({said})")

    def get_userinfo(
        self, access_token: str, id_token: str, payload: dict[str, Any]
    ) -> dict[str, Any]:
        if not provider().metadata().get("userinfo_endpoint"):
            return {}
        response = requests.get(
            provider().endpoint("userinfo_endpoint"),
            headers={"Authorization": f"Bearer {access_token}"},
            timeout=settings.OIDC_TIMEOUT,
            verify=settings.OIDC_VERIFY_SSL,
        )
        response.raise_for_status()
        if response.headers.get("content-type", "").lower().startswith("application/jwt"):
            raise OIDCError("signed userinfo responses are not supported")
        info = response.json()
        return info if isinstance(info, dict) else {}

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo and userinfo.get("sub") != payload["sub"]:
            # OpenID Connect Core 1.0, section 5.3.2: the sub values must match.
            raise OIDCError("userinfo is about a different subject than the ID token")
        claims = {**userinfo, **payload}
        # Keyed as TAU_OIDC_ISSUER is written (no trailing slash), so that a provider whose
        # published issuer gains or loses its slash keeps its users.
        issuer, subject = str(payload["iss"]).rstrip("/"), payload["sub"]
        with transaction.atomic():
            identity = (
                OIDCIdentity.objects.select_related("user")
                .select_for_update()
                .filter(issuer=issuer, subject=subject)
                .first()
            )
            if identity is None:
                # ASCII only, never a look-alike of someone else's name (usernames.py).
                wanted = usernames.from_claim(
                    username_source(claims, subject), issuer=issuer, subject=subject
                )
                user = self.UserModel._default_manager.create_user(
                    username=_unique_username(wanted)
                )
                identity = OIDCIdentity.objects.create(user=user, issuer=issuer, subject=subject)
            user = identity.user
            self._sync_profile(user, claims)
            identity.last_login_at = timezone.now()
            identity.save(update_fields=["last_login_at"])
            groups = claims.get(settings.TAU_OIDC_GROUPS_CLAIM) or []
            if isinstance(groups, list):
                apply_group_mapping(user, [str(group) for group in groups])
        return user

    def _sync_profile(self, user: Any, claims: dict[str, Any]) -> None:
        changed = []
        email = claims.get(settings.TAU_OIDC_EMAIL_CLAIM)
        if isinstance(email, str) and email != user.email:
            user.email = email
            changed.append("email")
        name = claims.get(settings.TAU_OIDC_NAME_CLAIM)
        if isinstance(name, str):
            first, _, last = name.partition(" ")
            given_claim, family_claim = claims.get("given_name"), claims.get("family_name")
            given = given_claim if isinstance(given_claim, str) else first
            family = family_claim if isinstance(family_claim, str) else last
            if (user.first_name, user.last_name) != (given[:150], family[:150]):
                user.first_name, user.last_name = given[:150], family[:150]
                changed += ["first_name", "last_name"]
        if changed:
            user.save(update_fields=changed)


def authorization_url(request: HttpRequest, *, prompt: str | None = None) -> str:
    """Start a login at the provider: state, nonce and PKCE verifier go into the session."""
    params: dict[str, str] = {
        "response_type": "code",
        "scope": settings.OIDC_RP_SCOPES,
        "client_id": settings.OIDC_RP_CLIENT_ID,
        "redirect_uri": absolutify(request, reverse("oidc-callback")),
        "state": get_random_string(32),
        "nonce": get_random_string(32),
    }
    if prompt:
        params["prompt"] = prompt
    code_verifier = get_random_string(64)
    params["code_challenge"] = generate_code_challenge(code_verifier, "S256")
    params["code_challenge_method"] = "S256"
    add_state_and_verifier_and_nonce_to_session(request, params["state"], params, code_verifier)
    return f"{provider().endpoint('authorization_endpoint')}?{urlencode(params)}"


def _failure_url(problem: Problem) -> str:
    kind = {"misconfigured": "misconfigured", "unavailable": "unavailable"}.get(
        problem.kind, "failed"
    )
    return f"{reverse('login')}?oidc={kind}"


def _log_problem(what: str, problem: Problem) -> None:
    if problem.kind == "misconfigured":
        logger.error(
            "%s: single sign-on is misconfigured: %s. %s", what, problem.detail, problem.fix
        )
    elif problem.kind == "unavailable":
        logger.warning("%s: the OpenID provider is unavailable: %s", what, problem.detail)
    else:
        logger.warning("%s: OpenID Connect login refused: %s", what, problem.detail)


class OIDCLoginView(View):
    """Send the browser to the provider's login page."""

    http_method_names = ["get"]

    def get(self, request: HttpRequest) -> HttpResponseBase:
        if not settings.TAU_OIDC_ENABLED:
            return HttpResponse("Single sign-on is not configured.", status=404)
        request.session["oidc_login_next"] = get_next_url(request, "next")
        try:
            url = authorization_url(request)
        except (OIDCUnavailable, OIDCError) as exc:
            problem = problem_of(exc)
            _log_problem("login", problem)
            record_status(problem)
            return HttpResponseRedirect(_failure_url(problem))
        return HttpResponseRedirect(url)


#: Errors a provider sends back to the callback (OAuth 2.0 section 4.1.2.1, OpenID Connect
#: section 3.1.2.6) that mean the client's registration or request is wrong, not the user.
_SETUP_ERRORS = {
    "unauthorized_client",
    "invalid_scope",
    "unsupported_response_type",
    "invalid_request",
    "invalid_client",
    "request_not_supported",
    "registration_not_supported",
}
_OUTAGE_ERRORS = {"server_error", "temporarily_unavailable"}


class OIDCCallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """The provider sends the browser back here; failures are audited, never a 500."""

    def get(self, request: HttpRequest) -> HttpResponseBase:
        if not settings.TAU_OIDC_ENABLED:
            return HttpResponse("Single sign-on is not configured.", status=404)
        try:
            response: HttpResponseBase = super().get(request)
        except (SuspiciousOperation, OIDCUnavailable, requests.RequestException) as exc:
            problem = problem_of(exc)
            _log_problem("callback", problem)
            record_status(problem)
            self._audit_failure(request, problem.detail)
            return HttpResponseRedirect(_failure_url(problem))
        if request.user.is_authenticated:
            record_status(None)
        return response

    def login_failure(self) -> HttpResponseBase:
        error = str(self.request.GET.get("error") or "")[:100]
        description = str(self.request.GET.get("error_description") or "")[:300]
        said = f"{error}: {description}" if description else error
        if error in _SETUP_ERRORS:
            problem = Problem(
                "misconfigured",
                f"the provider refused TauGrid's login request ({said})",
                "Compare the client registered at the provider with TAU_OIDC_CLIENT_ID and "
                "TAU_OIDC_SCOPES (each scope must be one the provider offers to this client).",
            )
        elif error in _OUTAGE_ERRORS:
            problem = Problem("unavailable", f"the provider could not log the user in ({said})")
        else:
            problem = Problem("refused", said or "the provider did not authenticate the user")
        _log_problem("callback", problem)
        record_status(problem)
        self._audit_failure(self.request, problem.detail)
        return HttpResponseRedirect(_failure_url(problem))

    @staticmethod
    def _audit_failure(request: HttpRequest, reason: str) -> None:
        audit.record(action="login.failed", object_type="oidc", object_repr=reason[:200])


def provider_logout_url(request: HttpRequest, id_token: str | None) -> str | None:
    """Where to send the browser so the provider ends its session too (RP-initiated logout);
    None when the provider offers no such endpoint (or cannot be asked right now)."""
    if not (settings.TAU_OIDC_ENABLED and settings.TAU_OIDC_PROVIDER_LOGOUT and id_token):
        return None
    try:
        end_session = provider().metadata().get("end_session_endpoint")
        if not end_session:
            # The provider may have started offering it since the document was cached.
            end_session = provider().metadata(refresh=True).get("end_session_endpoint")
    except (OIDCUnavailable, OIDCError) as exc:
        _log_problem("logout", problem_of(exc))
        return None
    if not end_session:
        return None
    params = {
        "id_token_hint": id_token,
        "client_id": settings.OIDC_RP_CLIENT_ID,
        "post_logout_redirect_uri": absolutify(request, reverse("login")),
    }
    return f"{end_session}?{urlencode(params)}"


class OIDCSessionRefreshMiddleware:
    """Re-check an OIDC login with the provider (``prompt=none``) once its ID token would
    have expired. HTMX requests get ``HX-Redirect`` so the whole page goes to the provider
    instead of a fragment receiving a cross-origin redirect."""

    EXEMPT_PREFIXES = ("/oidc/", "/login/", "/logout/", "/static/", "/healthz", "/readyz", "/api/")

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if self._needs_refresh(request):
            try:
                url = authorization_url(request, prompt="none")
            except (OIDCUnavailable, OIDCError) as exc:
                problem = problem_of(exc)
                _log_problem("session refresh skipped", problem)
                record_status(problem)
            else:
                request.session["oidc_login_next"] = request.get_full_path()
                if getattr(request, "htmx", False):
                    response = HttpResponse(status=200)
                    response["HX-Redirect"] = url
                    return response
                return HttpResponseRedirect(url)
        return self.get_response(request)

    def _needs_refresh(self, request: HttpRequest) -> bool:
        if not settings.TAU_OIDC_ENABLED or request.method != "GET":
            return False
        if request.path.startswith(self.EXEMPT_PREFIXES):
            return False
        if not request.user.is_authenticated:
            return False
        if request.session.get(auth.BACKEND_SESSION_KEY) != "identity.oidc.OIDCBackend":
            return False
        expires = float(request.session.get("oidc_id_token_expiration", 0))
        return expires <= time.time()
