"""Usage pages: a workspace's month (its members) and every workspace's (platform staff),
with charts, tables and a CSV export of the same numbers (``accounting.reports``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Min
from django.http import Http404, HttpRequest, StreamingHttpResponse
from django.utils import timezone
from django.views import View
from django.views.generic import TemplateView

from accounting import reports
from runs.accounting import MonthRefused, Period
from workspaces.access import StaffRequiredMixin, WorkspaceViewMixin
from workspaces.models import Workspace

#: Months offered in the month picker (this one and the ones before it).
PICKER_MONTHS = 12


def _period(request: HttpRequest) -> Period:
    try:
        return reports.period_from(request.GET.get("month"))
    except MonthRefused as exc:
        raise Http404(str(exc)) from None


def _months(now_period: Period, since: datetime | None) -> list[Period]:
    """This month and the ones before it, back to the month ``since`` falls in (the
    workspace's creation, or the first workspace's): a new workspace is offered no year of
    empty months."""
    months = [now_period]
    while len(months) < PICKER_MONTHS and (since is None or months[-1].start > since):
        months.append(months[-1].previous())
    return months


def _month_context(period: Period, since: datetime | None) -> dict[str, Any]:
    current = Period.containing(timezone.now())
    months = _months(current, since)
    if period not in months:
        months.append(period)  # an older month asked for by its address is still shown
    return {
        "period": period,
        "months": months,
        "previous": period.previous(),
        "next": period.next() if period.next().start <= timezone.now() else None,
    }


class WorkspaceUsageView(WorkspaceViewMixin, TemplateView):
    template_name = "accounting/workspace.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        period = _period(self.request)
        report = reports.workspace_report(self.workspace, period)
        since = self.workspace.created_at
        context.update(_month_context(period, since))
        context.update(
            {
                "report": report,
                "history": reports.months_before(
                    period, workspace_ids=[self.workspace.pk], created=since
                ),
                "data": report.as_dict(),
                "chart": report.chart(),
                "outcomes": report.outcome_rows(),
            }
        )
        return context


def _csv_response(lines: Any, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


class WorkspaceUsageCsvView(WorkspaceViewMixin, View):
    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> StreamingHttpResponse:
        period = _period(request)
        report = reports.workspace_report(self.workspace, period)
        return _csv_response(
            reports.csv_lines(report.usage, {self.workspace.pk: self.workspace.slug}),
            f"taugrid-usage-{self.workspace.slug}-{period.key}.csv",
        )


def _first_workspace_created() -> datetime | None:
    # unscoped(): the platform's usage spans every workspace.
    first: datetime | None = Workspace.objects.unscoped().aggregate(first=Min("created_at"))[
        "first"
    ]
    return first


class PlatformUsageView(StaffRequiredMixin, TemplateView):
    template_name = "accounting/platform.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        period = _period(self.request)
        report = reports.platform_report(period)
        since = _first_workspace_created()
        context.update(_month_context(period, since))
        context.update(
            {
                "report": report,
                "history": reports.months_before(period, workspace_ids=None, created=since),
                "rows": report.workspace_rows(),
                "total": report.usage.total.as_dict(),
                "lost": report.usage.lost().as_dict(),
                "flavors": report.chart()["flavors"],
                "chart": report.chart(),
            }
        )
        return context


class PlatformUsageCsvView(StaffRequiredMixin, View):
    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> StreamingHttpResponse:
        period = _period(request)
        report = reports.platform_report(period)
        slugs = {pk: workspace.slug for pk, workspace in report.workspaces.items()}
        return _csv_response(
            reports.csv_lines(report.usage, slugs), f"taugrid-usage-{period.key}.csv"
        )
