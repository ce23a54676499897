"""Workspace policy at submission: fill in what the spec leaves to the workspace, refuse what
the workspace does not allow. It never changes a value the spec sets; a value the workspace
forbids is an error the researcher sees, with the path in tau.yaml it is about.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings

from runs.backends import PodSet
from runs.backends.registry import describing
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import parse_quantity
from tau.spec import Spec
from workspaces.kueue_coverage import SPEC_PATHS, pod_set_gaps, quota_ceilings
from workspaces.models import Workspace

__all__ = ["PolicyProblem", "PolicyRefused", "apply_policy", "quota_ceilings", "run_totals"]


@dataclass(frozen=True)
class PolicyProblem:
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


class PolicyRefused(ValueError):
    def __init__(self, problems: list[PolicyProblem]) -> None:
        super().__init__("; ".join(f"{p.path}: {p.message}" for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class BudgetLine:
    """One budget a run would draw on, as it stands this month."""

    label: str  # "all flavors" or the flavor's name
    used_gpu_hours: float
    gpu_hours: Decimal  # the soft limit
    hard_limit: Decimal
    over_limit: str  # workspaces.models.OverBudget

    @property
    def left_gpu_hours(self) -> float:
        return max(0.0, float(self.gpu_hours) - self.used_gpu_hours)

    @property
    def past_hard_limit(self) -> bool:
        return self.used_gpu_hours >= float(self.hard_limit)

    # A meter's scale: yellow from 80% of the budget, red past it, never off its end.
    @property
    def meter_max(self) -> float:
        return max(float(self.hard_limit), self.used_gpu_hours)

    @property
    def meter_low(self) -> float:
        return 0.8 * float(self.gpu_hours)


@dataclass(frozen=True)
class Cost:
    """What a run may cost in GPU-hours, and the budgets it would draw on (``runs.budgets``)."""

    gpus: int
    max_runtime: int | None  # seconds
    budgets: tuple[BudgetLine, ...] = ()
    month: str = ""  # "December 2026"
    #: What a budget past its hard limit did to the run ("submitted at the lowest priority").
    note: str = ""

    @property
    def max_gpu_hours(self) -> float | None:
        if self.max_runtime is None:
            return None
        return self.gpus * self.max_runtime / 3600

    @property
    def summary(self) -> str:
        if not self.gpus:
            return "It uses no GPUs, so no GPU-hour budget."
        hours = self.max_gpu_hours
        if hours is None:
            said = (
                f"{self.gpus} GPU-hour{'s' if self.gpus != 1 else ''} for each hour it runs "
                "(no run.max_runtime, so no upper bound)"
            )
        else:
            said = f"Up to {_hours(hours)} GPU-hours if it runs to its max_runtime"
        for line in self.budgets:
            said += (
                f"; {_hours(line.left_gpu_hours)} of {_hours(float(line.gpu_hours))} left "
                f"this month ({line.label})"
            )
        return said + "." + (f" {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, object]:
        return {
            "gpus": self.gpus,
            "max_gpu_hours": None if self.max_gpu_hours is None else round(self.max_gpu_hours, 3),
            "summary": self.summary,
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


def _hours(value: float) -> str:
    return f"{value:,.1f}".removesuffix(".0")


@dataclass(frozen=True)
class Placement:
    spec: Spec  # with workspace defaults filled in
    priority: str
    priority_value: int
    cost: Cost | None = None


def _registry_of(image: str) -> str:
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def requested_totals(spec: Spec) -> dict[str, Decimal]:
    """What the workers ask for together (compute per worker times workers): the amount the
    local agent admits, and on Kubernetes the one pod set Kueue places on a single flavor."""
    workers = spec.compute.workers
    totals = {
        GPU_RESOURCE: Decimal(spec.compute.gpus * workers),
        "cpu": parse_quantity(spec.compute.cpus) * workers,
        "memory": parse_quantity(spec.compute.memory) * workers,
    }
    return totals


def worker_pod_set(spec: Spec) -> PodSet:
    """The run's workers as one pod set (every backend's first)."""
    return PodSet(f"the {spec.compute.workers} worker(s) need", requested_totals(spec))


def run_totals(spec: Spec, backend: str) -> dict[str, Decimal]:
    """What ``backend`` admits together for the run (:meth:`RunBackend.pod_sets
    <runs.backends.RunBackend.pod_sets>`): locally the workers; on Kubernetes a RayJob's Ray
    head and KubeRay's submitter pod as well."""
    return _summed(describing(backend).pod_sets(spec))


def _summed(pod_sets: Iterable[PodSet]) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for pod_set in pod_sets:
        for resource, amount in pod_set.requests.items():
            totals[resource] = totals.get(resource, Decimal(0)) + amount
    return totals


def _sum(values: Iterable[Decimal | None]) -> Decimal | None:
    total = Decimal(0)
    for value in values:
        if value is None:
            return None
        total += value
    return total


def _largest(values: Iterable[Decimal | None]) -> Decimal | None:
    present = list(values)
    if any(value is None for value in present):
        return None
    return max((value for value in present if value is not None), default=Decimal(0))


def apply_policy(spec: Spec, workspace: Workspace, *, backend: str) -> Placement:
    problems: list[PolicyProblem] = []

    # Priority: a name the workspace allows; its rank in the list orders the queue.
    allowed = list(workspace.allowed_priorities or [])
    priority = spec.queue.priority or workspace.default_priority or ""
    if spec.queue.priority and spec.queue.priority not in allowed:
        choices = ", ".join(allowed) if allowed else "none (leave queue.priority out)"
        problems.append(
            PolicyProblem(
                "queue.priority",
                f"{spec.queue.priority!r} is not allowed in {workspace.slug}; allowed: {choices}.",
            )
        )
    priority_value = allowed.index(priority) if priority in allowed else 0

    if spec.queue.name and spec.queue.name != workspace.local_queue:
        problems.append(
            PolicyProblem(
                "queue.name",
                f"{workspace.slug} has one queue, {workspace.local_queue!r}; "
                "leave queue.name out or use it.",
            )
        )

    image = spec.runtime.image or workspace.default_image or settings.TAU_DEFAULT_IMAGE
    registries = settings.TAU_IMAGE_REGISTRIES
    if registries and _registry_of(image) not in registries:
        problems.append(
            PolicyProblem(
                "runtime.image",
                f"images from {_registry_of(image)} are not allowed here; "
                f"use one of: {', '.join(registries)}.",
            )
        )

    if backend == "local" and spec.runtime.secrets:
        problems.append(
            PolicyProblem(
                "runtime.secrets",
                "runs here execute on this machine, which has no Kubernetes Secrets to read; "
                "remove runtime.secrets (the run would otherwise start without them).",
            )
        )
    # On one machine its own GPU count is the limit (the backend reports that); on a
    # cluster a worker's GPUs must fit on one node.
    if backend == "kubernetes" and spec.compute.gpus > settings.TAU_MAX_GPUS_PER_NODE:
        problems.append(
            PolicyProblem(
                "compute.gpus",
                f"{spec.compute.gpus} GPUs per worker, but no node here has more than "
                f"{settings.TAU_MAX_GPUS_PER_NODE}; use more workers with fewer GPUs each.",
            )
        )

    ceilings = quota_ceilings(workspace)
    gpu_type = spec.compute.gpu_type
    gpu_flavors = ceilings.get(GPU_RESOURCE, {})
    if gpu_type is not None and gpu_type not in gpu_flavors:
        offered = ", ".join(sorted(gpu_flavors)) or "none"
        problems.append(
            PolicyProblem(
                "compute.gpu_type",
                f"{workspace.slug} has no GPU quota on {gpu_type!r}; its GPU flavors: {offered}.",
            )
        )
    workers = requested_totals(spec)
    pod_sets = describing(backend).pod_sets(spec)
    whole_run = _summed(pod_sets)
    short: set[str] = set()  # resources already refused: one problem each
    for resource, wanted in whole_run.items():
        if wanted == 0:
            continue
        by_flavor = ceilings.get(resource)
        if not by_flavor:
            if resource == GPU_RESOURCE:
                short.add(resource)
                problems.append(
                    PolicyProblem("compute.gpus", f"{workspace.slug} has no GPU quota.")
                )
            # Locally a resource without a row is limited by the machine alone; on
            # Kubernetes Kueue admits nothing that asks for it (below).
            continue
        if resource == GPU_RESOURCE and gpu_type is not None:
            if gpu_type not in by_flavor:
                continue  # reported above
            by_flavor = {gpu_type: by_flavor[gpu_type]}
        path = SPEC_PATHS[resource]
        total = _sum(by_flavor.values())
        # Kueue places one pod set (all the workers) on one flavor: the largest share counts.
        largest = _largest(by_flavor.values())
        if total is not None and wanted > total:
            short.add(resource)
            problems.append(
                PolicyProblem(
                    path,
                    f"the run needs {_amount(resource, wanted)} {resource} at once "
                    f"({spec.compute.workers} worker(s)), but {workspace.slug} can get at most "
                    f"{_amount(resource, total)}; it would never start.",
                )
            )
        elif largest is not None and workers[resource] > largest:
            short.add(resource)
            problems.append(
                PolicyProblem(
                    path,
                    f"the {spec.compute.workers} worker(s) need "
                    f"{_amount(resource, workers[resource])} {resource} on one flavor, but the "
                    f"most {workspace.slug} can get on any single flavor is "
                    f"{_amount(resource, largest)}; it would never start.",
                )
            )
    if backend == "kubernetes":
        problems += _kueue_problems(spec, pod_sets, workspace, ceilings, already=short)
    if problems:
        raise PolicyRefused(problems)
    runtime = dataclasses.replace(spec.runtime, image=image)
    queue = dataclasses.replace(spec.queue, priority=priority or None, name=workspace.local_queue)
    return Placement(
        spec=dataclasses.replace(spec, runtime=runtime, queue=queue),
        priority=priority,
        priority_value=priority_value,
    )


def _kueue_problems(
    spec: Spec,
    pod_sets: Iterable[PodSet],
    workspace: Workspace,
    ceilings: Mapping[str, Mapping[str, Decimal | None]],
    *,
    already: set[str],
) -> list[PolicyProblem]:
    """What keeps Kueue from ever admitting the run, pod set by pod set
    (``workspaces.kueue_coverage``): a resource the workspace has no quota for at all ("resource
    memory unavailable in ClusterQueue", and the run would wait forever), or no flavor that
    can hold everything of one resource group a pod set asks for. Resources refused above
    already are not refused twice."""
    only = {GPU_RESOURCE: [spec.compute.gpu_type]} if spec.compute.gpu_type else None
    problems: list[PolicyProblem] = []
    said: set[tuple[str, ...]] = set()
    for pod_set in pod_sets:
        for gap in pod_set_gaps(pod_set.requests, ceilings, only_flavors=only):
            if already & set(gap.resources) or (gap.flavor is None and gap.resources in said):
                continue
            said.add(gap.resources)
            lacking = {resource for resource, _ in gap.short} or set(gap.resources)
            path = next(SPEC_PATHS[r] for r in (GPU_RESOURCE, "memory", "cpu") if r in lacking)
            problems.append(PolicyProblem(path, gap.words(pod_set.who, workspace.slug)))
    return problems


def _amount(resource: str, value: Decimal) -> str:
    from tau.quantity import format_quantity

    return format_quantity(value, binary=resource == "memory")
