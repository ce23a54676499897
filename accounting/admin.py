"""The admin's usage: every workspace's GPU-, CPU- and memory-hours this month and where its
budgets stand, and the budget warnings sent. Read only: usage is what the runs used."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from accounting import reports
from accounting.hours import hours_text
from accounting.models import BudgetAlert, WorkspaceUsage
from portal.admin_site import ReadOnlyAdmin
from runs import budgets
from runs.accounting import LOST, Period, Totals, Usage, summarize

_month_usage: ContextVar[Usage | None] = ContextVar("month_usage", default=None)


def _hours(value: float) -> str:
    return hours_text(value)


@admin.register(WorkspaceUsage)
class WorkspaceUsageAdmin(ReadOnlyAdmin):
    """This month's use of each workspace (one read of the month's attempts for the list)."""

    list_display = ["slug", "name", "gpu_hours", "cpu_hours", "lost_gpu_hours", "budget", "page"]
    search_fields = ["slug", "name"]
    fields = ["slug", "name", "gpu_hours", "cpu_hours", "lost_gpu_hours", "budget", "page"]
    readonly_fields = ["slug", "name", "gpu_hours", "cpu_hours", "lost_gpu_hours", "budget", "page"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return WorkspaceUsage.unscoped_objects.all().prefetch_related("budgets__flavor")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self._load()
        return super().changelist_view(
            request, {**(extra_context or {}), "title": f"Usage in {self._period_label()}"}
        )

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        self._load()
        return super().change_view(request, object_id, form_url, extra_context)

    def _load(self) -> None:
        # The month's usage for this request's rows: per thread (one admin instance serves
        # every request), read once however many rows and columns show it.
        _month_usage.set(reports.platform_report(Period.containing(timezone.now())).usage)

    def _period_label(self) -> str:
        return Period.containing(timezone.now()).label

    def _totals(self, workspace: WorkspaceUsage) -> Totals:
        usage = _month_usage.get()
        if usage is None:
            return Totals()
        return usage.by_workspace.get(workspace.pk) or Totals()

    @admin.display(description="GPU-hours this month")
    def gpu_hours(self, workspace: WorkspaceUsage) -> str:
        return _hours(self._totals(workspace).gpu_hours)

    @admin.display(description="CPU-hours this month")
    def cpu_hours(self, workspace: WorkspaceUsage) -> str:
        return _hours(self._totals(workspace).cpu_hours)

    @admin.display(description="of which lost (failed, preempted)")
    def lost_gpu_hours(self, workspace: WorkspaceUsage) -> str:
        usage = _month_usage.get()
        if usage is None:
            return "0"
        lost = 0.0
        for use in usage.uses:
            if use.workspace_id == workspace.pk and use.outcome in LOST:
                lost += use.gpus * use.seconds_within(usage.since, usage.until)
        return _hours(lost / 3600)

    @admin.display(description="budgets")
    def budget(self, workspace: WorkspaceUsage) -> str:
        rows = list(workspace.budgets.all())
        usage = _month_usage.get()
        if not rows or usage is None:
            return "none"
        mine = [use for use in usage.uses if use.workspace_id == workspace.pk]
        per_workspace = summarize(mine, since=usage.since, until=usage.until)
        lines = budgets.lines_from_usage(rows, per_workspace)
        return "; ".join(
            f"{line.label}: {_hours(line.used_gpu_hours)} of {_hours(float(line.gpu_hours))}"
            + (" (past the hard limit)" if line.past_hard_limit else "")
            for line in lines
        )

    @admin.display(description="usage page")
    def page(self, workspace: WorkspaceUsage) -> str:
        return format_html(
            '<a href="{}">charts, by user and flavor, CSV</a>',
            reverse("workspace-usage", args=[workspace.slug]),
        )


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin):
    list_display = ["budget", "month", "threshold_percent", "used_gpu_hours", "sent_at"]
    list_filter = ["month", "threshold_percent"]
    list_select_related = ["budget__workspace", "budget__flavor"]

    def get_queryset(self, request: HttpRequest) -> Any:
        return BudgetAlert.objects.unscoped().select_related("budget__workspace", "budget__flavor")
