"""Identity's models: OpenID Connect identities and API tokens."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone


class OIDCIdentity(models.Model):
    """Links a user to an identity at an OpenID provider: the (issuer, subject) pair.

    Users are matched by this pair only, never by e-mail or username, so a changed e-mail at
    the provider, or a look-alike account elsewhere, cannot take over someone's account.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "portal_oidcidentity"  # created by the portal app, before identity had its own
        verbose_name = "OpenID Connect identity"
        verbose_name_plural = "OpenID Connect identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class ApiToken(models.Model):
    """A credential for scripts and the CLI: ``tau_<key>_<secret>``.

    Only an HMAC-SHA256 of the secret, keyed with a numbered server-side pepper, is stored;
    the secret itself is shown once. A token is limited to one workspace or all of its user's
    workspaces, may be read-only, always expires, and can never do more than its user can do
    at the moment it is used. ``kind`` says what it is: a person's token, or a machine token
    that reaches only the routes of what holds it: a run token (held by the attempt it was
    issued for, ``runs.RunAttempt.token``: that run's reports, bundle and data) or an endpoint
    token (held by its endpoint, ``serving.Endpoint.token``: that endpoint's project zip,
    model files and staging report). A view says which machine tokens it accepts
    (``accepts_run_tokens``, ``accepts_endpoint_tokens``); every other view refuses them.

    ``scopes`` are what a token may do beyond what every token may: each names one kind of
    request that no token makes without it (:class:`Scope`). A token without scopes (every
    token made before there were any) does exactly what it did before; a route that needs a
    scope says so (``token_scope`` on its view, checked by ``TokenScopePermission``).
    """

    class Kind(models.TextChoices):
        USER = "user", "User token"
        RUN = "run", "Run token"
        ENDPOINT = "endpoint", "Endpoint token"

    class Scope(models.TextChoices):
        #: Send requests to the workspace's endpoints through the portal's proxy route
        #: (``…/endpoints/{name}/invoke/{path}``); also with a read-only token.
        ENDPOINTS_INVOKE = "endpoints:invoke", "Invoke endpoints"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, help_text="What it is for, e.g. 'laptop CLI'.")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.USER)
    key = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    pepper_id = models.PositiveSmallIntegerField(editable=False)
    workspace = models.ForeignKey(
        "workspaces.Workspace",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
        help_text="Empty: every workspace the user belongs to.",
    )
    read_only = models.BooleanField(default=False)
    scopes = models.JSONField(
        default=list,
        blank=True,
        help_text="What it may do beyond what every token may, e.g. ['endpoints:invoke'].",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "portal_apitoken"  # created by the portal app, before identity had its own
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["user", "-created_at"], name="apitoken_user_created")]

    def __str__(self) -> str:
        return f"{self.name} (tau_{self.key}_…)"

    @property
    def display_prefix(self) -> str:
        return f"tau_{self.key}_…"

    def is_expired(self, now: datetime | None = None) -> bool:
        return self.expires_at <= (now or timezone.now())

    def has_scope(self, scope: str) -> bool:
        return isinstance(self.scopes, list) and scope in self.scopes

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired()
