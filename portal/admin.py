"""The audit log in the admin: searchable, filterable, and read-only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from portal import audit
from portal.admin_site import ReadOnlyAdmin
from portal.audit_kinds import AuditKind, of_kind
from portal.models import AuditEvent

AUDIT_FIELDS = (
    "time",
    "actor_display",
    "action",
    "source",
    "workspace_slug",
    "object_type",
    "object_id",
    "object_repr",
    "change",
    "request_id",
    "remote_addr",
)
RECORDED_FIELDS = ("before_pretty", "after_pretty")


class KindFilter(admin.SimpleListFilter):
    """The audit list by kind (``portal.audit_kinds``): by default without run tokens and
    everyday sign-ins, which are most of a busy log."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind.value, kind.label) for kind in AuditKind if kind != AuditKind.NOT_ROUTINE]

    def queryset(self, request: HttpRequest, queryset: QuerySet[AuditEvent]) -> QuerySet[Any]:
        return of_kind(queryset, self.value() or AuditKind.NOT_ROUTINE)

    def choices(self, changelist: Any) -> Iterator[Any]:  # Django's choice dicts
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": AuditKind.NOT_ROUTINE.label,
        }
        for value, label in self.lookup_choices:
            yield {
                "selected": self.value() == str(value),
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    # Six columns that fit a 1280 px window; source and address are on each entry's page.
    list_display = [
        "time",
        "actor_display",
        "action",
        "what",
        "changed_fields",
        "workspace_slug",
    ]
    list_filter = [KindFilter, "action", "source", "object_type"]
    search_fields = ["actor_username", "object_repr", "workspace_slug", "request_id", "object_id"]
    date_hierarchy = "time"
    fieldsets = [
        (None, {"fields": AUDIT_FIELDS}),
        # The exact JSON as stored, for whoever needs more than the readable change above.
        ("As recorded", {"fields": RECORDED_FIELDS, "classes": ["collapse"]}),
    ]
    readonly_fields = AUDIT_FIELDS + RECORDED_FIELDS
    show_full_result_count = False

    @admin.display(description="Actor", ordering="actor_username")
    def actor_display(self, event: AuditEvent) -> str:
        return event.actor_username or "system"

    @admin.display(description="Object", ordering="object_type")
    def what(self, event: AuditEvent) -> str:
        return format_html('<span class="quiet">{}</span> {}', event.object_type, event.object_repr)

    @admin.display(description="Change")
    def change(self, event: AuditEvent) -> str:
        changes = audit.describe_changes(event)
        if not changes:
            return "—"
        lines = format_html_join(
            "\n", "{}: {}", ((change.field, change.text) for change in changes)
        )
        return format_html("<pre>{}</pre>", lines)

    @admin.display(description="Changed")
    def changed_fields(self, event: AuditEvent) -> str | None:
        if event.before is None or event.after is None:
            return None  # a create or a delete: all of its fields, shown on the entry
        return ", ".join(change.field for change in audit.describe_changes(event)) or None

    def _pretty(self, value: Any) -> str:
        if value is None:
            return "—"
        return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True))

    @admin.display(description="Before (JSON)")
    def before_pretty(self, event: AuditEvent) -> str:
        return self._pretty(event.before)

    @admin.display(description="After (JSON)")
    def after_pretty(self, event: AuditEvent) -> str:
        return self._pretty(event.after)
