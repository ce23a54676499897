"""The platform team's view of endpoints: every endpoint of every workspace with where it
stands (idle ones flagged and filtered: ``serving.selectors.idle_q``), its history beside it,
and its outbox rows. Read-only: an endpoint changes through its services (the API, its
page), its history never."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.admin_site import ReadOnlyAdmin
from serving.models import Endpoint, EndpointDelivery, EndpointEvent
from serving.selectors import with_idle

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
    "last_request_at",
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


class IdleFilter(admin.SimpleListFilter):
    """Running endpoints no request has reached for ``TAU_ENDPOINT_IDLE_HOURS`` hours."""

    title = "idle"
    parameter_name = "idle"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        hours = settings.TAU_ENDPOINT_IDLE_HOURS
        return [("yes", f"Idle ({hours} h without requests)"), ("no", "Not idle")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # The admin's queryset says ``idle`` of each row (EndpointAdmin.get_queryset).
        if self.value() == "yes":
            return queryset.filter(idle=True)
        if self.value() == "no":
            return queryset.filter(idle=False)
        return queryset


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "workspace",
        "name",
        "state",
        "idle",
        "backend",
        "generation",
        "replicas",
        "last_request_at",
        "created_by_username",
        "created_at",
        "deleted_at",
    ]
    list_filter = ["state", IdleFilter, "backend", "workspace"]
    search_fields = ["name", "workspace__slug", "created_by_username"]
    list_select_related = ["workspace"]
    ordering = ["-created_at"]
    fields = ENDPOINT_FIELDS
    readonly_fields = ENDPOINT_FIELDS
    inlines = [EndpointEventInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return with_idle(super().get_queryset(request))

    @admin.display(description="Idle", boolean=True)
    def idle(self, endpoint: Endpoint) -> bool:
        return bool(getattr(endpoint, "idle", False))

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
