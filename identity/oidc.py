"""OpenID Connect login, hardened.

Built on mozilla-django-oidc, with what it leaves to the application done here:

- endpoints come from the provider's discovery document, cached;
- ID tokens must be signed with an allowed asymmetric algorithm (RS256/ES256 by default;
  ``none`` and HMAC algorithms are refused) by a key from the provider's JWKS, which is
  cached and re-fetched when a token names a key id it does not know;
- ``iss``, ``aud`` (and ``azp``), ``exp``, ``iat`` and the ``nonce`` are checked, and a nonce
  is accepted once only;
- users are identified by (issuer, subject), never by e-mail; e-mail and name follow the
  provider's claims at each login; a new user's username is ASCII, never a look-alike of
  another (portal/usernames.py);
- optional mapping of a groups claim to platform staff and workspace roles, applied at each
  login and audited;
- a session refresh that answers HTMX requests with ``HX-Redirect``;
- logout that also ends the provider's session when the provider supports it.
"""

from __future__ import annotations

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

METADATA_TTL_SECONDS = 3600
JWKS_MIN_REFRESH_SECONDS = 30
CLOCK_SKEW_SECONDS = 60
NONCE_MEMORY_SECONDS = 24 * 3600


class OIDCError(SuspiciousOperation):
    """A response from the provider that must not log anyone in."""


@dataclass
class _Cached:
    value: dict[str, Any]
    fetched_at: float


class ProviderClient:
    """Discovery document and signing keys of the configured provider, cached per process."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        self._lock = threading.Lock()
        self._metadata: _Cached | None = None
        self._jwks: _Cached | None = None

    def _get_json(self, url: str) -> dict[str, Any]:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL)
        response.raise_for_status()
        document = response.json()
        if not isinstance(document, dict):
            raise OIDCError(f"{url} did not return a JSON object")
        return document

    def metadata(self) -> dict[str, Any]:
        with self._lock:
            cached = self._metadata
            if cached is None or time.monotonic() - cached.fetched_at > METADATA_TTL_SECONDS:
                document = self._get_json(f"{self.issuer}/.well-known/openid-configuration")
                if document.get("issuer", "").rstrip("/") != self.issuer:
                    # OpenID Connect Discovery 1.0, section 4.3.
                    raise OIDCError(
                        f"the provider says its issuer is {document.get('issuer')!r}, "
                        f"not the configured {self.issuer!r}"
                    )
                cached = self._metadata = _Cached(document, time.monotonic())
            return cached.value

    def endpoint(self, name: str) -> str:
        value = self.metadata().get(name)
        if not isinstance(value, str) or not value:
            raise OIDCError(f"the provider's discovery document has no {name}")
        return value

    def signing_key(self, kid: str | None, alg: str) -> jwt.PyJWK:
        """The provider key for ``kid``; refetches the key set once when ``kid`` is new."""
        key = self._find_key(kid, alg, refresh=False)
        if key is None:
            key = self._find_key(kid, alg, refresh=True)
        if key is None:
            raise OIDCError(f"the provider has no signing key {kid!r} for {alg}")
        return key

    def _find_key(self, kid: str | None, alg: str, *, refresh: bool) -> jwt.PyJWK | None:
        jwks_uri = self.endpoint("jwks_uri")
        with self._lock:
            cached = self._jwks
            age = None if cached is None else time.monotonic() - cached.fetched_at
            stale = age is None or age > METADATA_TTL_SECONDS
            # A new kid justifies a refetch, but not a flood of them from forged tokens.
            may_refresh = age is None or age > JWKS_MIN_REFRESH_SECONDS
            if stale or (refresh and may_refresh):
                cached = self._jwks = _Cached(self._get_json(jwks_uri), time.monotonic())
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


def verify_id_token(
    token: str, *, nonce: str | None, client: ProviderClient | None = None
) -> dict[str, Any]:
    """Check an ID token completely and return its claims, or raise :class:`OIDCError`."""
    client = client or provider()
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise OIDCError(f"the ID token is malformed: {exc}") from None
    alg = header.get("alg")
    if alg not in settings.TAU_OIDC_SIGNING_ALGORITHMS:
        raise OIDCError(f"ID tokens signed with {alg!r} are not accepted")
    key = client.signing_key(header.get("kid"), alg)
    client_id = settings.OIDC_RP_CLIENT_ID
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key=key,
            algorithms=[alg],
            audience=client_id,
            issuer=client.issuer,
            leeway=CLOCK_SKEW_SECONDS,
            options={"require": ["iss", "sub", "aud", "exp", "iat"]},
        )
    except jwt.PyJWTError as exc:
        raise OIDCError(f"the ID token was refused: {exc}") from None
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
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
        issuer, subject = payload["iss"], payload["sub"]
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
                    str(claims.get(settings.TAU_OIDC_USERNAME_CLAIM) or subject),
                    issuer=issuer,
                    subject=subject,
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


class OIDCLoginView(View):
    """Send the browser to the provider's login page."""

    http_method_names = ["get"]

    def get(self, request: HttpRequest) -> HttpResponseBase:
        if not settings.TAU_OIDC_ENABLED:
            return HttpResponse("Single sign-on is not configured.", status=404)
        request.session["oidc_login_next"] = get_next_url(request, "next")
        try:
            url = authorization_url(request)
        except (requests.RequestException, OIDCError) as exc:
            logger.warning("cannot reach the OpenID provider: %s", exc)
            return HttpResponseRedirect(reverse("login") + "?oidc=unavailable")
        return HttpResponseRedirect(url)


class OIDCCallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """The provider sends the browser back here; failures are audited, never a 500."""

    def get(self, request: HttpRequest) -> HttpResponseBase:
        if not settings.TAU_OIDC_ENABLED:
            return HttpResponse("Single sign-on is not configured.", status=404)
        try:
            response: HttpResponseBase = super().get(request)
        except (SuspiciousOperation, requests.RequestException) as exc:
            logger.warning("OpenID Connect login refused: %s", exc)
            self._audit_failure(request, str(exc))
            return HttpResponseRedirect(settings.LOGIN_REDIRECT_URL_FAILURE)
        return response

    def login_failure(self) -> HttpResponseBase:
        error = self.request.GET.get("error")
        self._audit_failure(self.request, error or "the provider did not authenticate the user")
        return HttpResponseRedirect(settings.LOGIN_REDIRECT_URL_FAILURE)

    @staticmethod
    def _audit_failure(request: HttpRequest, reason: str) -> None:
        audit.record(action="login.failed", object_type="oidc", object_repr=reason[:200])


def provider_logout_url(request: HttpRequest, id_token: str | None) -> str | None:
    """Where to send the browser so the provider ends its session too (RP-initiated logout)."""
    if not (settings.TAU_OIDC_ENABLED and settings.TAU_OIDC_PROVIDER_LOGOUT and id_token):
        return None
    try:
        end_session = provider().metadata().get("end_session_endpoint")
    except (requests.RequestException, OIDCError):
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
            except (requests.RequestException, OIDCError) as exc:
                logger.warning("session refresh skipped, provider unreachable: %s", exc)
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
