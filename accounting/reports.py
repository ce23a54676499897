"""A month's usage as the API, the pages and the CSV export give it: the same numbers,
from ``runs.accounting``, in the shapes each needs."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs import accounting, budgets
from runs.accounting import Outcome, Period, Totals, Usage
from runs.policy import BudgetLine
from workspaces.models import Workspace, WorkspaceBudget

OUTCOME_WORDS = {
    Outcome.RUNNING: "still running",
    Outcome.SUCCEEDED: "succeeded",
    Outcome.FAILED: "failed",
    Outcome.PREEMPTED: "preempted or evicted",
    Outcome.CANCELLED: "cancelled",
}


def period_from(text: str | None, *, now: datetime | None = None) -> Period:
    """The month asked for (``YYYY-MM``), or the current one; ``MonthRefused`` if malformed."""
    if not text:
        return Period.containing(now or timezone.now())
    return Period.parse(text)


def _rows(parts: dict[Any, Totals], name: str) -> list[dict[str, Any]]:
    ordered = sorted(parts.items(), key=lambda item: (-item[1].gpu_seconds, str(item[0])))
    return [{name: str(key), **totals.as_dict()} for key, totals in ordered]


def _day_totals(by_day: dict[date, dict[Any, Totals]], day: date) -> Totals:
    total = Totals()
    for part in by_day.get(day, {}).values():
        total.gpu_seconds += part.gpu_seconds
        total.cpu_seconds += part.cpu_seconds
        total.memory_gib_seconds += part.memory_gib_seconds
    return total


@dataclass
class WorkspaceReport:
    workspace: Workspace
    period: Period
    usage: Usage
    budgets: list[BudgetLine]
    now: datetime

    @property
    def current(self) -> bool:
        return self.period.start <= self.now < self.period.end

    def outcome_rows(self) -> list[dict[str, Any]]:
        return [
            {"outcome": outcome.value, "words": OUTCOME_WORDS[outcome], **totals.as_dict()}
            for outcome, totals in sorted(
                self.usage.by_outcome.items(), key=lambda item: -item[1].gpu_seconds
            )
        ]

    def as_dict(self) -> dict[str, Any]:
        usage = self.usage
        return {
            "workspace": self.workspace.slug,
            "month": self.period.key,
            "time_zone": settings.TAU_ACCOUNTING_TIME_ZONE,
            "start": self.period.start.isoformat(),
            "end": self.period.end.isoformat(),
            "counted_until": usage.until.isoformat(),
            **usage.total.as_dict(),
            "lost": usage.lost().as_dict(),
            "by_user": _rows(usage.by_user, "user"),
            "by_flavor": _rows(usage.by_flavor, "flavor"),
            "by_outcome": [
                {key: value for key, value in row.items() if key != "words"}
                for row in self.outcome_rows()
            ],
            "by_day": [
                {"date": day.isoformat(), **_day_totals(usage.by_day_user, day).as_dict()}
                for day in self.period.days()
                if day in usage.by_day_user
            ],
            "budgets": [
                {
                    "flavor": line.label,
                    "used_gpu_hours": round(line.used_gpu_hours, 3),
                    "gpu_hours": float(line.gpu_hours),
                    "hard_limit_gpu_hours": float(line.hard_limit),
                    "left_gpu_hours": round(line.left_gpu_hours, 3),
                    "over_limit": line.over_limit,
                }
                for line in self.budgets
            ],
        }

    def chart(self) -> dict[str, Any]:
        """GPU-hours per day, one series per user (the page's Plotly chart)."""
        days = self.period.days()
        users = [row["user"] for row in _rows(self.usage.by_user, "user")]
        return {
            "days": [day.isoformat() for day in days],
            "series": [
                {
                    "name": user,
                    "gpu_hours": [
                        round(self.usage.by_day_user.get(day, {}).get(user, Totals()).gpu_hours, 3)
                        for day in days
                    ],
                }
                for user in users
            ],
            "flavors": _rows(self.usage.by_flavor, "flavor"),
        }


def workspace_report(
    workspace: Workspace, period: Period, *, now: datetime | None = None
) -> WorkspaceReport:
    now = now or timezone.now()
    usage = accounting.usage_in(period, workspace_ids=[workspace.pk], now=now)
    standing = budgets.lines_from_usage(
        list(WorkspaceBudget.objects.for_workspace(workspace).select_related("flavor")), usage
    )
    return WorkspaceReport(workspace, period, usage, standing, now)


@dataclass
class PlatformReport:
    period: Period
    usage: Usage
    workspaces: dict[int, Workspace]

    def _by_gpu_hours(self) -> list[tuple[int, Totals]]:
        return sorted(self.usage.by_workspace.items(), key=lambda item: -item[1].gpu_seconds)

    def _slug(self, workspace_id: int) -> str:
        workspace = self.workspaces.get(workspace_id)
        return workspace.slug if workspace else str(workspace_id)

    def workspace_rows(self) -> list[dict[str, Any]]:
        rows = []
        for workspace_id, totals in self._by_gpu_hours():
            workspace = self.workspaces.get(workspace_id)
            rows.append(
                {
                    "workspace": self._slug(workspace_id),
                    "name": workspace.name if workspace else "",
                    **totals.as_dict(),
                }
            )
        return rows

    def chart(self) -> dict[str, Any]:
        days = self.period.days()
        return {
            "days": [day.isoformat() for day in days],
            "series": [
                {
                    "name": self._slug(workspace_id),
                    "gpu_hours": [
                        round(
                            self.usage.by_day_workspace.get(day, {})
                            .get(workspace_id, Totals())
                            .gpu_hours,
                            3,
                        )
                        for day in days
                    ],
                }
                for workspace_id, _totals in self._by_gpu_hours()
            ],
            "flavors": _rows(self.usage.by_flavor, "flavor"),
        }


def platform_report(period: Period, *, now: datetime | None = None) -> PlatformReport:
    usage = accounting.usage_in(period, workspace_ids=None, now=now)
    workspaces = Workspace.unscoped_objects.in_bulk(list(usage.by_workspace))
    return PlatformReport(period, usage, workspaces)


@dataclass(frozen=True)
class MonthLine:
    period: Period
    totals: Totals
    lost_gpu_hours: float


def months_before(
    period: Period,
    *,
    workspace_ids: list[int] | None,
    count: int = 12,
    now: datetime | None = None,
    created: datetime | None = None,
) -> list[MonthLine]:
    """The ``count`` months up to ``period``, newest first (one read of their attempts).
    ``created``: when the workspace (or, for the platform, the first one) was created; the
    months before it that have no use are left out, so a new workspace is not shown a year
    of zeros. ``period`` itself is always there."""
    now = now or timezone.now()
    periods = [period]
    while len(periods) < count:
        periods.append(periods[-1].previous())
    since, until = periods[-1].start, min(period.end, now)
    uses = (
        accounting.attempt_uses(workspace_ids=workspace_ids, since=since, until=until)
        if since < until
        else []
    )
    lines = []
    for month in periods:
        month_until = min(month.end, now)
        totals = Totals()
        lost = 0.0
        for use in uses:
            seconds = use.seconds_within(month.start, month_until)
            if seconds > 0:
                totals.add(use, seconds)
                if use.outcome in accounting.LOST:
                    lost += use.gpus * seconds / 3600
        lines.append(MonthLine(month, totals, lost))
    if created is not None:
        while len(lines) > 1 and lines[-1].period.end <= created and _unused(lines[-1].totals):
            lines.pop()
    return lines


def _unused(totals: Totals) -> bool:
    return not (totals.gpu_seconds or totals.cpu_seconds or totals.memory_gib_seconds)


CSV_COLUMNS = [
    "workspace",
    "run",
    "attempt",
    "user",
    "flavor",
    "outcome",
    "start",
    "end",
    "gpus",
    "gpu_hours",
    "cpu_hours",
    "memory_gib_hours",
]


def csv_lines(usage: Usage, slugs: dict[int, str]) -> Iterator[str]:
    """One row per attempt, its part of the period (an attempt over a month's end is split:
    each month's export has its own part, and the parts add up)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def flush() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writerow(CSV_COLUMNS)
    yield flush()
    for use in usage.uses:
        start = max(use.start, usage.since)
        end = min(use.end or usage.until, usage.until)
        seconds = use.seconds_within(usage.since, usage.until)
        part = Totals()
        part.add(use, seconds)
        writer.writerow(
            [
                slugs.get(use.workspace_id, use.workspace_id),
                use.run_name,
                use.number,
                use.user,
                use.flavor,
                use.outcome.value,
                start.isoformat(),
                end.isoformat(),
                use.gpus,
                *(f"{value:.4f}" for value in part.as_dict().values()),
            ]
        )
        yield flush()


def csv_text(usage: Usage, slugs: dict[int, str]) -> str:
    return "".join(csv_lines(usage, slugs))
