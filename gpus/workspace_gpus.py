"""A workspace's GPU use, as its members see it: the GPUs its runs hold now against its
quota, each run's utilisation, and GPUs held over time, per run.

Everything is this workspace's own: its runs from the database (scoped like every query of
the run core), and from Prometheus only series whose ``namespace`` is the workspace's, mapped
to its runs by their pods' names. Nothing about the nodes, or who else runs on them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from gpus import readings as telemetry
from portal import live
from runs.models import RUNNING_STATES, Run, RunAttempt
from runs.usage import UsageLine, usage_lines
from tau.k8s_names import GPU_RESOURCE
from workspaces.models import Workspace

#: Buckets of the "GPUs held over time" chart (whatever the window).
BUCKETS = 120
#: Runs drawn one by one in that chart; the rest are summed as "other runs".
CHART_RUNS = 12


def gpus_of(spec: dict[str, Any]) -> int:
    """GPUs a run holds while it runs: per worker times workers (the normalised spec)."""
    compute = spec.get("compute") or {}
    try:
        return int(compute.get("gpus") or 0) * max(1, int(compute.get("workers") or 1))
    except (TypeError, ValueError):
        return 0


def workload_prefixes(run: Run, attempts: Iterable[RunAttempt]) -> list[str]:
    """The names its pods start with on Kubernetes: each attempt's Job or RayJob name (a
    RayJob's RayCluster and its pods are named after it), then ``-``."""
    prefixes = []
    for attempt in attempts:
        _kind, _, name = attempt.backend_name.partition("/")
        if name:
            prefixes.append(name + "-")
    return prefixes


@dataclass
class HeldRun:
    run: Run
    gpus: int
    utilization: float | None = None  # its GPUs' average now, percent
    memory_used_mib: float | None = None  # all its GPUs together

    @property
    def idle(self) -> bool:
        return self.utilization is not None and self.utilization < settings.TAU_GPU_IDLE_PERCENT


@dataclass
class WorkspaceNow:
    held: list[HeldRun]
    quota: list[UsageLine]
    notice: str = ""
    etag: str = ""
    telemetry_configured: bool = False
    waiting_for_gpus: int = 0

    @property
    def gpus_in_use(self) -> int:
        return sum(run.gpus for run in self.held)

    @property
    def gpu_quota(self) -> Decimal:
        return sum((line.nominal for line in self.quota), Decimal(0))


def now(workspace: Workspace) -> WorkspaceNow:
    """What the workspace holds now (three queries, and two Prometheus queries when it is
    configured, cached and shared)."""
    runs = list(
        Run.objects.for_workspace(workspace)
        .filter(state__in=RUNNING_STATES)
        .only("id", "name", "spec", "state", "started_at", "updated_at", "workspace_id")
        .order_by("-started_at", "-id")
    )
    holding = [run for run in runs if gpus_of(run.spec) > 0]
    attempts: dict[int, list[RunAttempt]] = {}
    if holding:
        for attempt in (
            RunAttempt.objects.for_workspace(workspace)
            .filter(run__in=[run.pk for run in holding])
            .only("id", "run_id", "number", "backend_name")
        ):
            attempts.setdefault(attempt.run_id, []).append(attempt)
    held = [HeldRun(run, gpus_of(run.spec)) for run in holding]
    quota = [line for line in usage_lines(workspace) if line.resource == GPU_RESOURCE]
    notice = ""
    if held and telemetry.configured():
        reading = telemetry.pod_values(workspace.namespace)
        notice = reading.notice
        for entry in held:
            prefixes = workload_prefixes(entry.run, attempts.get(entry.run.pk, []))
            entry.utilization, entry.memory_used_mib = _of_pods(reading.value or {}, prefixes)
    tag = "|".join(
        f"{entry.run.pk}:{entry.run.updated_at}:{entry.utilization}:{entry.memory_used_mib}"
        for entry in held
    )
    tag += "|" + "|".join(f"{line.flavor}:{line.used}:{line.nominal}" for line in quota) + notice
    return WorkspaceNow(
        held=held,
        quota=quota,
        notice=notice,
        etag=live.etag(tag),
        telemetry_configured=telemetry.configured(),
    )


def _of_pods(
    values: dict[str, tuple[float | None, float | None]], prefixes: list[str]
) -> tuple[float | None, float | None]:
    """The average utilisation and the memory of the pods named with one of ``prefixes``."""
    utilization: list[float] = []
    memory: list[float] = []
    for pod, (pod_utilization, pod_memory) in values.items():
        if any(pod.startswith(prefix) for prefix in prefixes):
            if pod_utilization is not None:
                utilization.append(pod_utilization)
            if pod_memory is not None:
                memory.append(pod_memory)
    return (
        sum(utilization) / len(utilization) if utilization else None,
        sum(memory) if memory else None,
    )


@dataclass
class _Interval:
    start: datetime
    end: datetime
    gpus: int


@dataclass
class _RunUse:
    name: str
    intervals: list[_Interval] = field(default_factory=list)

    def gpu_seconds(self, start: datetime, end: datetime) -> float:
        total = 0.0
        for interval in self.intervals:
            overlap = (min(end, interval.end) - max(start, interval.start)).total_seconds()
            if overlap > 0:
                total += overlap * interval.gpus
        return total


def held_over_time(workspace: Workspace, window: timedelta, *, now: datetime) -> dict[str, Any]:
    """GPUs held in each of ``BUCKETS`` steps of the window, per run (the ``CHART_RUNS``
    that held most, the rest together), from the attempts' start and end times: each value
    is the GPUs held on average in its step (GPU-seconds over the step), so a run of ten
    minutes in an hour's step counts for a sixth of its GPUs. With the quota now."""
    start = now - window
    step = window / BUCKETS
    attempts = (
        RunAttempt.objects.for_workspace(workspace)
        .filter(started_at__isnull=False, started_at__lt=now)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=start))
        .select_related("run")
        .only("id", "started_at", "finished_at", "run__id", "run__name", "run__spec")
        .order_by("started_at", "id")
    )
    uses: dict[int, _RunUse] = {}
    for attempt in attempts:
        gpus = gpus_of(attempt.run.spec)
        if gpus <= 0 or attempt.started_at is None:
            continue
        use = uses.setdefault(attempt.run_id, _RunUse(attempt.run.name))
        use.intervals.append(_Interval(attempt.started_at, attempt.finished_at or now, gpus))
    ranked = sorted(uses.values(), key=lambda use: -use.gpu_seconds(start, now))
    shown, rest = ranked[:CHART_RUNS], ranked[CHART_RUNS:]
    edges = [start + step * index for index in range(BUCKETS + 1)]
    seconds = step.total_seconds()

    def series(group: list[_RunUse]) -> list[float]:
        return [
            round(sum(use.gpu_seconds(low, high) for use in group) / seconds, 3)
            for low, high in itertools.pairwise(edges)
        ]

    runs = [{"run": use.name, "gpus": series([use])} for use in shown]
    if rest:
        runs.append({"run": f"{len(rest)} other runs", "gpus": series(rest)})
    quota = [line for line in usage_lines(workspace) if line.resource == GPU_RESOURCE]
    nominal = sum((line.nominal for line in quota), Decimal(0))
    return {
        "times": [moment.isoformat() for moment in edges[1:]],
        "step_seconds": seconds,
        "runs": runs,
        "quota": float(nominal),
        "ceiling": _ceiling(quota),
        "generated_at": timezone.now().isoformat(),
    }


def _ceiling(quota: list[UsageLine]) -> float | None:
    """The most GPUs the workspace could hold by borrowing from its cohort; None when that
    is the quota itself (no cohort) or has no bound."""
    if not any(line.in_cohort for line in quota):
        return None
    total = Decimal(0)
    for line in quota:
        if line.in_cohort and line.borrowing_limit is None:
            return None
        total += line.nominal + (line.borrowing_limit or 0 if line.in_cohort else 0)
    return float(total)
