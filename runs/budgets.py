"""GPU-hour budgets at submission: what a run may cost, and what a budget past its hard limit
does to a new GPU run — refuse it, submit it at the workspace's lowest priority, or allow it.

A budget never stops a run that is running: it is applied to new submissions only (resumes
and retries of a run already accepted are not new runs). The numbers come from
``runs.accounting``, the same as the usage pages, so what a refusal says is what the page
shows.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from runs import accounting
from runs.policy import BudgetLine, Cost, Placement, PolicyProblem, PolicyRefused
from tau.k8s_names import GPU_RESOURCE
from tau.spec import Spec
from workspaces.models import (
    OverBudget,
    PriorityClass,
    Workspace,
    WorkspaceBudget,
    WorkspaceQuota,
)

#: Which policy wins when several budgets are past their hard limits.
_STRICTNESS = {OverBudget.ALLOW: 0, OverBudget.LOWEST_PRIORITY: 1, OverBudget.REFUSE: 2}


def _flavors_it_may_use(spec: Spec, workspace: Workspace, backend: str) -> set[str] | None:
    """The GPU flavors the run could land on (None: any, as far as TauGrid knows)."""
    if spec.compute.gpu_type is not None:
        return {spec.compute.gpu_type}
    if backend == "local":
        return {str(settings.TAU_LOCAL_FLAVOR)}
    names = set(
        WorkspaceQuota.objects.for_workspace(workspace)
        .filter(resource=GPU_RESOURCE)
        .values_list("flavor__name", flat=True)
    )
    return names or None


def budgets_for(spec: Spec, workspace: Workspace, *, backend: str) -> list[WorkspaceBudget]:
    """The budgets a GPU run of this spec draws on: the workspace's budget for all flavors,
    and the budget of its flavor when it can land on that flavor only."""
    budgets = list(
        WorkspaceBudget.objects.for_workspace(workspace).select_related("flavor").order_by("pk")
    )
    if not budgets:
        return []
    flavors = (
        _flavors_it_may_use(spec, workspace, backend) if any(b.flavor_id for b in budgets) else None
    )
    return [
        budget
        for budget in budgets
        if budget.flavor is None or (flavors is not None and flavors == {budget.flavor.name})
    ]


def budget_lines(
    workspace: Workspace,
    budgets: list[WorkspaceBudget],
    period: accounting.Period,
    *,
    now: datetime,
) -> list[BudgetLine]:
    """Where each budget stands this month (one usage read for all of them)."""
    if not budgets:
        return []
    return lines_from_usage(
        budgets, accounting.usage_in(period, workspace_ids=[workspace.pk], now=now)
    )


def lines_from_usage(budgets: list[WorkspaceBudget], usage: accounting.Usage) -> list[BudgetLine]:
    """Where each budget stands, from the usage of its workspace's month."""
    lines = []
    for budget in budgets:
        if budget.flavor is None:
            used = usage.total.gpu_hours
            label = "all flavors"
        else:
            part = usage.by_flavor.get(budget.flavor.name)
            used = part.gpu_hours if part is not None else 0.0
            label = budget.flavor.name
        lines.append(
            BudgetLine(
                label=label,
                used_gpu_hours=used,
                gpu_hours=budget.gpu_hours,
                hard_limit=budget.hard_limit,
                over_limit=budget.over_limit,
            )
        )
    return lines


def _hours(value: float) -> str:
    return f"{value:,.1f}".removesuffix(".0")


def apply_budgets(
    placement: Placement,
    workspace: Workspace,
    *,
    backend: str,
    now: datetime | None = None,
) -> Placement:
    """The placement with what the run may cost, and with the lowest priority if a budget
    past its hard limit says so; ``PolicyRefused`` (at ``compute.gpus``) if one refuses."""
    now = now or timezone.now()
    spec = placement.spec
    gpus = spec.compute.gpus * spec.compute.workers
    period = accounting.Period.containing(now)
    if not gpus:
        return dataclasses.replace(
            placement, cost=Cost(gpus=0, max_runtime=spec.run.max_runtime, month=period.label)
        )
    lines = budget_lines(workspace, budgets_for(spec, workspace, backend=backend), period, now=now)
    past = [line for line in lines if line.past_hard_limit]
    cost = Cost(
        gpus=gpus, max_runtime=spec.run.max_runtime, budgets=tuple(lines), month=period.label
    )
    if not past:
        return dataclasses.replace(placement, cost=cost)
    strictest = max(past, key=lambda line: _STRICTNESS[OverBudget(line.over_limit)])
    over = (
        f"{workspace.slug} has used {_hours(strictest.used_gpu_hours)} GPU-hours of "
        f"{period.label} ({strictest.label}), past its hard limit of "
        f"{_hours(float(strictest.hard_limit))}"
    )
    policy = OverBudget(strictest.over_limit)
    if policy == OverBudget.REFUSE:
        restart = period.next().label
        raise PolicyRefused(
            [
                PolicyProblem(
                    "compute.gpus",
                    f"{over}: new GPU runs are refused until {restart} starts. Ask the "
                    "platform team to raise the GPU-hour budget, or run without GPUs.",
                )
            ]
        )
    if policy == OverBudget.ALLOW:
        return dataclasses.replace(
            placement, cost=dataclasses.replace(cost, note=f"{over}; it is still allowed.")
        )
    allowed = list(workspace.allowed_priorities or [])
    if not allowed:
        note = f"{over}; it would go at the lowest priority, and it has no other."
        return dataclasses.replace(placement, cost=dataclasses.replace(cost, note=note))
    # Kueue orders by the classes' values: the lowest is the allowed class of least value.
    values = dict(PriorityClass.objects.filter(name__in=allowed).values_list("name", "value"))
    lowest = min(allowed, key=lambda name: (values.get(name, 0), allowed.index(name)))
    note = f"{over}: it is submitted at the lowest priority, {lowest}."
    queue = dataclasses.replace(spec.queue, priority=lowest)
    return dataclasses.replace(
        placement,
        spec=dataclasses.replace(spec, queue=queue),
        priority=lowest,
        priority_value=min(placement.priority_value, allowed.index(lowest)),
        cost=dataclasses.replace(cost, note=note),
    )
