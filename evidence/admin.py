"""The platform team's view of sealing: every seal request with where it stands, the ones
that failed or were given up first to find (the "Status" filter), and "Seal again" for those
given up once their cause is fixed. Read-only otherwise: a request and a record are the
portal's own bookkeeping, changed by sealing alone."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.text import Truncator

from evidence import sealing
from evidence.models import SealRequest
from portal.admin_site import ReadOnlyAdmin

FIELDS = (
    "run",
    "terminal_seq",
    "attempt_count",
    "status",
    "tries",
    "last_error",
    "created_at",
    "next_try_at",
    "claimed_at",
    "sealed_at",
    "given_up_at",
)


def status_of(request: SealRequest) -> str:
    """Where a request stands, in the words the run page uses."""
    if request.sealed_at is not None:
        return "sealed"
    if request.given_up_at is not None:
        return "could not be sealed (given up)"
    if request.last_error and request.tries:
        return f"failing (try {request.tries} of {sealing.MAX_TRIES})"
    return "sealing"


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("given-up", "Could not be sealed"),
            ("failing", "Failing, tried again"),
            ("pending", "Not sealed yet"),
            ("sealed", "Sealed"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        unsealed = Q(sealed_at__isnull=True)
        match self.value():
            case "given-up":
                return queryset.filter(unsealed, given_up_at__isnull=False)
            case "failing":
                return queryset.filter(unsealed, given_up_at__isnull=True, tries__gt=0).exclude(
                    last_error=""
                )
            case "pending":
                return queryset.filter(unsealed, given_up_at__isnull=True)
            case "sealed":
                return queryset.filter(sealed_at__isnull=False)
        return queryset


@admin.register(SealRequest)
class SealRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "run_display", "terminal_seq", "status", "tries", "error", "created_at"]
    list_filter = [StatusFilter]
    search_fields = ["run__name", "run__workspace__slug", "last_error"]
    list_select_related = ["run__workspace"]
    ordering = ["-created_at"]
    fields = FIELDS
    readonly_fields = FIELDS
    actions = ["seal_again"]

    @admin.display(description="Run", ordering="run__name")
    def run_display(self, request: SealRequest) -> str:
        return f"{request.run.workspace.slug}/{request.run.name}"

    @admin.display(description="Status")
    def status(self, request: SealRequest) -> str:
        return status_of(request)

    @admin.display(description="Last error")
    def error(self, request: SealRequest) -> str:
        return Truncator(request.last_error).chars(120)

    @admin.action(description="Seal again (those that could not be sealed)")
    def seal_again(self, request: HttpRequest, queryset: QuerySet[SealRequest]) -> None:
        count = sealing.seal_again(
            request_ids=list(queryset.values_list("pk", flat=True)), by=request.user
        )
        if count:
            self.message_user(
                request,
                f"Sealing again {count} record(s); the run pages show the outcome in a minute.",
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request,
                "None of those had been given up; nothing was changed.",
                messages.WARNING,
            )
