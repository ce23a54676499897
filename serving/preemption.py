"""Endpoints and preemption: what a workspace that keeps its endpoints from being preempted
(``Workspace.endpoint_preemption``: ``never``, the default) asks of a deployment, an update
and a scale, on a backend where something may preempt an endpoint
(``EndpointBackend.preempts``: Kueue, on Kubernetes; its ``quota_held`` says what an
endpoint holds of the quota there).

Kueue (v0.17) has no "never preempt this workload"; what it preempts (classical preemption)
is, for a workload waiting in a ClusterQueue:

* in the same ClusterQueue, admitted workloads of *lower* priority
  (``withinClusterQueue: LowerPriority``, the workspaces' default; with
  ``LowerOrNewerEqualPriority`` also those of equal priority admitted after it);
* in its cohort, when it takes back quota it lent (``reclaimWithinCohort``), workloads of
  ClusterQueues that *borrow*: lower priority first, then the most recently admitted, and
  only as long as their ClusterQueue still borrows.

So an endpoint is out of reach when (1) nothing of its workspace outranks it: it runs at the
workspace's highest allowed priority class, and (2) in a cohort, the workspace's endpoints
together fit its own nominal quota: a lender taking its quota back preempts the workspace's
runs (lower priority) until the ClusterQueue borrows no more, which happens before it reaches
an endpoint. A deployment that would break either is refused, saying which and what to do;
nothing is written. The quota is checked again inside the transaction that writes, with the
workspace's row locked (:func:`locked_workspace`), so two deployments (or scales, or updates)
at the same moment cannot both count on the same free quota. What is left (docs/kubernetes.md
says it): runs of the same top class rank with the endpoints, by admission time; and a quota
lowered by staff after a deployment is not checked again.

On the local backend nothing preempts an endpoint (``preempts`` is false): the policy asks
nothing there. With ``endpoint_preemption: allowed`` endpoints queue, borrow and may be
preempted like runs.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from decimal import Decimal
from typing import TYPE_CHECKING

from runs.policy import Placement
from serving.backends import EndpointBackend
from serving.models import LIVE_STATES, Endpoint
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import format_quantity
from tau.spec import spec_from_dict
from workspaces.models import (
    BYTE_RESOURCES,
    EndpointPreemption,
    PriorityClass,
    Workspace,
    WorkspaceQuota,
)

if TYPE_CHECKING:
    from tau.spec import Spec

#: Where tau.yaml sets what each resource of an endpoint's replicas is.
_SPEC_PATHS = {GPU_RESOURCE: "compute.gpus", "cpu": "compute.cpus", "memory": "compute.memory"}
_NAMES = {GPU_RESOURCE: "GPUs", "cpu": "CPUs", "memory": "memory"}


def protected(workspace: Workspace, endpoints: EndpointBackend) -> bool:
    """Whether the workspace keeps its endpoints from being preempted on this backend."""
    # Anything but an explicit "allowed" (a blank saved past the form's clean()) is never.
    return workspace.endpoint_preemption != EndpointPreemption.ALLOWED and endpoints.preempts


def described(workspace: Workspace, endpoints: EndpointBackend) -> str:
    """What the endpoint's page says of its preemption, in words."""
    if not endpoints.preempts:
        return "Nothing preempts it on this backend."
    if protected(workspace, endpoints):
        return (
            "Never: it runs at the workspace's highest priority and within its own quota "
            "(the workspace's policy)."
        )
    return "Allowed, like runs (the workspace's policy)."


def top_priority(workspace: Workspace) -> str | None:
    """The workspace's highest allowed priority class (by Kueue's value), or None when it
    allows none (everything it runs is then of one priority)."""
    allowed = [name for name in workspace.allowed_priorities or [] if isinstance(name, str)]
    if not allowed:
        return None
    found = (
        PriorityClass.objects.filter(name__in=allowed)
        .order_by("-value", "name")
        .values_list("name", flat=True)
        .first()
    )
    return str(found) if found is not None else None


def place(
    placement: Placement,
    *,
    asked: str | None,
    workspace: Workspace,
    endpoints: EndpointBackend,
) -> tuple[Placement, list[tuple[str, str]]]:
    """The placement an endpoint runs with: at the workspace's highest priority when it keeps
    its endpoints from preemption (a lower class named in ``queue.priority`` is a problem),
    else as the workspace's policy placed it."""
    if not protected(workspace, endpoints):
        return placement, []
    top = top_priority(workspace)
    if top is None or placement.priority == top:
        return placement, []
    if asked:
        return placement, [
            (
                "queue.priority",
                f"{workspace.slug} keeps its endpoints from being preempted, so they run at "
                f"its highest priority, {top!r}: leave queue.priority out or name {top!r} (or "
                "ask the platform team to allow endpoint preemption in the workspace's policy).",
            )
        ]
    allowed = list(workspace.allowed_priorities or [])
    spec = placement.spec
    queue = dataclasses.replace(spec.queue, priority=top)
    return (
        dataclasses.replace(
            placement,
            spec=dataclasses.replace(spec, queue=queue),
            priority=top,
            priority_value=allowed.index(top) if top in allowed else 0,
        ),
        [],
    )


def locked_workspace(workspace_id: int) -> Workspace:
    """The workspace, its row locked until the surrounding transaction ends, taken before an
    endpoint's own lock (``serving.state.lock_endpoint``) by every write whose quota
    :func:`quota_problems` checks: those checks then run one after another, each seeing what
    the one before wrote. A lock that keeps the key (``NO KEY UPDATE``, as
    ``serving.state.lock_endpoint``'s): rows that point at the workspace (its runs, its
    endpoints) are not held up."""
    return Workspace.unscoped_objects.select_for_update(of=("self",), no_key=True).get(
        pk=workspace_id
    )


def quota_problems(
    spec: Spec,
    *,
    replicas: int,
    workspace: Workspace,
    backend: str,
    endpoints: EndpointBackend,
    replacing: int | None = None,
) -> list[tuple[str, str]]:
    """(tau.yaml path, message) where the workspace's live endpoints on ``backend``, with
    this one at ``replicas`` replicas (``replacing``: the endpoint this is a new generation
    of, counted once), would pass its own nominal quota of a resource while it is in a
    cohort: what it borrowed a lender can take back, preempting the endpoint."""
    if not protected(workspace, endpoints) or workspace.cohort_id is None:
        return []
    held = endpoints.quota_held(spec, replicas)
    nominal: dict[str, Decimal] = defaultdict(Decimal)
    for resource, amount in WorkspaceQuota.objects.for_workspace(workspace).values_list(
        "resource", "nominal"
    ):
        nominal[resource] += amount
    others: dict[str, Decimal] = defaultdict(Decimal)
    live = Endpoint.objects.for_workspace(workspace).filter(
        backend=backend, state__in=LIVE_STATES, deleted_at__isnull=True
    )
    if replacing is not None:
        live = live.exclude(pk=replacing)
    for other_spec, other_replicas in live.values_list("spec", "replicas_desired"):
        for resource, amount in (
            endpoints.quota_held(spec_from_dict(other_spec), other_replicas)
        ).items():
            others[resource] += amount
    problems: list[tuple[str, str]] = []
    for resource, amount in held.items():
        if resource not in nominal or amount + others[resource] <= nominal[resource]:
            continue
        binary = resource in BYTE_RESOURCES
        name = _NAMES.get(resource, resource)

        def said(value: Decimal, binary: bool = binary) -> str:
            return format_quantity(value, binary=binary)

        path = "serve.replicas" if replicas > 1 else _SPEC_PATHS.get(resource, "compute")
        problems.append(
            (
                path,
                f"{workspace.slug} keeps its endpoints from being preempted, so in its cohort "
                f"they must fit its own nominal quota of {name}, {said(nominal[resource])}, "
                "which no lender can take back: "
                + (
                    f"its other live endpoints hold {said(others[resource])} and this one "
                    if others[resource]
                    else "this endpoint "
                )
                + f"would hold {said(amount)}. Ask for fewer replicas, stop another endpoint, "
                "or ask the platform team for more quota or to allow endpoint preemption.",
            )
        )
    return problems
