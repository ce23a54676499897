"""JSON shapes of webhooks in the REST API. The secret goes in, never out."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from rest_framework import serializers

from notifications.events import EVENT_NAMES, EVENTS, unknown_events, unknown_events_message
from notifications.models import PayloadFormat, Webhook
from notifications.services import SECRET_MAX_LENGTH, SECRET_MIN_LENGTH

EVENT_HELP = "; ".join(f"`{name}`: {words}" for name, words in EVENTS.items())


class WebhookSerializer(serializers.ModelSerializer[Webhook]):
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=list(EVENT_NAMES)),
        read_only=True,
        help_text=f"The events it gets; empty: all of them. {EVENT_HELP}",
    )
    created_by = serializers.CharField(source="created_by_username", read_only=True)
    url_path = serializers.SerializerMethodField(
        help_text="This webhook in the API (DELETE it there)."
    )

    class Meta:
        model = Webhook
        fields = ["id", "url", "events", "format", "created_at", "created_by", "url_path"]
        read_only_fields = fields

    def get_url_path(self, webhook: Webhook) -> str:
        return reverse(
            "api:webhook-detail",
            kwargs={"workspace_slug": self.context["workspace_slug"], "webhook_id": webhook.pk},
        )


class _EventsField(serializers.ListField):
    """A list of event names, refused with the list of the right ones when one is wrong."""

    child = serializers.ChoiceField(choices=list(EVENT_NAMES))

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, list) and all(isinstance(name, str) for name in data):
            unknown = unknown_events(data)
            if unknown:
                raise serializers.ValidationError(unknown_events_message(unknown))
        names: list[str] = super().to_internal_value(data)
        return names


class WebhookCreateSerializer(serializers.Serializer[Any]):
    url = serializers.URLField(
        max_length=2000,
        help_text="Where to POST: http(s), a public address. Redirects are not followed.",
    )
    secret = serializers.CharField(
        min_length=SECRET_MIN_LENGTH,
        max_length=SECRET_MAX_LENGTH,
        write_only=True,
        trim_whitespace=False,
        help_text="Signs every delivery (`X-TauGrid-Signature`). Write-only: never shown again.",
    )
    events = _EventsField(
        required=False,
        default=list,
        help_text=f"Empty or left out: all events. One of {', '.join(EVENT_NAMES)} each.",
    )
    format = serializers.ChoiceField(
        choices=PayloadFormat.choices,
        default=PayloadFormat.JSON,
        help_text="`json`: TauGrid's payload; `slack`: a Slack-compatible `text` and `blocks`.",
    )
