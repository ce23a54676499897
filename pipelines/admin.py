"""The platform team's view of pipelines: every pipeline of every workspace with where it
stands, its stages (each with its run or endpoint, its gate's decision and why it waits) and
its history beside it. Read-only: a pipeline changes through its services (the API, its page,
``tau pipeline``), its history never."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from pipelines.models import Pipeline, PipelineEvent, PipelineStage
from portal.admin_site import ReadOnlyAdmin

PIPELINE_FIELDS = (
    "workspace",
    "name",
    "spec_name",
    "state",
    "state_reason",
    "cancel_requested_at",
    "rerun",
    "bundle",
    "folder",
    "created_by_username",
    "created_at",
    "updated_at",
    "ended_at",
    "source",
)
STAGE_FIELDS = (
    "position",
    "name",
    "state",
    "reason",
    "needs",
    "gate",
    "gate_decision",
    "metrics",
    "run",
    "endpoint",
    "started_at",
    "ended_at",
)
EVENT_FIELDS = ("seq", "time", "kind", "old_state", "new_state", "message", "data", "hash")


class _ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PipelineStageInline(_ReadOnlyInline):
    """Its stages, in the file's order."""

    model = PipelineStage
    fields = STAGE_FIELDS
    readonly_fields = STAGE_FIELDS
    ordering = ["position"]


class PipelineEventInline(_ReadOnlyInline):
    """Its history, in order."""

    model = PipelineEvent
    fields = EVENT_FIELDS
    readonly_fields = EVENT_FIELDS
    ordering = ["seq"]


@admin.register(Pipeline)
class PipelineAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "workspace",
        "name",
        "state",
        "created_by_username",
        "created_at",
        "ended_at",
    ]
    list_filter = ["state", "workspace"]
    search_fields = ["name", "spec_name", "workspace__slug", "created_by_username"]
    list_select_related = ["workspace"]
    ordering = ["-created_at"]
    fields = PIPELINE_FIELDS
    readonly_fields = PIPELINE_FIELDS
    inlines = [PipelineStageInline, PipelineEventInline]
