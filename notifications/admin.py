"""The platform team's view of webhooks and their delivery log: read-only (a workspace's
admins manage their webhooks; the log is a record). A webhook's secret is never shown."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator

from notifications.models import NotificationDelivery, Webhook
from portal.admin_site import ReadOnlyAdmin

# Never "secret": it signs deliveries and is shown nowhere.
WEBHOOK_FIELDS = (
    "workspace",
    "url",
    "events",
    "format",
    "created_at",
    "created_by_username",
    "failures_in_a_row",
    "resume_at",
    "log",
)

DELIVERY_FIELDS = (
    "workspace",
    "channel",
    "webhook",
    "user",
    "event",
    "key",
    "status",
    "count",
    "tries",
    "last_status_code",
    "last_error",
    "created_at",
    "last_tried_at",
    "next_try_at",
    "delivered_at",
    "given_up_at",
    "payload",
)


@admin.register(Webhook)
class WebhookAdmin(ReadOnlyAdmin):
    list_display = ["id", "workspace", "url", "events_display", "format", "created_at", "log"]
    list_filter = ["format"]
    search_fields = ["url", "workspace__slug"]
    list_select_related = ["workspace"]
    fields = WEBHOOK_FIELDS
    readonly_fields = WEBHOOK_FIELDS

    @admin.display(description="Events")
    def events_display(self, webhook: Webhook) -> str:
        return ", ".join(webhook.events) or "all"

    @admin.display(description="Delivery log")
    def log(self, webhook: Webhook) -> str:
        url = reverse("admin:notifications_notificationdelivery_changelist")
        return format_html('<a href="{}?webhook__id__exact={}">deliveries</a>', url, webhook.pk)


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    # Seven columns that fit a 1280 px window (fourteen put the last ones off the screen);
    # each entry's page has every field.
    list_display = [
        "id",
        "event",
        "recipient",
        "state",
        "last_answer",
        "created_at",
        "when",
    ]
    list_filter = ["channel", "event", "webhook"]
    list_select_related = ["webhook", "user"]
    search_fields = ["key", "last_error"]
    date_hierarchy = "created_at"
    show_full_result_count = False
    fields = DELIVERY_FIELDS
    readonly_fields = DELIVERY_FIELDS

    @admin.display(description="To", ordering="channel")
    def recipient(self, delivery: NotificationDelivery) -> str:
        if delivery.webhook is not None:
            return f"webhook {delivery.webhook}"
        return f"e-mail to {delivery.user}" if delivery.user is not None else delivery.channel

    @admin.display(description="Status")
    def state(self, delivery: NotificationDelivery) -> str:
        tries = f", {delivery.tries} tr{'y' if delivery.tries == 1 else 'ies'}"
        events = f", {delivery.count} events" if delivery.count > 1 else ""
        return f"{delivery.status}{tries if delivery.tries else ''}{events}"

    @admin.display(description="Last answer")
    def last_answer(self, delivery: NotificationDelivery) -> str:
        code = f"HTTP {delivery.last_status_code}" if delivery.last_status_code else ""
        error = Truncator(delivery.last_error).chars(120)
        return ": ".join(part for part in (code, error) if part) or "—"

    @admin.display(description="When")
    def when(self, delivery: NotificationDelivery) -> str:
        if delivery.delivered_at is not None:
            return f"delivered {_moment(delivery.delivered_at)}"
        if delivery.given_up_at is not None:
            return f"given up {_moment(delivery.given_up_at)}"
        return f"next try {_moment(delivery.next_try_at)}"


def _moment(moment: Any) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M")
