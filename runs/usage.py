"""How much of its quota a workspace uses now, and when a waiting run may start.

Use comes from the backends: each says what its runs hold of each workspace's quota, by
flavor and resource (the local executor: what its admitted and running runs asked for, on
the machine's flavor); on a cluster (``TAU_BACKEND=kubernetes``) Kueue says, from the
workspaces' ClusterQueues (the Kubernetes backend asks ``executors.kubernetes.kueue_usage``). The
start estimate is computed from the queue's own recent history: how often runs were admitted
lately, times the run's position.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise

from django.utils import timezone

from runs.backends import QuotaUse
from runs.backends.registry import available_backends
from runs.models import Run
from runs.wording import duration_words
from tau.quantity import format_quantity
from workspaces.models import Workspace, WorkspaceQuota

HISTORY_SIZE = 50
HISTORY_WINDOW = timedelta(days=7)


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
        """Use above the nominal quota: borrowed from the cohort, or (outside a cohort) held
        since the quota was lowered — Kueue lets admitted runs finish; new ones wait."""
        return max(Decimal(0), self.used - self.nominal)

    @property
    def over_quota(self) -> bool:
        return not self.in_cohort and self.used > self.nominal

    @property
    def borrowed_display(self) -> str:
        return self._fmt(self.borrowed)

    @property
    def percent(self) -> int:
        """Share of the nominal quota in use, capped at 100 for drawing the bar."""
        if self.nominal <= 0:
            return 100 if self.used > 0 else 0
        return int(min(Decimal(100), self.used * 100 / self.nominal))


def _in_use(workspace_ids: Collection[int] | None) -> dict[int, QuotaUse]:
    """What every backend's runs hold, per workspace, added up (on a cluster, what Kueue has
    reserved for each workspace's ClusterQueue: the Kubernetes backend's answer)."""
    total: dict[int, QuotaUse] = {}
    for backend in available_backends():
        for workspace_id, use in backend.quota_in_use(workspace_ids).items():
            line = total.setdefault(workspace_id, {})
            for key, amount in use.items():
                line[key] = line.get(key, Decimal(0)) + amount
    return total


def usage_lines(workspace: Workspace) -> list[UsageLine]:
    quotas = (
        WorkspaceQuota.objects.for_workspace(workspace)
        .select_related("flavor", "workspace")
        .order_by("flavor__name", "resource")
    )
    return _lines(_in_use([workspace.pk]).get(workspace.pk, {}), list(quotas))


def platform_usage() -> dict[int, list[UsageLine]]:
    """Every workspace's use against quota, for platform staff: one query for the quotas,
    and what each backend needs to say what its runs hold."""
    quotas = (
        WorkspaceQuota.objects.unscoped()
        .select_related("flavor", "workspace")
        .order_by("workspace__slug", "flavor__name", "resource")
    )
    by_workspace: dict[int, list[WorkspaceQuota]] = {}
    for quota in quotas:
        by_workspace.setdefault(quota.workspace_id, []).append(quota)
    used = _in_use(None)
    return {
        workspace_id: _lines(used.get(workspace_id, {}), rows)
        for workspace_id, rows in by_workspace.items()
    }


def _lines(used: QuotaUse, quotas: list[WorkspaceQuota]) -> list[UsageLine]:
    return [
        UsageLine(
            flavor=quota.flavor.name,
            gpu_model=quota.flavor.gpu_model,
            resource=quota.resource,
            used=used.get((quota.flavor.name, quota.resource), Decimal(0)),
            nominal=quota.nominal,
            borrowing_limit=quota.borrowing_limit,
            in_cohort=quota.workspace.cohort_id is not None,
        )
        for quota in quotas
    ]


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
        every = duration_words(self.interval)
        return (
            f"Estimated from the last {self.admissions} admissions in this workspace (7 days): "
            f"a run was admitted about every {every} (median), so each place ahead in the "
            f"queue adds about {every}."
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
