"""API tokens: issue, verify, revoke, and authenticate API requests with them.

A token reads ``tau_<key>_<secret>``: the prefix makes leaked tokens easy to find (secret
scanners, logs), the key finds the row, and the secret is checked against an HMAC-SHA256
keyed with a server-side pepper. A database leak alone therefore reveals no usable token,
and rotating the pepper (add a new numbered one, later drop the old) needs no migration.
Secrets are 238 random bits, so a fast keyed hash is the right tool (a slow password hash
would only cost every API request time).

Every failure — unknown key, wrong secret, expired, revoked, inactive user — gets the same
answer, and failed attempts are rate limited per client address and per key: past a limit,
further *failures* answer 429 instead of 401, but a token that verifies is always served
(see :class:`BearerTokenAuthentication` for why).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import re
import secrets
import string
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models.sql.query import Query
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from identity.models import ApiToken
from portal import audit
from portal.rate_limits import add_to_count

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from workspaces.models import Workspace

logger = logging.getLogger(__name__)

PREFIX = "tau_"
_KEY_ALPHABET = string.ascii_lowercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits
KEY_LENGTH = 12
SECRET_LENGTH = 40
TOKEN_PATTERN = re.compile(
    rf"^{PREFIX}([a-z0-9]{{{KEY_LENGTH}}})_([A-Za-z0-9]{{{SECRET_LENGTH}}})$"
)
LAST_USED_RESOLUTION = timedelta(minutes=1)
#: What the audit log calls a token. Kept from when tokens belonged to the portal app: the log
#: is append-only, and one name keeps a token's whole history under one filter.
TOKEN_OBJECT_TYPE = "portal.apitoken"  # noqa: S105 - a name, not a secret
INVALID_TOKEN_MESSAGE = "Invalid or expired token."  # noqa: S105 - a message, not a secret


class TokenPolicyError(ValueError):
    """A token request the policy does not allow (too long an expiry, say)."""


def _peppers() -> dict[int, bytes]:
    return _parsed_peppers(settings.TAU_TOKEN_PEPPERS)


@functools.lru_cache(maxsize=4)
def _parsed_peppers(setting: str) -> dict[int, bytes]:
    """TAU_TOKEN_PEPPERS as numbered keys, parsed once per value (every API request checks a
    token); callers must not change the dict."""
    peppers: dict[int, bytes] = {}
    for item in setting.split(","):
        number, separator, value = item.strip().partition(":")
        if not separator or not number.isdigit() or len(value) < 16:
            raise ValueError(
                "TAU_TOKEN_PEPPERS must look like '2:<random, 16+ chars>,1:<older pepper>'"
            )
        peppers[int(number)] = value.encode()
    return peppers


def _digest(pepper: bytes, key: str, secret: str) -> str:
    return hmac.new(pepper, f"{key}:{secret}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    plaintext: str  # shown to the user once, never stored


def issue_token(
    *,
    user: User,
    name: str,
    workspace: Workspace | None = None,
    read_only: bool = False,
    expires_in_days: int | None = None,
    kind: str = ApiToken.Kind.USER,
    details: dict[str, Any] | None = None,
    scopes: Iterable[str] = (),
) -> IssuedToken:
    """Create a token and return it with its one-time plaintext. Audited; ``details`` (what
    a machine token is for: the run and attempt of a run token, say) go into the audit
    event with the rest. ``scopes``: what it may do beyond what every token may
    (``ApiToken.Scope``)."""
    days = settings.TAU_TOKEN_DEFAULT_DAYS if expires_in_days is None else expires_in_days
    if days < 1 or days > settings.TAU_TOKEN_MAX_DAYS:
        raise TokenPolicyError(
            f"A token can last between 1 and {settings.TAU_TOKEN_MAX_DAYS} days."
        )
    granted = sorted(set(scopes))
    unknown = [scope for scope in granted if scope not in ApiToken.Scope.values]
    if unknown:
        raise TokenPolicyError(
            f"No such scope: {', '.join(unknown)}; scopes: {', '.join(ApiToken.Scope.values)}."
        )
    peppers = _peppers()
    pepper_id = max(peppers)
    key = "".join(secrets.choice(_KEY_ALPHABET) for _ in range(KEY_LENGTH))
    secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(SECRET_LENGTH))
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name,
            kind=kind,
            key=key,
            secret_hash=_digest(peppers[pepper_id], key, secret),
            pepper_id=pepper_id,
            workspace=workspace,
            read_only=read_only,
            scopes=granted,
            expires_at=timezone.now() + timedelta(days=days),
        )
        audit.record(
            action="token.create",
            workspace=workspace,
            object_type=TOKEN_OBJECT_TYPE,
            object_id=str(token.pk),
            object_repr=f"{name} ({token.display_prefix}) of {user.get_username()}",
            after={
                "name": name,
                "key": key,
                "workspace": workspace.slug if workspace else None,
                "read_only": read_only,
                **({"scopes": granted} if granted else {}),
                "expires_at": token.expires_at.isoformat(),
                **({"kind": kind, **details} if details else {}),
            },
        )
    return IssuedToken(token=token, plaintext=f"{PREFIX}{key}_{secret}")


def revoke_token(*, token: ApiToken) -> None:
    if token.revoked_at is not None:
        return
    with transaction.atomic():
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit.record(
            action="token.revoke",
            workspace=token.workspace,
            object_type=TOKEN_OBJECT_TYPE,
            object_id=str(token.pk),
            object_repr=f"{token.name} ({token.display_prefix}) of {token.user.get_username()}",
            # What kind of token it was, as the server knows it: the audit pages tell a run
            # token's revocation by this, not by a name its owner could choose.
            after={"kind": token.kind},
        )


def key_of(raw: str) -> str | None:
    match = TOKEN_PATTERN.match(raw)
    return match.group(1) if match else None


def verify_token(raw: str) -> ApiToken | None:
    """The active token for ``raw``, or None. Takes the same time whether or not the key exists."""
    match = TOKEN_PATTERN.match(raw)
    peppers = _peppers()
    if match is None:
        return None
    key, secret = match.groups()
    token = token_with_user(key)
    if token is None or token.pepper_id not in peppers:
        # Spend the same effort as for a real key, so timing does not reveal which keys exist.
        hmac.compare_digest(_digest(peppers[max(peppers)], key, secret), "0" * 64)
        return None
    if not hmac.compare_digest(_digest(peppers[token.pepper_id], key, secret), token.secret_hash):
        return None
    now = timezone.now()
    if token.revoked_at is not None or not token.user.is_active:
        return None
    if token.is_expired(now):
        audit.record(
            action="token.expired_use",
            workspace=token.workspace,
            actor=token.user,
            object_type=TOKEN_OBJECT_TYPE,
            object_id=str(token.pk),
            object_repr=f"{token.name} ({token.display_prefix}) of {token.user.get_username()}",
        )
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        # At most one write a minute per token: reads must not turn into writes.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def token_with_user(key: str) -> ApiToken | None:
    """The token with this key and its user (the request's user), what
    ``ApiToken.objects.select_related("user").filter(key=key).first()`` gives, from one SQL
    statement written out once per process: every API request asks, and building the query
    through the ORM each time cost more than a bare API request. The workspace is not
    loaded: requests need only its id; the audit of an expired token loads it."""
    user_model = get_user_model()
    token_fields = ApiToken._meta.concrete_fields
    user_fields = user_model._meta.concrete_fields
    with connection.cursor() as cursor:
        cursor.execute(_token_with_user_sql(connection.vendor), [key])
        row = cursor.fetchone()
    if row is None:
        return None
    # The values as the ORM would give them (on SQLite, times and booleans need converting).
    compiler = connection.ops.compiler("SQLCompiler")(Query(ApiToken), connection, DEFAULT_DB_ALIAS)
    columns: list[Any] = [field.get_col(ApiToken._meta.db_table) for field in token_fields]
    columns += [field.get_col(user_model._meta.db_table) for field in user_fields]
    (values,) = compiler.apply_converters([row], compiler.get_converters(columns))
    split = len(token_fields)
    token = ApiToken.from_db(
        DEFAULT_DB_ALIAS, [field.attname for field in token_fields], values[:split]
    )
    user = user_model.from_db(
        DEFAULT_DB_ALIAS, [field.attname for field in user_fields], values[split:]
    )
    ApiToken._meta.get_field("user").set_cached_value(token, user)
    return token


@functools.cache
def _token_with_user_sql(vendor: str) -> str:
    quote = connection.ops.quote_name
    tokens, users = ApiToken._meta, get_user_model()._meta
    columns = [f"t.{quote(field.column)}" for field in tokens.concrete_fields]
    columns += [f"u.{quote(field.column)}" for field in users.concrete_fields]
    user_id = quote(tokens.get_field("user").column)
    # Names come from the models' own metadata only; the key goes as a parameter.
    return (
        f"SELECT {', '.join(columns)} FROM {quote(tokens.db_table)} t "  # noqa: S608
        f"INNER JOIN {quote(users.db_table)} u ON u.{quote(users.pk.column)} = t.{user_id} "
        f"WHERE t.{quote(tokens.get_field('key').column)} = %s"
    )


@dataclass(frozen=True)
class Bucket:
    """One thing failures are counted against: a cache key, its limit, and what it is in
    words (for the audit log)."""

    name: str
    limit: int
    subject: str
    object_type: str = ""
    object_id: str = ""


class FailureLimiter:
    """Counts failed authentications per bucket (client address, token key, account) in the
    shared cache, in fixed windows of ``window`` seconds.

    The cache being down never turns into an outage: counting is skipped (with a warning)
    and the checks themselves still apply.
    """

    def __init__(self, buckets: list[Bucket], window: int) -> None:
        self.buckets = buckets
        self.window = window

    def add(self, delta: int = 1) -> dict[str, int]:
        """Add ``delta`` to every bucket (atomically in Redis); the new counts."""
        counts: dict[str, int] = {}
        try:
            for bucket in self.buckets:
                counts[bucket.name] = add_to_count(bucket.name, self.window, delta)
        except Exception:
            logger.warning("rate-limit cache unavailable; failure not counted", exc_info=True)
        return counts

    def record_failure(self) -> list[tuple[Bucket, int]]:
        """Count one failure; the buckets now past their limit, with their counts."""
        counts = self.add(1)
        return [
            (bucket, counts[bucket.name])
            for bucket in self.buckets
            if counts.get(bucket.name, 0) > bucket.limit
        ]

    def forget(self, bucket: Bucket) -> None:
        try:
            cache.delete(bucket.name)
        except Exception:
            logger.warning("rate-limit cache unavailable; count not cleared", exc_info=True)


def token_limiter(address: str, key: str | None) -> FailureLimiter:
    buckets = [
        Bucket(
            f"authfail:addr:{address}",
            settings.TAU_AUTH_FAILURES_PER_ADDRESS,
            f"address {address}",
            object_type="address",
            object_id=address[:64],
        )
    ]
    if key is not None:
        buckets.append(
            Bucket(
                f"authfail:key:{key}",
                settings.TAU_AUTH_FAILURES_PER_KEY,
                f"token key {key}",
                object_type=TOKEN_OBJECT_TYPE,
            )
        )
    return FailureLimiter(buckets, settings.TAU_AUTH_FAILURE_WINDOW_SECONDS)


def _audit_token_throttle(bucket: Bucket, window: int) -> None:
    """Audit the failure that first went past a bucket's limit (once per bucket and window)."""
    token = None
    if bucket.object_type == TOKEN_OBJECT_TYPE:
        key = bucket.name.rpartition(":")[2]
        token = ApiToken.objects.select_related("user", "workspace").filter(key=key).first()
    audit.record(
        action="token.throttled",
        workspace=token.workspace if token is not None else None,
        object_type=bucket.object_type,
        object_id=str(token.pk) if token is not None else bucket.object_id,
        object_repr=(
            f"{bucket.limit} failed token checks for {bucket.subject}"
            + (f" ({token.name} of {token.user.get_username()})" if token is not None else "")
            + f" within {window} s; further failures answer 429"
        ),
    )


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer tau_…`` on the whole API.

    Rate limits slow an attacker without locking out the people they protect. Failures are
    counted per client address (the real one behind a trusted proxy) and per token key; past
    either limit within the window, further failures answer ``429`` instead of ``401``. A
    token that verifies is always served, whatever the counters say: local workloads and
    everyone behind a proxy share an address, so refusing valid tokens from a busy address
    would let anyone lock every token user out with a few bad requests.

    The same holds per key, deliberately: keys are not secret (they appear in the tokens page,
    the audit log and ``display_prefix``), so refusing the right secret for a key over its
    limit would let anyone who saw a key lock its owner out. What the per-key limit guards
    against, guessing one key's secret, is already out of reach: the secret is 40 random
    characters (238 bits), so no number of guesses at any rate finds it. The limit still
    turns the attempts into 429s and one ``token.throttled`` audit event per window, so the
    guessing is visible to the platform team.

    Checking a token costs one indexed query and one HMAC — no more than serving it — and a
    malformed token is refused before any query, so an address past its limit gets no
    cheaper check than this to refuse by; what it loses is a clean 401.
    """

    keyword = "bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Give the token as: Authorization: Bearer <token>."
            )
        try:
            raw = header[1].decode("ascii")
        except UnicodeDecodeError:
            raw = ""
        token = verify_token(raw)
        if token is not None:
            return (token.user, token)
        limiter = token_limiter(request.META.get("REMOTE_ADDR", "unknown"), key_of(raw))
        over = limiter.record_failure()
        if over:
            for bucket, count in over:
                if count == bucket.limit + 1:
                    _audit_token_throttle(bucket, limiter.window)
            raise exceptions.Throttled(
                wait=limiter.window, detail="Too many failed attempts; try again later."
            )
        raise exceptions.AuthenticationFailed(INVALID_TOKEN_MESSAGE)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="TauGrid API"'


def token_of(request: Request) -> ApiToken | None:
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiToken) else None


#: Each kind of machine token: the view attribute that says a view accepts it, and what a
#: view that does not says to it. A kind not named here reaches no view at all.
MACHINE_TOKEN_VIEWS: dict[str, tuple[str, str]] = {
    ApiToken.Kind.RUN: ("accepts_run_tokens", "This token can only report on its run."),
    ApiToken.Kind.ENDPOINT: (
        "accepts_endpoint_tokens",
        "This token only fetches its endpoint's project zip and model and reports their staging.",
    ),
}


class TokenScopePermission(permissions.BasePermission):
    """What a token may do beyond what its user may: read-only tokens only read, machine
    tokens (run and endpoint tokens) only reach the views that say they accept their kind
    (``MACHINE_TOKEN_VIEWS``; such a view then holds the token to what holds it: its own run,
    its own endpoint), and a view that names a scope (``token_scope``, one of
    ``ApiToken.Scope``) is reached by the tokens that have it only: for a token that has it,
    that scope is what the token is for, so a read-only one may make that request too.
    Sessions are not tokens: they get what their user may."""

    def has_permission(self, request: Request, view: Any) -> bool:
        token = token_of(request)
        if token is None:
            return True
        if token.kind != ApiToken.Kind.USER:
            accepts, refusal = MACHINE_TOKEN_VIEWS.get(
                token.kind, ("", "This token reaches no route.")
            )
            if not accepts or not getattr(view, accepts, False):
                self.message = refusal
                return False
        needed: str | None = getattr(view, "token_scope", None)
        if needed is not None:
            if not token.has_scope(needed):
                self.message = (
                    f"This token does not have the {needed} scope; make a token with it (the "
                    f"API tokens page, or manage.py create_token --scope {needed})."
                )
                return False
            return True
        if token.read_only and request.method not in permissions.SAFE_METHODS:
            self.message = "This token is read-only."
            return False
        return True
