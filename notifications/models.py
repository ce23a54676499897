"""Webhooks, the deliveries of notifications (webhook POSTs and e-mails), and what each
person wants to be e-mailed about.

A :class:`NotificationDelivery` is an outbox row, like ``runs.models.Delivery``: written in
the transaction of the change it tells of, sent afterwards by a Celery worker, retried with
backoff a bounded number of times, and kept as the log the platform admin reads. A
:class:`Webhook` remembers how its endpoint has been doing (failures in a row, and until when
its deliveries wait), so that a failing endpoint is tried once per pause, not once per
delivery (``notifications.delivery``).
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models
from django.utils import timezone

from portal.tenancy import TenantModel


class PayloadFormat(models.TextChoices):
    JSON = "json", "TauGrid JSON"
    SLACK = "slack", "Slack-compatible (text and blocks)"


class Webhook(TenantModel):
    """An endpoint a workspace's admins want POSTed to when events happen.

    ``secret`` signs every delivery (``X-TauGrid-Signature``) and is write-only: it is kept
    to sign with, and never shown again, in the API, the pages, the admin or the logs."""

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.CASCADE, related_name="webhooks"
    )
    url = models.URLField(max_length=2000)
    secret = models.CharField(max_length=200)
    events = models.JSONField(default=list, blank=True, help_text="Empty: every event.")
    format = models.CharField(
        max_length=10, choices=PayloadFormat.choices, default=PayloadFormat.JSON
    )
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_by_username = models.CharField(max_length=150, blank=True)
    failures_in_a_row = models.PositiveIntegerField(
        default=0, help_text="Deliveries to this endpoint that failed since the last that worked."
    )
    resume_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="After failures, its deliveries wait until then (the pause doubles with each "
        "failure in a row).",
    )

    class Meta(TenantModel.Meta):
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.endpoint} (#{self.pk})"

    @property
    def endpoint(self) -> str:
        """Where it posts, without what may be a credential: its host, and its port when it
        is not the scheme's (a chat's incoming-webhook URL is a secret in its path)."""
        parts = urlsplit(self.url)
        try:
            port = parts.port
        except ValueError:
            port = None
        host = parts.hostname or "?"
        if ":" in host:
            host = f"[{host}]"
        if port is not None and port != {"http": 80, "https": 443}.get(parts.scheme):
            return f"{host}:{port}"
        return host


class NotificationDelivery(TenantModel):
    """One notification to one webhook or one person's e-mail address, and how sending it
    went: a delivery log row.

    Repeats of an event with the same ``key`` while this row is still waiting to be sent
    are folded into it (``count`` goes up, ``payload`` is the newest), so a flapping run or
    a storm of notices is one POST, not hundreds."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook", "Webhook"
        EMAIL = "email", "E-mail"

    workspace = models.ForeignKey(
        "workspaces.Workspace", on_delete=models.CASCADE, related_name="+"
    )
    channel = models.CharField(max_length=10, choices=Channel.choices)
    webhook = models.ForeignKey(
        Webhook, on_delete=models.CASCADE, null=True, blank=True, related_name="deliveries"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
    )
    event = models.CharField(max_length=40)
    key = models.CharField(max_length=200, blank=True)
    payload = models.JSONField(default=dict)
    count = models.PositiveIntegerField(default=1, help_text="Events folded into this one.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_tried_at = models.DateTimeField(null=True, blank=True)
    next_try_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    #: When a task to send it was last published and not yet taken (the reconciler does not
    #: publish it again meanwhile, so the queue never fills with repeats).
    published_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    given_up_at = models.DateTimeField(null=True, blank=True)

    class Meta(TenantModel.Meta):
        verbose_name = "notification delivery"
        verbose_name_plural = "notification deliveries"
        indexes = [
            models.Index(
                fields=["next_try_at"],
                name="notify_delivery_due",
                condition=models.Q(delivered_at__isnull=True, given_up_at__isnull=True),
            ),
            models.Index(fields=["webhook", "event", "key"], name="notify_delivery_coalesce"),
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.channel} ({self.status})"

    @property
    def status(self) -> str:
        """In words, for the log: delivered, given up, retrying (failed before), pending."""
        if self.delivered_at is not None:
            return "delivered"
        if self.given_up_at is not None:
            return "given up"
        if self.tries:
            return "retrying"
        return "pending"


class EmailPreference(models.Model):
    """What one person wants to be e-mailed about, everywhere. No row: the defaults
    (``notifications.events.DEFAULT_EMAIL_EVENTS``)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    events = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"e-mail preferences of {self.user_id}"


class NotifiedWait(TenantModel):
    """That a run's wait (from ``since``) was told of as ``run.waiting``: once per wait."""

    tenant_path: ClassVar[str | None] = "run__workspace"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    since = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta(TenantModel.Meta):
        constraints = [models.UniqueConstraint(fields=["run", "since"], name="notified_wait_once")]
