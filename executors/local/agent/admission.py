"""Which queued local runs may start now, and what the others are waiting for.

Pure functions over amounts (no database, no processes), so the rule can be read and tested
on its own; only ``machine_capacity`` reads what this machine offers. The rule:

* A run's demand is what the whole workload asks for at once, compute per worker times workers
  (``runs.policy.requested_totals``, the same amount Kueue would admit on a cluster). So the
  workers of a multi-worker Job, one process each here (``supervisor``), are admitted together
  or not at all, as Kueue admits a Job's pods: a spec means the same thing, and uses the same
  quota, on either backend.
* Runs are considered in queue order: higher ``priority_value`` first, then first queued
  first (FIFO within a priority).
* A run starts when its workspace's quota on the local flavor and this machine's free
  capacity both cover its demand. A resource the workspace has no quota row for (on the
  local flavor) is limited only by the machine. A workspace in a cohort may go over its
  nominal quota by borrowing, up to its borrowing limit, while the cohort's members together
  stay within the sum of their nominal quotas (lending limits are not modelled locally).
* No overtaking within the pool a run waits for: once a run waits for this machine, later
  runs do not take machine capacity before it; once a run waits for its workspace's quota,
  later runs of that workspace wait behind it. Runs of other workspaces are not held up by
  someone else's quota. A run that can never fit (it asks for more than the machine or its
  quota could ever give) holds nothing up and says why.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings

from tau.k8s_names import GPU_RESOURCE
from tau.quantity import format_quantity, parse_quantity
from tau.spec import Spec, spec_from_dict

CPU = "cpu"
MEMORY = "memory"
RESOURCES = (CPU, MEMORY, GPU_RESOURCE)
ZERO = Decimal(0)

Amounts = Mapping[str, Decimal]


@dataclass(frozen=True)
class Quota:
    nominal: Decimal
    borrowing_limit: Decimal | None = None  # None: no limit (only meaningful in a cohort)


@dataclass(frozen=True)
class WorkspaceShare:
    """A workspace's quota rows on the local flavor, by resource."""

    quotas: Mapping[str, Quota]
    cohort: int | None = None


@dataclass(frozen=True)
class Candidate:
    run_id: int
    workspace_id: int
    demand: Amounts


@dataclass(frozen=True)
class Decision:
    run_id: int
    admit: bool
    position: int | None = None  # 1-based place among waiting runs on this machine
    reason: str = ""


@dataclass
class Usage:
    """What the runs this machine executes hold, in total and per workspace."""

    machine: dict[str, Decimal] = field(default_factory=lambda: dict.fromkeys(RESOURCES, ZERO))
    workspaces: dict[int, dict[str, Decimal]] = field(
        default_factory=lambda: defaultdict(lambda: dict.fromkeys(RESOURCES, ZERO))
    )

    def add(self, workspace_id: int, demand: Amounts) -> None:
        held = self.workspaces[workspace_id]
        for resource in RESOURCES:
            amount = demand.get(resource, ZERO)
            self.machine[resource] += amount
            held[resource] += amount

    def of(self, workspace_id: int) -> Mapping[str, Decimal]:
        return self.workspaces.get(workspace_id) or dict.fromkeys(RESOURCES, ZERO)


def amount_text(resource: str, amount: Decimal) -> str:
    """``2 CPUs``, ``1 CPU``, ``512Mi of memory``, ``1 GPU``."""
    number = number_text(resource, amount)
    if resource == CPU:
        return f"{number} CPU" if amount == 1 else f"{number} CPUs"
    if resource == GPU_RESOURCE:
        return f"{number} GPU" if amount == 1 else f"{number} GPUs"
    if resource == MEMORY:
        return f"{number} of memory"
    return f"{number} {resource}"


def number_text(resource: str, amount: Decimal) -> str:
    if resource == MEMORY:
        exact = format_quantity(amount, binary=True)
        if exact.endswith(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")) and not exact.endswith("Ki"):
            return exact  # 512Mi, 8Gi
        if amount >= 2**30:
            return f"{(amount / 2**30).quantize(Decimal('0.1'))}Gi"  # detected: 23.5Gi
        return exact
    if amount == amount.to_integral_value():
        return str(int(amount))
    return format(amount.normalize(), "f")


def endpoint_replicas(spec: Spec) -> int:
    """The replicas an endpoint holds room for: ``serve.replicas``, or the most its
    autoscaling may reach (a cluster holds a worker for each, whatever Ray Serve runs)."""
    serve = spec.serve
    assert serve is not None
    if serve.autoscaling is not None:
        return serve.autoscaling.max_replicas
    return serve.replicas or 1


def endpoint_spec(data: dict[str, Any], replicas_desired: int) -> Spec:
    """The spec an endpoint's generation runs: the stored one (``Endpoint.spec``) with the
    replicas it was scaled to (a scale changes ``Endpoint.replicas_desired``, not the
    tau.yaml it was deployed with)."""
    spec = spec_from_dict(data)
    serve = spec.serve
    if serve is None or serve.autoscaling is not None or serve.replicas == replicas_desired:
        return spec
    return dataclasses.replace(spec, serve=dataclasses.replace(serve, replicas=replicas_desired))


def endpoint_demand(spec: Spec) -> dict[str, Decimal]:
    """What an endpoint's generation holds of this machine while it runs: ``compute`` per
    replica times its replicas (Ray's own processes, a cluster's head pod, are not counted,
    as a RayJob's head is not: ``LocalBackend.pod_sets``). Runs and endpoints share the
    machine, and each workspace's quota on it, by these amounts."""
    replicas = endpoint_replicas(spec)
    return {
        CPU: parse_quantity(spec.compute.cpus) * replicas,
        MEMORY: parse_quantity(spec.compute.memory) * replicas,
        GPU_RESOURCE: Decimal(spec.compute.gpus * replicas),
    }


def unsupported_here(spec: Spec) -> list[tuple[str, str]]:
    """What a spec asks for that runs on a cluster only. (A sweep runs here: its trials are
    sub-processes of the attempt, within its resources; see ``tau.sweep``.)"""
    problems: list[tuple[str, str]] = []
    if spec.storage.data_pvc is not None:
        problems.append(
            (
                "storage.data_pvc",
                f"the data volume {spec.storage.data_pvc} is a Kubernetes PersistentVolumeClaim, "
                "and this installation runs on one machine: remove `storage.data_pvc` and "
                "keep the data in the project folder (or read it from a path the program is "
                "given), or submit it to a cluster",
            )
        )
    return problems


#: The tau.yaml field each resource of the machine is asked for in.
FIELD_OF = {CPU: "compute.cpus", MEMORY: "compute.memory", GPU_RESOURCE: "compute.gpus"}

_SETTING_FOR = {CPU: "TAU_LOCAL_CPUS", MEMORY: "TAU_LOCAL_MEMORY", GPU_RESOURCE: "TAU_LOCAL_GPUS"}


def never_fits(
    demand: Amounts, capacity: Amounts, *, subject: str = "The run", kind: str = "runs"
) -> dict[str, str]:
    """resource -> why this machine could never run the demand, however idle it is: the
    rule submission applies up front, and the agent applies to runs already queued (the
    machine's settings may have changed since). An endpoint's replicas are judged the same
    way (``subject``/``kind`` name it: "The endpoint (2 replicas)", "endpoints")."""
    problems: dict[str, str] = {}
    for resource in (GPU_RESOURCE, CPU, MEMORY):  # the scarcest first: it is the real reason
        wanted = demand.get(resource, ZERO)
        have = capacity.get(resource, ZERO)
        if wanted <= have:
            continue
        setting = _SETTING_FOR[resource]
        if resource == GPU_RESOURCE and have == 0:
            problems[resource] = (
                f"{subject} needs {amount_text(resource, wanted)}, but this machine has 0 GPUs "
                f"({setting}); {kind} that need GPUs must go to a cluster."
            )
        else:
            problems[resource] = (
                f"{subject} needs {amount_text(resource, wanted)} at once, but this machine has "
                f"{number_text(resource, have)} ({setting}); ask for at most "
                f"{number_text(resource, have)} in total."
            )
    return problems


def _machine_problem(demand: Amounts, capacity: Amounts, used: Amounts) -> tuple[str | None, bool]:
    """(why the machine cannot take it now, whether it never could)."""
    never = never_fits(demand, capacity)
    if never:
        return f"Cannot start on this machine. {next(iter(never.values()))}", True
    for resource in RESOURCES:
        wanted = demand.get(resource, ZERO)
        free = max(ZERO, capacity.get(resource, ZERO) - used.get(resource, ZERO))
        if wanted > free:
            return (
                f"Waiting for {amount_text(resource, wanted)}: "
                f"{number_text(resource, free)} of this machine's "
                f"{number_text(resource, capacity.get(resource, ZERO))} are free.",
                False,
            )
    return None, False


def _quota_problem(
    workspace_id: int,
    demand: Amounts,
    usage: Usage,
    shares: Mapping[int, WorkspaceShare],
) -> tuple[str | None, bool]:
    """(why the workspace's quota does not cover it now, whether it never could)."""
    share = shares.get(workspace_id)
    if share is None:
        return None, False
    held = usage.of(workspace_id)
    for resource in RESOURCES:
        wanted = demand.get(resource, ZERO)
        quota = share.quotas.get(resource)
        if wanted == 0 or quota is None:
            continue
        using = held.get(resource, ZERO)
        if using + wanted <= quota.nominal:
            continue
        what = amount_text(resource, wanted)
        uses = (
            f"the workspace uses {number_text(resource, using)} of its "
            f"{number_text(resource, quota.nominal)}"
        )
        if share.cohort is None:
            if wanted > quota.nominal:
                return (
                    f"Cannot start: it needs {what} at once and the workspace's quota on "
                    f"this machine is {number_text(resource, quota.nominal)}.",
                    True,
                )
            return f"Waiting for {what}: {uses}.", False
        members = [
            (member, other.quotas[resource])
            for member, other in shares.items()
            if other.cohort == share.cohort and resource in other.quotas
        ]
        pool = sum((q.nominal for _, q in members), ZERO)
        pool_used = sum((usage.of(member).get(resource, ZERO) for member, _ in members), ZERO)
        own_ceiling = (
            quota.nominal + quota.borrowing_limit if quota.borrowing_limit is not None else pool
        )
        if wanted > min(own_ceiling, pool):
            return (
                f"Cannot start: it needs {what} at once and the workspace can get at most "
                f"{number_text(resource, min(own_ceiling, pool))} on this machine, borrowing "
                "included.",
                True,
            )
        if using + wanted <= own_ceiling and pool_used + wanted <= pool:
            continue  # borrowed from the cohort's unused quota
        if min(own_ceiling, pool) <= quota.nominal:
            return f"Waiting for {what}: {uses}.", False  # nothing to borrow, ever
        if using + wanted > own_ceiling:
            borrowable = number_text(resource, own_ceiling - quota.nominal)
            return f"Waiting for {what}: {uses} and may borrow at most {borrowable}.", False
        return f"Waiting for {what}: {uses} and its cohort has none to lend right now.", False
    return None, False


def plan_admission(
    candidates: Iterable[Candidate],
    *,
    capacity: Amounts,
    usage: Usage,
    shares: Mapping[int, WorkspaceShare],
) -> list[Decision]:
    """Decide, in queue order, which candidates start now; ``usage`` grows by each admitted
    run's demand (the caller passes a copy if it must keep the original)."""
    decisions: list[Decision] = []
    position = 0
    waiting_for_machine = 0
    waiting_for_quota: set[int] = set()
    for candidate in candidates:
        problem, never = _quota_problem(candidate.workspace_id, candidate.demand, usage, shares)
        if never:
            decisions.append(Decision(candidate.run_id, admit=False, reason=problem or ""))
            continue
        machine_problem, machine_never = _machine_problem(candidate.demand, capacity, usage.machine)
        if machine_never:
            decisions.append(Decision(candidate.run_id, admit=False, reason=machine_problem or ""))
            continue
        if candidate.workspace_id in waiting_for_quota:
            position += 1
            decisions.append(
                Decision(
                    candidate.run_id,
                    admit=False,
                    position=position,
                    reason="Waiting behind an earlier run of this workspace for its quota.",
                )
            )
            continue
        if problem is not None:
            waiting_for_quota.add(candidate.workspace_id)
            position += 1
            decisions.append(
                Decision(candidate.run_id, admit=False, position=position, reason=problem)
            )
            continue
        if waiting_for_machine:
            position += 1
            earlier = (
                "1 earlier run is"
                if waiting_for_machine == 1
                else f"{waiting_for_machine} earlier runs are"
            )
            decisions.append(
                Decision(
                    candidate.run_id,
                    admit=False,
                    position=position,
                    reason=f"Waiting: {earlier} waiting for this machine's resources first.",
                )
            )
            continue
        if machine_problem is not None:
            waiting_for_machine += 1
            position += 1
            decisions.append(
                Decision(candidate.run_id, admit=False, position=position, reason=machine_problem)
            )
            continue
        usage.add(candidate.workspace_id, candidate.demand)
        decisions.append(Decision(candidate.run_id, admit=True))
    return decisions


def detect_memory_bytes(meminfo: str = "/proc/meminfo") -> Decimal:
    """This machine's memory (``MemTotal``), in bytes."""
    with open(meminfo, encoding="ascii") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return Decimal(int(line.split()[1]) * 1024)
    raise RuntimeError(f"{meminfo} has no MemTotal line")


def machine_capacity() -> dict[str, Decimal]:
    """What this machine offers local runs: TAU_LOCAL_CPUS, TAU_LOCAL_MEMORY (``MemTotal``
    when unset), TAU_LOCAL_GPUS."""
    memory_setting = settings.TAU_LOCAL_MEMORY
    memory = parse_quantity(memory_setting) if memory_setting else detect_memory_bytes()
    return {
        CPU: Decimal(int(settings.TAU_LOCAL_CPUS)),
        MEMORY: memory,
        GPU_RESOURCE: Decimal(int(settings.TAU_LOCAL_GPUS)),
    }
