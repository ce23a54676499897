"""How much of its quota a workspace uses now, and when a waiting run may start.

For the local backend, use is the sum of what admitted and running runs asked for, against
the workspace's quota on the machine's flavor. The start estimate is computed from the
queue's own recent history: how often runs were admitted lately, times the run's position.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from runs.models import Run, RunState
from tau.quantity import format_quantity
from tau.spec import Spec
from workspaces.models import Workspace, WorkspaceQuota

ACTIVE_STATES = (RunState.ADMITTED, RunState.RUNNING, RunState.CANCELLING)
HISTORY_SIZE = 50
HISTORY_WINDOW = timedelta(days=7)


def demand(run: Run) -> dict[str, Decimal]:
    """What a run holds while it is admitted: its workers' GPUs, CPUs and memory."""
    spec = Spec.from_dict(run.spec)
    from runs.policy import requested_totals

    return requested_totals(spec)


@dataclass(frozen=True)
class UsageLine:
    flavor: str
    gpu_model: str
    resource: str
    used: Decimal
    nominal: Decimal
    borrowing_limit: Decimal | None
    in_cohort: bool

    def _fmt(self, value: Decimal) -> str:
        return format_quantity(value, binary=self.resource == "memory")

    @property
    def used_display(self) -> str:
        return self._fmt(self.used)

    @property
    def nominal_display(self) -> str:
        return self._fmt(self.nominal)

    @property
    def borrowed(self) -> Decimal:
        return max(Decimal(0), self.used - self.nominal)

    @property
    def borrowed_display(self) -> str:
        return self._fmt(self.borrowed)

    @property
    def percent(self) -> int:
        """Share of the nominal quota in use, capped at 100 for drawing the bar."""
        if self.nominal <= 0:
            return 100 if self.used > 0 else 0
        return int(min(Decimal(100), self.used * 100 / self.nominal))


def active_runs(workspace: Workspace) -> QuerySet[Run]:
    return Run.objects.for_workspace(workspace).filter(state__in=ACTIVE_STATES)


def usage_lines(workspace: Workspace) -> list[UsageLine]:
    quotas = (
        WorkspaceQuota.objects.for_workspace(workspace)
        .select_related("flavor", "workspace")
        .order_by("flavor__name", "resource")
    )
    return _lines(list(active_runs(workspace).only("spec")), list(quotas))


def platform_usage() -> dict[int, list[UsageLine]]:
    """Every workspace's use against quota, for platform staff, in two queries."""
    runs = list(Run.objects.unscoped().filter(state__in=ACTIVE_STATES).only("workspace_id", "spec"))
    quotas = (
        WorkspaceQuota.objects.unscoped()
        .select_related("flavor", "workspace")
        .order_by("workspace__slug", "flavor__name", "resource")
    )
    by_workspace: dict[int, list[WorkspaceQuota]] = {}
    for quota in quotas:
        by_workspace.setdefault(quota.workspace_id, []).append(quota)
    return {
        workspace_id: _lines([r for r in runs if r.workspace_id == workspace_id], rows)
        for workspace_id, rows in by_workspace.items()
    }


def _lines(runs: list[Run], quotas: list[WorkspaceQuota]) -> list[UsageLine]:
    used: dict[str, Decimal] = {}
    for run in runs:
        for resource, amount in demand(run).items():
            used[resource] = used.get(resource, Decimal(0)) + amount
    lines = []
    for quota in quotas:
        # Local runs use the machine's flavor; on Kubernetes, use is read from Kueue instead.
        in_use = (
            used.get(quota.resource, Decimal(0))
            if quota.flavor.name == settings.TAU_LOCAL_FLAVOR
            else Decimal(0)
        )
        lines.append(
            UsageLine(
                flavor=quota.flavor.name,
                gpu_model=quota.flavor.gpu_model,
                resource=quota.resource,
                used=in_use,
                nominal=quota.nominal,
                borrowing_limit=quota.borrowing_limit,
                in_cohort=quota.workspace.cohort_id is not None,
            )
        )
    return lines


@dataclass(frozen=True)
class QueueEstimate:
    admissions: int
    interval: timedelta | None  # typical time between two admissions
    wait: timedelta | None  # typical time from queued to admitted

    def start_after(self, position: int | None) -> timedelta | None:
        if position is None or self.interval is None:
            return None
        return self.interval * position

    @property
    def explanation(self) -> str:
        if self.interval is None:
            return (
                "No estimate yet: it needs at least two admissions in this workspace in the "
                "last 7 days."
            )
        return (
            f"Estimated from the last {self.admissions} admissions in this workspace (7 days): "
            f"a run was admitted about every {humanize(self.interval)} (median), so position "
            f"N starts in roughly N x {humanize(self.interval)}."
        )


def queue_estimate(workspace: Workspace, *, now: datetime | None = None) -> QueueEstimate:
    now = now or timezone.now()
    recent = list(
        Run.objects.for_workspace(workspace)
        .filter(admitted_at__gte=now - HISTORY_WINDOW)
        .order_by("-admitted_at")
        .values_list("admitted_at", "queued_at")[:HISTORY_SIZE]
    )
    times = sorted(admitted for admitted, _ in recent if admitted is not None)
    waits = [
        admitted - queued
        for admitted, queued in recent
        if admitted and queued and admitted >= queued
    ]
    if len(times) < 2:
        return QueueEstimate(admissions=len(times), interval=None, wait=_median(waits))
    gaps = [later - earlier for earlier, later in pairwise(times)]
    return QueueEstimate(admissions=len(times), interval=_median(gaps), wait=_median(waits))


def _median(values: list[timedelta]) -> timedelta | None:
    if not values:
        return None
    return timedelta(seconds=statistics.median(v.total_seconds() for v in values))


def humanize(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{max(seconds, 1)} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
