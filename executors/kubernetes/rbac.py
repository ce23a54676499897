"""Every permission the portal needs on a cluster, in one list: the source of the shipped
ClusterRole (deploy/rbac/clusterrole.yaml) and of ``cluster_check``'s access checks.

Regenerate the role after changing :data:`REQUIRED`::

    .venv/bin/python -m executors.kubernetes.rbac > deploy/rbac/clusterrole.yaml

``tests/executors/kubernetes/test_cluster_access.py`` fails when the file and the list differ,
or when a ``*`` appears in either; ``tests/executors/kubernetes/test_cluster_check.py`` proves
on the test cluster that a ServiceAccount bound only to this role can do every operation
listed.

Decisions (least privilege; no wildcards):

- **One ClusterRole, bound cluster-wide.** Workspace namespaces are created at run time, so a
  namespaced Role would have to be bound by the portal in each new namespace, which needs the
  ``bind`` verb (an escalation path of its own). The price: reads of Secrets by name in every
  namespace. Secrets are therefore get/create/patch/delete by name only, never list or watch:
  the portal cannot enumerate them. Likewise Jobs and RayJobs may be created in any namespace,
  not only workspaces' (an admission policy limiting the portal's writes to namespaces
  labelled ``taugrid.io/workspace`` would narrow that, like namespace-guard.yaml below).
- **Namespaces: deleted only if TauGrid created them**, enforced by the cluster. The workspace
  sync deletes a namespace it created (annotation ``taugrid.io/created-by: taugrid``) when its
  workspace goes, so ``delete`` is granted; RBAC cannot limit it to those (no label or
  annotation conditions, names unknown in advance), and on its own it would let the portal
  delete ``kube-system``. deploy/rbac/namespace-guard.yaml (a ValidatingAdmissionPolicy)
  closes that: the portal's ServiceAccount may delete only a namespace carrying the
  annotation, and may set the annotation only when it creates the namespace.
- **Pods are never deleted directly.** Cancelling deletes the Job or RayJob with propagation;
  the garbage collector removes the pods.
- **The leader Lease by name.** Anyone may ``create`` a Lease (RBAC cannot name an object
  that does not exist yet), but ``get``/``update`` only the one named :data:`LEADER_LEASE`:
  the portal can never renew the controller-manager's, the scheduler's or a node's Lease.
- **CRDs by name**: ``get`` on the seven CustomResourceDefinitions whose served versions
  ``cluster_check`` reads (:data:`REQUIRED_CRDS`), nothing else of apiextensions.
- **Events of the core group only** (``v1`` Events, which the watcher reads); ``events.k8s.io``
  serves the same objects and is not used.
- ``update`` where listed is no more power than ``patch`` (both rewrite any field); it is
  granted on the objects TauGrid owns so that a read-modify-write with ``resourceVersion`` (a
  conflict-safe update) is possible besides server-side apply.
- Nodes: ``patch`` is the cordon (``spec.unschedulable``). RBAC cannot narrow a patch to one
  field; a ValidatingAdmissionPolicy could, where a platform wants that.

Nothing here imports Django or the adapter: the list is data, readable by anything.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "CLUSTER_ROLE",
    "LEADER_LEASE",
    "PORTAL_NAMESPACE",
    "PORTAL_SERVICE_ACCOUNT",
    "REQUIRED",
    "REQUIRED_CRDS",
    "Permission",
    "access_checks",
    "cluster_role",
    "render_cluster_role",
]

#: The shipped ClusterRole's name, and the ServiceAccount it is bound to (deploy/rbac/).
CLUSTER_ROLE: Final = "taugrid-portal"
#: The portal's own namespace: workspaces.models.PORTAL_NAMESPACE (never a workspace's),
#: spelt again because this module runs without Django (python -m, above).
PORTAL_NAMESPACE: Final = "taugrid"
PORTAL_SERVICE_ACCOUNT: Final = "taugrid"
#: The Lease the Kubernetes watcher holds to be the one active replica (issue 14).
LEADER_LEASE: Final = "taugrid-kube-watcher"

KUEUE: Final = "kueue.x-k8s.io"
VISIBILITY: Final = "visibility.kueue.x-k8s.io"
RAY: Final = "ray.io"

#: CRD name → the version TauGrid speaks. Kueue v1beta2 is served from Kueue v0.16 on; KubeRay
#: ``ray.io/v1`` from KubeRay v1.0 on.
REQUIRED_CRDS: Final[dict[str, str]] = {
    f"clusterqueues.{KUEUE}": "v1beta2",
    f"localqueues.{KUEUE}": "v1beta2",
    f"workloads.{KUEUE}": "v1beta2",
    f"cohorts.{KUEUE}": "v1beta2",
    f"resourceflavors.{KUEUE}": "v1beta2",
    f"workloadpriorityclasses.{KUEUE}": "v1beta2",
    f"rayjobs.{RAY}": "v1",
}

READ: Final = ("get", "list", "watch")
#: Characters of a reason per comment line in the generated YAML.
COMMENT_WIDTH: Final = 94
#: Longest line of a rule before a list is written one item per line.
LINE_WIDTH: Final = 96
MANAGE: Final = (*READ, "create", "patch", "update", "delete")


@dataclass(frozen=True)
class Permission:
    """Verbs on one resource (``group`` "" is the core group), and why the portal needs them.

    ``resource_names`` limits the rule to those objects (RBAC's ``resourceNames``); empty means
    every object of the resource, in every namespace (the role is bound cluster-wide).
    """

    group: str
    resource: str
    verbs: tuple[str, ...]
    why: str
    subresource: str | None = None
    resource_names: tuple[str, ...] = ()

    @property
    def rbac_resource(self) -> str:
        """The resource as a Role rule names it: ``pods/log`` for a subresource."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    @property
    def label(self) -> str:
        """``pods/log``, ``clusterqueues.kueue.x-k8s.io``: as ``kubectl auth can-i`` reads."""
        return f"{self.rbac_resource}.{self.group}" if self.group else self.rbac_resource

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "apiGroups": [self.group],
            "resources": [self.rbac_resource],
            "verbs": list(self.verbs),
        }
        if self.resource_names:
            rule["resourceNames"] = list(self.resource_names)
        return rule


REQUIRED: Final[tuple[Permission, ...]] = (
    Permission(
        "",
        "namespaces",
        (*READ, "create", "patch", "update", "delete"),
        "each workspace's namespace: created if missing and labelled taugrid.io/workspace; "
        "deleted with its workspace only if TauGrid created it (namespace-guard.yaml "
        "enforces that)",
    ),
    Permission(
        KUEUE,
        "clusterqueues",
        MANAGE,
        "each workspace's ClusterQueue (quotas, cohort, preemption), kept in step by the sync "
        "and the drift check; its status is the quota use pages show",
    ),
    Permission(
        KUEUE,
        "localqueues",
        MANAGE,
        "each workspace's LocalQueue in its namespace; runs are labelled with it",
    ),
    Permission(KUEUE, "cohorts", MANAGE, "cohorts (and their parents) from the admin"),
    Permission(
        KUEUE,
        "resourceflavors",
        MANAGE,
        "flavors from the admin: node labels and tolerations Kueue puts on admitted pods",
    ),
    Permission(
        KUEUE,
        "workloadpriorityclasses",
        MANAGE,
        "the priorities runs may ask for (kueue.x-k8s.io/priority-class)",
    ),
    Permission(
        KUEUE,
        "workloads",
        READ,
        "Kueue's Workload of each run: admission, eviction, preemption (the watcher)",
    ),
    Permission(
        VISIBILITY,
        "clusterqueues",
        ("get",),
        "queue positions of pending runs, per ClusterQueue (Kueue's visibility API)",
        subresource="pendingworkloads",
    ),
    Permission(
        VISIBILITY,
        "localqueues",
        ("get",),
        "queue positions of pending runs, per workspace LocalQueue (Kueue's visibility API)",
        subresource="pendingworkloads",
    ),
    Permission(
        RAY,
        "rayjobs",
        (*READ, "create", "patch", "delete"),
        "a run's RayJob: created on delivery, followed by the watcher, deleted on cancel",
    ),
    Permission(
        "batch",
        "jobs",
        (*READ, "create", "patch", "delete"),
        "a run's batch Job: created on delivery, followed by the watcher, deleted on cancel",
    ),
    Permission(
        RAY,
        "rayjobs",
        ("update",),
        "the run's token Secret is owned by its RayJob with blockOwnerDeletion; API servers "
        "that enforce owner-reference permissions (OwnerReferencesPermissionEnforcement, e.g. "
        "OpenShift) ask for this",
        subresource="finalizers",
    ),
    Permission(
        "batch",
        "jobs",
        ("update",),
        "the same for a Job's token Secret and rendezvous Service",
        subresource="finalizers",
    ),
    Permission(
        RAY,
        "rayservices",
        ("get", "create", "update", "delete"),
        "an endpoint's RayService: made or replaced on delivery, read by the watcher every 2 s, "
        "deleted on stop",
    ),
    Permission(
        RAY,
        "rayservices",
        ("update",),
        "an endpoint's token Secret and route are owned by its RayService with "
        "blockOwnerDeletion (as a run's by its RayJob)",
        subresource="finalizers",
    ),
    Permission(
        RAY,
        "rayclusters",
        ("get", "list"),
        "an endpoint's Ray clusters (KubeRay makes them for its RayService): their Kueue "
        "Workload while it waits, their pods for its logs",
    ),
    Permission(
        "networking.k8s.io",
        "ingresses",
        ("get", "create", "update"),
        "an endpoint's Ingress where TAU_ENDPOINT_ROUTE=ingress: made or replaced on "
        "delivery, owned by the endpoint's RayService (deleted with it)",
    ),
    Permission(
        "gateway.networking.k8s.io",
        "httproutes",
        ("get", "create", "update"),
        "an endpoint's HTTPRoute where TAU_ENDPOINT_ROUTE=gateway: made or replaced on "
        "delivery, owned by the endpoint's RayService (deleted with it)",
    ),
    Permission(
        "",
        "services",
        ("get", "create", "delete"),
        "a multi-worker Job's headless rendezvous Service (pod DNS names for torchrun), "
        "created on delivery, deleted with its Job",
    ),
    Permission(
        "",
        "secrets",
        ("get", "create", "patch", "delete"),
        "each run's token Secret, by name only (never list or watch: the portal cannot "
        "enumerate Secrets)",
    ),
    Permission(
        "",
        "pods",
        READ,
        "a run's pods: state, node, exit codes and reasons for the watcher and the run page",
    ),
    Permission(
        "",
        "pods",
        ("get",),
        "logs shown on the run page and archived when an attempt ends",
        subresource="log",
    ),
    Permission(
        "",
        "events",
        READ,
        "warning events (FailedScheduling, image pulls) shown as a run's waiting reason",
    ),
    Permission(
        "",
        "nodes",
        (*READ, "patch"),
        "the GPU fleet page (capacity, conditions, taints), cordon/uncordon "
        "(spec.unschedulable), and the watcher's XID conditions under a failed run",
    ),
    Permission(
        "coordination.k8s.io",
        "leases",
        ("create",),
        f"the watcher's leader Lease, created once (RBAC cannot name an object not yet "
        f"created; get and update are for {LEADER_LEASE} only)",
    ),
    Permission(
        "coordination.k8s.io",
        "leases",
        ("get", "update"),
        "one watcher replica active at a time (leader election)",
        resource_names=(LEADER_LEASE,),
    ),
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("get",),
        "cluster_check reads which versions Kueue's and KubeRay's CRDs serve",
        resource_names=tuple(REQUIRED_CRDS),
    ),
    Permission(
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        ("create",),
        "cluster_check asks the API server what this identity may do",
    ),
    Permission(
        "authentication.k8s.io",
        "selfsubjectreviews",
        ("create",),
        "cluster_check says which identity it checked",
    ),
)


def access_checks(
    permissions: Iterable[Permission] = REQUIRED,
) -> Iterator[tuple[Permission, str, str | None]]:
    """Every (permission, verb, name) to ask the API server about: one question per verb,
    and per object where a rule names objects."""
    for permission in permissions:
        for verb in permission.verbs:
            for name in permission.resource_names or (None,):
                yield permission, verb, name


def cluster_role(name: str = CLUSTER_ROLE) -> dict[str, Any]:
    """The ClusterRole granting :data:`REQUIRED`, one rule per permission."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "taugrid",
                "app.kubernetes.io/component": "portal",
            },
        },
        "rules": [permission.rule() for permission in REQUIRED],
    }


def _sequence(key: str, values: list[str]) -> list[str]:
    """``  key: ["a", "b"]`` (a JSON array is a YAML flow sequence), or a block sequence when
    that line would be long."""
    line = f"  {key}: {json.dumps(values)}"
    if len(line) <= LINE_WIDTH:
        return [line]
    return [f"  {key}:", *(f"  - {json.dumps(value)}" for value in values)]


def render_cluster_role() -> str:
    """deploy/rbac/clusterrole.yaml as it must read: :func:`cluster_role`, with each rule's
    reason as a comment."""
    role = cluster_role()
    lines = [
        "# The permissions TauGrid's portal needs, and nothing more (no wildcards).",
        "# Generated from executors/kubernetes/rbac.py (REQUIRED); do not edit by hand:",
        "#   .venv/bin/python -m executors.kubernetes.rbac > deploy/rbac/clusterrole.yaml",
        "# tests/executors/kubernetes/test_cluster_access.py fails when this file and the list",
        "# differ.",
        "# Bound to the ServiceAccount taugrid/taugrid in binding.yaml;",
        "# `manage.py cluster_check` verifies a cluster grants all of it.",
        f"apiVersion: {role['apiVersion']}",
        f"kind: {role['kind']}",
        "metadata:",
        f"  name: {role['metadata']['name']}",
        "  labels:",
        *(f"    {key}: {value}" for key, value in role["metadata"]["labels"].items()),
        "rules:",
        render_rules().rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def render_rules() -> str:
    """The ClusterRole's ``rules:`` list, each rule after its reason as a comment: the body of
    deploy/rbac/clusterrole.yaml and of the Helm chart's ``files/clusterrole-rules.yaml``."""
    lines: list[str] = []
    for permission, rule in zip(REQUIRED, cluster_role()["rules"], strict=True):
        reason = f"{permission.label}: {permission.why}"
        lines.extend(f"# {line}" for line in textwrap.wrap(reason, COMMENT_WIDTH))
        entry = [
            line
            for key in ("apiGroups", "resources", "resourceNames", "verbs")
            if key in rule
            for line in _sequence(key, rule[key])
        ]
        lines.append("-" + entry[0][1:])
        lines.extend(entry[1:])
    return "\n".join(lines) + "\n"


HELM_RULES_HEADER = (
    "# The rules of the chart's ClusterRole (templates/clusterrole.yaml), the same as\n"
    "# deploy/rbac/clusterrole.yaml. Generated from executors/kubernetes/rbac.py; do not edit:\n"
    "#   .venv/bin/python -m executors.kubernetes.rbac --helm-rules \\\n"
    "#     > deploy/helm/taugrid/files/clusterrole-rules.yaml\n"
)


if __name__ == "__main__":
    if sys.argv[1:] == ["--helm-rules"]:
        sys.stdout.write(HELM_RULES_HEADER + render_rules())
    else:
        sys.stdout.write(render_cluster_role())
