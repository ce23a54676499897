"""What platform staff do to GPU nodes: cordon and uncordon, audited, and what a cordon would
affect (for the confirmation page).

Cordoning sets the Node's ``spec.unschedulable`` with a JSON merge patch, as ``kubectl
cordon`` does (uncordon removes the field): the scheduler places no new pod there, and the
pods already on it, the runs in :func:`runs_affected`, keep running. Nothing is drained: a run
leaves a bad node when it fails or is cancelled, and Kueue and the retry policy put it
elsewhere.

The order is Kubernetes first, then the database: the row (``GpuNode.cordoned``) and the
audit event (``gpu.node.cordon`` / ``gpu.node.uncordon``, with the node, the reason and who)
are written in one transaction once the API server has stored the change, so a refused or
unanswered patch leaves no trace of a cordon that did not happen, only
:class:`NodeActionFailed` with a message the page can show. The live Node is read first: a
node already in the asked state (the row may be a sync behind) is left alone and
:class:`NodeAlreadyInState` says so. Auto-cordon (:mod:`gpus.fleet`) cordons through
:func:`cordon_in_cluster` and records ``gpu.node.auto_cordon`` with the system as the actor.

A sync that read the Node just before a staff action may write the old state back to the row
once; the next sync (``TAU_GPU_SYNC_SECONDS``) reads the Node again and corrects it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from django.db import transaction
from django.utils import timezone

import kube
from gpus.models import GpuNode, NodeSource
from kube import Forbidden, KubeClient, KubeError, NotFound
from portal import audit

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

__all__ = [
    "AUTO_CORDON_ACTION",
    "CORDON_ACTION",
    "UNCORDON_ACTION",
    "NodeActionFailed",
    "NodeAlreadyInState",
    "cordon_in_cluster",
    "cordon_node",
    "record_node_action",
    "runs_affected",
    "uncordon_node",
]

CORDON_ACTION: Final = "gpu.node.cordon"
UNCORDON_ACTION: Final = "gpu.node.uncordon"
AUTO_CORDON_ACTION: Final = "gpu.node.auto_cordon"
OBJECT_TYPE: Final = "gpus.gpunode"
REASON_MAX_CHARS: Final = 1000


class NodeActionFailed(Exception):
    """A cordon or uncordon did not happen; ``message`` says why, for the page."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NodeAlreadyInState(NodeActionFailed):
    """Nothing to do: the node is already cordoned (or already schedulable). Nothing was
    changed or recorded; ``node`` is the row, now matching the live Node."""

    def __init__(self, message: str, node: GpuNode) -> None:
        super().__init__(message)
        self.node = node


def cordon_node(
    name: str, *, actor: AbstractBaseUser | AnonymousUser | None, reason: str = ""
) -> GpuNode:
    """Cordon the GPU node ``name`` (``spec.unschedulable: true``) as ``actor`` (platform
    staff) and record who did it and why; the updated row. :class:`NodeAlreadyInState` when
    it already is cordoned, :class:`NodeActionFailed` when it cannot be done."""
    return _set_unschedulable(name, True, actor=actor, reason=reason)


def uncordon_node(
    name: str, *, actor: AbstractBaseUser | AnonymousUser | None, reason: str = ""
) -> GpuNode:
    """Make the GPU node ``name`` schedulable again and record who did it and why."""
    return _set_unschedulable(name, False, actor=actor, reason=reason)


def runs_affected(node: GpuNode) -> list[dict[str, Any]]:
    """The runs with pods on ``node`` (as the last sync saw it), one entry per run:
    ``workspace``, ``run``, ``namespace``, ``pods`` (names), ``gpus`` (held on this node) and
    ``state`` (the run's state in TauGrid; empty when no such run is known here). A cordon
    does not stop them; it keeps new pods, theirs included, off the node."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in node.runs if isinstance(node.runs, list) else []:
        if not isinstance(entry, dict):
            continue
        key = (str(entry.get("workspace") or ""), str(entry.get("run") or ""))
        run = grouped.setdefault(
            key,
            {
                "workspace": key[0],
                "run": key[1],
                "namespace": str(entry.get("namespace") or ""),
                "pods": [],
                "gpus": 0,
                "state": "",
            },
        )
        if entry.get("pod"):
            run["pods"].append(str(entry["pod"]))
        run["gpus"] += int(entry.get("gpus") or 0)
    for (workspace, name), state in _run_states(grouped.keys()).items():
        grouped[(workspace, name)]["state"] = state
    return sorted(grouped.values(), key=lambda run: (run["workspace"], run["run"]))


def cordon_in_cluster(name: str, *, client: KubeClient) -> None:
    """Only the Kubernetes half of a cordon (auto-cordon records its own event)."""
    _patch(client, name, True)


def record_node_action(
    node: GpuNode,
    *,
    action: str,
    actor: AbstractBaseUser | AnonymousUser | None,
    reason: str,
    cordoned: bool,
    conditions: Iterable[str] = (),
) -> None:
    """The audit event of a cordon or uncordon that happened (call inside the transaction
    that writes the row)."""
    after: dict[str, Any] = {"cordoned": cordoned, "reason": reason}
    if conditions:
        after["conditions"] = list(conditions)
    audit.record(
        action=action,
        object_type=OBJECT_TYPE,
        object_id=str(node.pk),
        object_repr=node.name,
        before={"cordoned": not cordoned},
        after=after,
        actor=actor,
    )


def _set_unschedulable(
    name: str,
    unschedulable: bool,
    *,
    actor: AbstractBaseUser | AnonymousUser | None,
    reason: str,
) -> GpuNode:
    verb = "cordon" if unschedulable else "uncordon"
    # The pages check this too; a service that changes the cluster for everyone checks it
    # itself, whoever calls it.
    if actor is None or not actor.is_authenticated or not getattr(actor, "is_staff", False):
        raise NodeActionFailed(f"only platform staff may {verb} a node: nothing was changed")
    reason = " ".join((reason or "").split())
    if len(reason) > REASON_MAX_CHARS:
        raise NodeActionFailed(
            f"the reason is {len(reason)} characters long; say it in {REASON_MAX_CHARS} or fewer"
        )
    node = GpuNode.objects.filter(name=name).first()
    if node is None:
        raise NodeActionFailed(
            f"there is no GPU node named {name!r} in the fleet (it may have gone since the "
            "page was loaded): nothing was changed"
        )
    if node.source != NodeSource.KUBERNETES:
        raise NodeActionFailed(
            f"{name} is this machine, not a Kubernetes node: only a cluster's nodes can be {verb}ed"
        )
    try:
        client = kube.client()
        live = client.get("v1", "Node", name)
    except NotFound:
        raise NodeActionFailed(
            f"the node {name} is no longer in the cluster: nothing was changed"
        ) from None
    except KubeError as error:
        raise NodeActionFailed(_failure(verb, name, error)) from None
    if bool((live.get("spec") or {}).get("unschedulable")) == unschedulable:
        if node.cordoned != unschedulable:  # the row was a sync behind
            node.cordoned = unschedulable
            node.updated_at = timezone.now()
            node.save(update_fields=["cordoned", "updated_at"])
        state = "cordoned" if unschedulable else "schedulable (not cordoned)"
        raise NodeAlreadyInState(f"{name} is already {state}: nothing was changed", node)
    _patch(client, name, unschedulable)
    with transaction.atomic():
        node = GpuNode.objects.select_for_update().get(pk=node.pk)
        node.cordoned = unschedulable
        node.updated_at = timezone.now()
        node.save(update_fields=["cordoned", "updated_at"])
        record_node_action(
            node,
            action=CORDON_ACTION if unschedulable else UNCORDON_ACTION,
            actor=actor,
            reason=reason,
            cordoned=unschedulable,
        )
    return node


def _patch(client: KubeClient, name: str, unschedulable: bool) -> None:
    verb = "cordon" if unschedulable else "uncordon"
    # None removes the field, as `kubectl uncordon` does (false is its default).
    body = {"spec": {"unschedulable": True if unschedulable else None}}
    try:
        stored = client.patch("v1", "Node", name, body)
    except NotFound:
        raise NodeActionFailed(
            f"the node {name} is no longer in the cluster: nothing was changed"
        ) from None
    except KubeError as error:
        raise NodeActionFailed(_failure(verb, name, error)) from None
    if bool((stored.get("spec") or {}).get("unschedulable")) != unschedulable:
        raise NodeActionFailed(
            f"Kubernetes accepted the {verb} of {name} but the node does not show it "
            "(an admission webhook may have changed it back): nothing was recorded"
        )


def _failure(verb: str, name: str, error: KubeError) -> str:
    if isinstance(error, Forbidden):
        return (
            f"Kubernetes did not allow TauGrid to {verb} {name}: {error.message} (the portal "
            "needs patch on nodes: deploy/rbac/clusterrole.yaml); nothing was changed"
        )
    return f"could not {verb} {name}: {error.message}; nothing was changed"


def _run_states(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The TauGrid state of each (workspace slug, run name), in one query."""
    from django.db.models import Q

    from runs.models import Run

    wanted = [key for key in keys if key[0] and key[1]]
    if not wanted:
        return {}
    match = Q()
    for workspace, name in wanted:
        match |= Q(workspace__slug=workspace, name=name)
    return {
        (workspace, name): state
        for workspace, name, state in Run.objects.unscoped()
        .filter(match)
        .values_list("workspace__slug", "name", "state")
    }
