"""The platform team's view of endpoints: every endpoint of every workspace with where it
stands, its history beside it, and its outbox rows. Read-only: an endpoint changes through
its services (the API), its history never."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal.admin_site import ReadOnlyAdmin
from serving.models import Endpoint, EndpointDelivery, EndpointEvent

ENDPOINT_FIELDS = (
    "workspace",
    "name",
    "state",
    "state_reason",
    "backend",
    "generation",
    "replicas_desired",
    "replicas_ready",
    "url",
    "model_version",
    "model_asked",
    "spec_hash",
    "bundle",
    "priority",
    "requests_per_second",
    "latency_p95_ms",
    "error_rate",
    "metrics_at",
    "created_by_username",
    "created_at",
    "updated_at",
    "deleted_at",
    "spec",
    "spec_source",
)

EVENT_FIELDS = ("seq", "time", "kind", "old_state", "new_state", "message", "data", "hash")


class EndpointEventInline(admin.TabularInline):  # type: ignore[type-arg]
    """The endpoint's history, in order; never changed here."""

    model = EndpointEvent
    fields = EVENT_FIELDS
    readonly_fields = EVENT_FIELDS
    ordering = ["seq"]
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "workspace",
        "name",
        "state",
        "backend",
        "generation",
        "replicas",
        "created_by_username",
        "created_at",
        "deleted_at",
    ]
    list_filter = ["state", "backend"]
    search_fields = ["name", "workspace__slug", "created_by_username"]
    list_select_related = ["workspace"]
    ordering = ["-created_at"]
    fields = ENDPOINT_FIELDS
    readonly_fields = ENDPOINT_FIELDS
    inlines = [EndpointEventInline]

    @admin.display(description="Replicas (ready/desired)")
    def replicas(self, endpoint: Endpoint) -> str:
        return f"{endpoint.replicas_ready}/{endpoint.replicas_desired}"


DELIVERY_FIELDS = (
    "endpoint",
    "action",
    "generation",
    "tries",
    "last_error",
    "created_at",
    "next_try_at",
    "claimed_at",
    "delivered_at",
    "given_up_at",
)


@admin.register(EndpointDelivery)
class EndpointDeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "endpoint", "action", "generation", "tries", "created_at", "delivered_at"]
    list_filter = ["action"]
    search_fields = ["endpoint__name", "endpoint__workspace__slug", "last_error"]
    list_select_related = ["endpoint"]
    ordering = ["-created_at"]
    fields = DELIVERY_FIELDS
    readonly_fields = DELIVERY_FIELDS
