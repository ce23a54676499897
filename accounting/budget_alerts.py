"""Budget warnings: once a workspace has used 80% and then 100% of a month's GPU-hour budget,
its admins are told (``budget.threshold``), once each per budget and month.

Checked by beat every ``TAU_BUDGET_CHECK_SECONDS`` (running runs use hours without any event
happening), and whenever a run ends. The alert row and the notice are written in one
transaction; the row's unique constraint keeps two checks running at once from warning
twice, and a failed check leaves nothing behind, so the next one warns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounting.models import BudgetAlert
from portal.notices import Notice, announce
from runs import accounting
from workspaces.models import WorkspaceBudget

logger = logging.getLogger(__name__)

#: The shares of a budget at which its workspace's admins are warned, in percent.
THRESHOLDS = (80, 100)


@dataclass(frozen=True)
class Sent:
    budget_id: int
    threshold_percent: int


def check_budgets(*, now: datetime | None = None) -> list[Sent]:
    """Warn about every threshold passed this month and not yet warned about."""
    now = now or timezone.now()
    period = accounting.Period.containing(now)
    budgets = list(
        WorkspaceBudget.objects.unscoped().select_related("workspace", "flavor").order_by("pk")
    )
    if not budgets:
        return []
    warned = set(
        BudgetAlert.objects.unscoped()
        .filter(month=period.key)
        .values_list("budget_id", "threshold_percent")
    )
    usage = accounting.usage_in(
        period, workspace_ids={budget.workspace_id for budget in budgets}, now=now
    )
    by_workspace_flavor: dict[tuple[int, str], float] = {}
    for use in usage.uses:
        seconds = use.seconds_within(usage.since, usage.until)
        key = (use.workspace_id, use.flavor)
        by_workspace_flavor[key] = by_workspace_flavor.get(key, 0.0) + use.gpus * seconds / 3600
    sent = []
    for budget in budgets:
        if budget.flavor is None:
            used = usage.by_workspace[budget.workspace_id].gpu_hours
        else:
            used = by_workspace_flavor.get((budget.workspace_id, budget.flavor.name), 0.0)
        for threshold in THRESHOLDS:
            if (budget.pk, threshold) in warned:
                continue
            if used * 100 < float(budget.gpu_hours) * threshold:
                break  # not there yet; the higher one neither
            if _warn(budget, period, threshold, used):
                sent.append(Sent(budget.pk, threshold))
    return sent


def _warn(budget: WorkspaceBudget, period: accounting.Period, threshold: int, used: float) -> bool:
    workspace = budget.workspace
    scope = f" on {budget.flavor.name}" if budget.flavor else ""
    hours = f"{used:,.1f}".removesuffix(".0")
    limit = f"{budget.gpu_hours:,.1f}".removesuffix(".0")
    if threshold >= 100:
        title = (
            f"{workspace.name} has used its GPU-hour budget{scope} for {period.label}: "
            f"{hours} of {limit}"
        )
    else:
        title = (
            f"{workspace.name} has used {threshold}% of its GPU-hour budget{scope} for "
            f"{period.label}: {hours} of {limit}"
        )
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(
                budget=budget,
                month=period.key,
                threshold_percent=threshold,
                used_gpu_hours=Decimal(f"{used:.3f}"),
                budget_gpu_hours=budget.gpu_hours,
            )
            announce(
                Notice(
                    event="budget.threshold",
                    workspace_id=workspace.pk,
                    title=title,
                    key=f"budget:{budget.pk}:{period.key}:{threshold}",
                    data={
                        "workspace": workspace.slug,
                        "month": period.key,
                        "threshold_percent": threshold,
                        "flavor": budget.flavor.name if budget.flavor else "",
                        "used_gpu_hours": round(used, 3),
                        "budget_gpu_hours": float(budget.gpu_hours),
                        "hard_limit_gpu_hours": float(budget.hard_limit),
                        "over_limit": budget.over_limit,
                    },
                )
            )
    except IntegrityError:
        return False  # another check warned first
    logger.info("budget %s passed %d%% of %s", budget.pk, threshold, period.key)
    return True
