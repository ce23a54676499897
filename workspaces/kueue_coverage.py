"""What a workspace's quota rows let Kueue admit: which resources its ClusterQueue covers,
which flavors a pod set can land on, and what a run asks for that no flavor could ever give.
Pure functions over the rows' amounts (:func:`quota_ceilings` reads them), used by the
submission's policy (``runs.policy``: refuse a run Kueue would never admit) and by the admin
and the staff API (warn about quotas that leave out what runs ask for). The rendering of the
rows into resource groups (``executors.kubernetes.kueue.resource_groups``) groups them with
:func:`resource_groups_of`, so the two never disagree.

Kueue's rules (v0.17, its flavor assigner):

- A resource the ClusterQueue has no quota for at all cannot be assigned: Kueue writes
  "resource memory unavailable in ClusterQueue" on the Workload, and it waits forever.
- Resources are grouped (a group is the resources a set of flavors have rows for, see
  :func:`resource_groups_of`), and every resource of one group that a pod set asks for is
  assigned the *same* flavor. A flavor without a row for one of its group's resources has
  none of it (``nominalQuota: 0``, and nothing to borrow). So a GPU flavor with rows for
  ``nvidia.com/gpu`` only, in one group with a CPU flavor's ``cpu`` and ``memory``, can never
  take a GPU worker, which asks for all three.
- A pod set (a Job's workers; a RayJob's head, its workers and KubeRay's submitter, each one
  pod set) is placed as a whole: its pods' requests times their count must fit the flavor's
  ceiling, its nominal quota plus, in a cohort, its borrowing limit (none: unlimited).
- ``compute.gpu_type`` puts the flavor's node labels on the GPU pods, so of the GPU's group
  only that flavor is tried for them.

On the local backend none of this applies: a resource without a row is limited only by the
machine (``executors.local.agent.admission``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from django.conf import settings

from tau.k8s_names import GPU_RESOURCE
from tau.quantity import format_quantity
from workspaces.models import BYTE_RESOURCES, Workspace, WorkspaceQuota

#: resource -> flavor -> the most of it the workspace could ever hold on that flavor (None:
#: borrowing without limit).
Ceilings = Mapping[str, Mapping[str, Decimal | None]]
#: What every run asks for, whatever its spec: its pods always request CPUs and memory.
ALWAYS_REQUESTED: Final = ("cpu", "memory")
#: What tau.yaml says about each resource (where a problem is shown).
SPEC_PATHS: Final[Mapping[str, str]] = {
    GPU_RESOURCE: "compute.gpus",
    "cpu": "compute.cpus",
    "memory": "compute.memory",
}


def kueue_in_use() -> bool:
    """Whether Kueue admits this installation's runs: on the Kubernetes backend only (its
    executor, ``executors.kubernetes``, keeps the Kueue objects in step with the rows)."""
    return bool(settings.TAU_BACKEND == "kubernetes")


def quota_ceilings(workspace: Workspace) -> dict[str, dict[str, Decimal | None]]:
    """resource -> flavor -> the most of it the workspace could ever hold on that flavor:
    its nominal quota plus, in a cohort, its borrowing limit (None: borrowing is unlimited).
    Borrowing limits outside a cohort mean nothing. Resources without quota rows are absent."""
    in_cohort = workspace.cohort_id is not None
    ceilings: dict[str, dict[str, Decimal | None]] = {}
    # The four values, not quota and flavor objects (each loaded one is audit-snapshotted):
    # every submission asks.
    rows = WorkspaceQuota.objects.for_workspace(workspace).values_list(
        "resource", "flavor__name", "nominal", "borrowing_limit"
    )
    for resource, flavor, nominal, borrowing in rows:
        ceiling: Decimal | None = nominal
        if in_cohort:
            ceiling = None if borrowing is None else nominal + borrowing
        ceilings.setdefault(resource, {})[flavor] = ceiling
    return ceilings


@dataclass(frozen=True)
class ResourceGroup:
    flavors: frozenset[str]
    resources: frozenset[str]


def resource_groups_of(rows: Iterable[tuple[str, str]]) -> list[ResourceGroup]:
    """Kueue's resource groups for (flavor, resource) rows: the connected parts of "flavor F
    has a row for resource R" — a flavor and every resource it has a row for are in one group,
    and a resource shared by two flavors joins them (Kueue allows a resource and a flavor in
    one group only). In no particular order."""
    pairs = list(rows)
    # Union-find over flavors and resources ("f:" and "r:" keep the two name spaces apart).
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for flavor, resource in pairs:
        parent[root(f"f:{flavor}")] = root(f"r:{resource}")
    groups: dict[str, tuple[set[str], set[str]]] = {}
    for flavor, resource in pairs:
        flavors, resources = groups.setdefault(root(f"r:{resource}"), (set(), set()))
        flavors.add(flavor)
        resources.add(resource)
    return [
        ResourceGroup(frozenset(flavors), frozenset(resources))
        for flavors, resources in groups.values()
    ]


def amount_text(resource: str, value: Decimal) -> str:
    return format_quantity(value, binary=resource in BYTE_RESOURCES)


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


@dataclass(frozen=True)
class Gap:
    """Why a pod set can never be admitted: of what it asks for (``wanted``, the resources of
    one group, or one resource no row covers), what the flavor that comes closest cannot give
    (``short``: resource, the most it can, 0 for no row); ``flavor`` None when no row covers
    the resource at all; ``alone``: that flavor was the only one it could use."""

    wanted: Mapping[str, Decimal]
    flavor: str | None = None
    short: tuple[tuple[str, Decimal], ...] = ()
    alone: bool = True

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(sorted(self.wanted))

    def words(self, who: str, slug: str) -> str:
        """The gap as a sentence about ``who`` with its verb ("the 2 worker(s) need", "the
        Ray head needs") in workspace ``slug``."""
        if self.flavor is None:
            (resource,) = self.wanted
            return (
                f"the run asks for {resource}, but {slug} has no {resource} quota, and Kueue "
                "admits no run that asks for a resource its ClusterQueue has no quota for; it "
                f"would never start. Ask the platform team for a {resource} quota."
            )
        needs = _and([f"{amount_text(r, a)} {r}" for r, a in sorted(self.wanted.items())])
        has = _and(
            [
                f"no {resource} quota"
                if ceiling == 0
                else f"at most {amount_text(resource, ceiling)} {resource}"
                for resource, ceiling in self.short
            ]
        )
        where = (
            f"{slug}'s flavor {self.flavor} has {has}"
            if self.alone
            else f"no flavor of {slug} has them all (the closest, {self.flavor}, has {has})"
        )
        return (
            f"{who} {needs} on one flavor, but {where}; it would never start (Kueue "
            f"places all the {_and(list(self.resources))} a pod set asks for on one flavor)."
        )


def _shortfall(
    flavor: str, wanted: Mapping[str, Decimal], ceilings: Ceilings
) -> tuple[tuple[str, Decimal], ...]:
    """What ``flavor`` cannot give of ``wanted`` (resource, the most it can: 0 for no row)."""
    short = []
    for resource, amount in sorted(wanted.items()):
        on_flavor = ceilings.get(resource, {})
        ceiling = on_flavor[flavor] if flavor in on_flavor else Decimal(0)
        if ceiling is not None and amount > ceiling:
            short.append((resource, ceiling))
    return tuple(short)


def pod_set_gaps(
    wanted: Mapping[str, Decimal],
    ceilings: Ceilings,
    *,
    only_flavors: Mapping[str, Collection[str]] | None = None,
) -> list[Gap]:
    """What keeps Kueue from ever admitting a pod set asking for ``wanted`` in all (its pods'
    requests times their count) under these ceilings; empty when some flavor can take it.
    ``only_flavors``: resource -> the flavors its group may use for this pod set (a
    ``compute.gpu_type``)."""
    asked = {resource: amount for resource, amount in wanted.items() if amount > 0}
    gaps = [
        Gap({resource: asked[resource]}) for resource in sorted(asked) if not ceilings.get(resource)
    ]
    rows = [(flavor, resource) for resource, flavors in ceilings.items() for flavor in flavors]
    for group in resource_groups_of(rows):
        in_group = {r: a for r, a in asked.items() if r in group.resources}
        if not in_group:
            continue
        candidates = set(group.flavors)
        for resource in in_group:
            if only_flavors is not None and resource in only_flavors:
                candidates &= set(only_flavors[resource])
        if not candidates:
            continue  # a flavor the workspace has no quota on: the caller says so
        shortfalls = {flavor: _shortfall(flavor, in_group, ceilings) for flavor in candidates}
        if any(not short for short in shortfalls.values()):
            continue
        # The flavor that comes closest says what is missing: the fewest resources short, and
        # of those one with the GPUs asked for (the scarce resource people mean a flavor by).
        flavor = min(
            candidates,
            key=lambda name: (
                len(shortfalls[name]),
                any(resource == GPU_RESOURCE for resource, _ in shortfalls[name]),
                name,
            ),
        )
        gaps.append(Gap(in_group, flavor, shortfalls[flavor], alone=len(candidates) == 1))
    return gaps


def quota_warnings(workspace: Workspace, ceilings: Ceilings | None = None) -> list[str]:
    """What the workspace's quotas leave out of what its runs will ask for on Kubernetes, in
    words for the platform team (the admin's workspace page, the staff API): a resource every
    run requests without any row, and a GPU flavor on which no GPU run could be placed."""
    ceilings = quota_ceilings(workspace) if ceilings is None else ceilings
    warnings = [
        f"No {resource} quota: every run asks for {resource}, and Kueue admits none that asks "
        f"for a resource its ClusterQueue has no quota for, so {workspace.slug}'s runs are "
        f"refused at submission until it has a {resource} row."
        for resource in ALWAYS_REQUESTED
        if not ceilings.get(resource)
    ]
    # The least a GPU worker asks for, of what the workspace has rows for: whether it could
    # be placed on each GPU flavor at all.
    least = {GPU_RESOURCE: Decimal(1), "cpu": Decimal("0.001"), "memory": Decimal(1)}
    wanted = {resource: amount for resource, amount in least.items() if ceilings.get(resource)}
    for flavor in sorted(ceilings.get(GPU_RESOURCE, {})):
        gaps = pod_set_gaps(wanted, ceilings, only_flavors={GPU_RESOURCE: [flavor]})
        for gap in gaps:
            if GPU_RESOURCE not in gap.wanted:
                continue
            missing = [resource for resource, ceiling in gap.short if ceiling == 0]
            warnings.append(
                f"No GPU run can start on flavor {flavor}: it has no {_and(missing)} quota, "
                f"and Kueue places all the {_and(list(gap.resources))} a GPU worker asks for "
                f"on one flavor. Add {_and(missing)} rows for {flavor}."
            )
    return warnings
