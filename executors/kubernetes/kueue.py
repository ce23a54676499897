"""What Kueue should hold, rendered from TauGrid's rows: pure functions, no database, no cluster.

Each workspace is three objects, and the platform's flavors, cohorts and priority classes are
cluster-wide objects beside them (Kueue ``v1beta2``, the version its CRDs store since v0.16):

- a **Namespace** (the workspace's ``namespace``), labelled ``taugrid.io/workspace=<slug>``. When
  TauGrid creates it, it also carries ``app.kubernetes.io/managed-by: taugrid`` and the
  annotation ``taugrid.io/created-by: taugrid``; a namespace that existed before gets the
  workspace label only, is used as it is, and is never deleted (the annotation is the record of
  who created it: it is set only on a namespace TauGrid created, and kept on it after).
- a **ClusterQueue** named ``tau-<slug>`` (:func:`workspaces.models.cluster_queue_name`; cluster
  queues are cluster-wide, and the prefix keeps TauGrid's apart from hand-made ones) whose
  ``namespaceSelector`` matches the workspace's namespace only: both its workspace label and
  ``kubernetes.io/metadata.name``, which the API server sets and nobody can change, so
  labelling another namespace by hand does not open the queue to it. Its resource groups come
  from the workspace's quota rows (see :func:`resource_groups`), ``cohortName`` from its cohort,
  ``preemption`` from the workspace's two preemption fields.
- a **LocalQueue** (the workspace's ``local_queue``) in that namespace, pointing at the
  ClusterQueue.
- cluster-wide: a **ResourceFlavor** per flavor row (node labels and tolerations, which Kueue
  puts on the pods it admits), a **Cohort** per cohort row (``spec.parentName`` for a nested
  one), a **WorkloadPriorityClass** per priority class row.

Every object TauGrid renders carries ``app.kubernetes.io/managed-by: taugrid`` and
``taugrid.io/installation: <TAU_INSTALLATION>`` (the namespace only when TauGrid created it),
and ``taugrid.io/workspace`` where it belongs to one workspace. An object without the
managed-by label, or with another installation's name, is never changed or deleted
(``kueue_cluster``): several portals can share a cluster. One with the managed-by label and
no installation label was made before installations had names, and is the ``default``
installation's.

:func:`differences` compares a rendered object with the live one, field by field, so that a
drift check can say what someone changed by hand and put it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from django.conf import settings

from tau.quantity import QuantityError, format_quantity, parse_quantity
from workspaces.kueue_coverage import resource_groups_of
from workspaces.models import (
    BYTE_RESOURCES,
    Cohort,
    PriorityClass,
    ReclaimWithinCohort,
    ResourceFlavor,
    WithinClusterQueue,
    Workspace,
    WorkspaceQuota,
    cluster_queue_name,
)

KUEUE_API: Final = "kueue.x-k8s.io/v1beta2"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "taugrid"
INSTALLATION_LABEL: Final = "taugrid.io/installation"
#: Whose objects without an installation label are (made before installations had names).
DEFAULT_INSTALLATION: Final = "default"
WORKSPACE_LABEL: Final = "taugrid.io/workspace"
CREATED_BY_ANNOTATION: Final = "taugrid.io/created-by"
# Set by the API server on every namespace, immutable: selects exactly one namespace.
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
# Resources listed first in a resource group, then the others by name.
FIRST_RESOURCES: Final = ("cpu", "memory")
# Keys whose values are Kubernetes quantities: "1000m" and "1" are the same amount.
QUANTITY_KEYS: Final = frozenset({"nominalQuota", "borrowingLimit", "lendingLimit"})

Body = dict[str, Any]


def installation() -> str:
    """This installation's name (``TAU_INSTALLATION``)."""
    return str(settings.TAU_INSTALLATION)


def managed_labels(workspace_slug: str | None = None) -> dict[str, str]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY, INSTALLATION_LABEL: installation()}
    if workspace_slug:
        labels[WORKSPACE_LABEL] = workspace_slug
    return labels


def owner(live: Mapping[str, Any] | None) -> str | None:
    """The TauGrid installation a live object belongs to, or None: not TauGrid's."""
    labels = ((live or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return None
    return str(labels.get(INSTALLATION_LABEL) or DEFAULT_INSTALLATION)


def is_managed(live: Mapping[str, Any] | None) -> bool:
    """Whether a live object is this installation's: TauGrid's managed-by label and this
    installation's name (only then may TauGrid change or delete it)."""
    return owner(live) == installation()


def is_another_installations(live: Mapping[str, Any] | None) -> bool:
    """Whether a live object is TauGrid's, but another installation's (not merely not
    TauGrid's: an unlabelled namespace is used as it is, another installation's is not)."""
    return owner(live) not in {None, installation()}


def not_ours(live: Mapping[str, Any]) -> str:
    """Why TauGrid leaves ``live`` alone, for messages: whose it is."""
    found = owner(live)
    if found is None:
        return f"it has no label {MANAGED_BY_LABEL}={MANAGED_BY}"
    return f"it belongs to the TauGrid installation {found!r}, not to this one ({installation()!r})"


def created_by_taugrid(live: Mapping[str, Any] | None) -> bool:
    annotations = ((live or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(CREATED_BY_ANNOTATION) == MANAGED_BY


def describe(obj: Mapping[str, Any]) -> str:
    """``ClusterQueue tau-vision`` / ``LocalQueue tau-vision/vision``: how messages name it."""
    metadata = obj.get("metadata") or {}
    name = metadata.get("name", "?")
    namespace = metadata.get("namespace")
    return (
        f"{obj.get('kind', '?')} {namespace}/{name}" if namespace else f"{obj.get('kind')} {name}"
    )


# -- one workspace ----------------------------------------------------------------------------


def namespace_object(workspace: Workspace, *, created_by_taugrid: bool) -> Body:
    """The workspace's namespace. ``created_by_taugrid``: it does not exist yet (TauGrid is
    about to create it) or it carries TauGrid's created-by annotation already."""
    metadata: Body = {"name": workspace.namespace}
    if created_by_taugrid:
        metadata["labels"] = managed_labels(workspace.slug)
        metadata["annotations"] = {CREATED_BY_ANNOTATION: MANAGED_BY}
    else:
        metadata["labels"] = {WORKSPACE_LABEL: workspace.slug}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def cluster_queue_object(workspace: Workspace, quotas: Sequence[WorkspaceQuota]) -> Body:
    """The workspace's ClusterQueue. ``quotas``: its quota rows with their flavor loaded."""
    cohort: Cohort | None = workspace.cohort if workspace.cohort_id is not None else None
    spec: Body = {
        "namespaceSelector": {
            "matchLabels": {
                WORKSPACE_LABEL: workspace.slug,
                NAMESPACE_NAME_LABEL: workspace.namespace,
            }
        },
        "resourceGroups": resource_groups(quotas, in_cohort=cohort is not None),
        "preemption": {
            "withinClusterQueue": workspace.preemption_within_queue
            or WithinClusterQueue.LOWER_PRIORITY.value,
            "reclaimWithinCohort": workspace.preemption_reclaim_in_cohort
            or ReclaimWithinCohort.ANY.value,
        },
    }
    if cohort is not None:
        spec["cohortName"] = cohort.name
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {
            "name": cluster_queue_name(workspace.slug),
            "labels": managed_labels(workspace.slug),
        },
        "spec": spec,
    }


def local_queue_object(workspace: Workspace) -> Body:
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {
            "name": workspace.local_queue,
            "namespace": workspace.namespace,
            "labels": managed_labels(workspace.slug),
        },
        "spec": {"clusterQueue": cluster_queue_name(workspace.slug)},
    }


@dataclass(frozen=True)
class _Amounts:
    nominal: Decimal
    borrowing_limit: Decimal | None
    lending_limit: Decimal | None


def _resource_order(resource: str) -> tuple[int, str]:
    if resource in FIRST_RESOURCES:
        return FIRST_RESOURCES.index(resource), resource
    return len(FIRST_RESOURCES), resource


def resource_groups(quotas: Iterable[WorkspaceQuota], *, in_cohort: bool) -> list[Body]:
    """Kueue resource groups for a workspace's quota rows.

    Kueue's rules (its ClusterQueue webhook and CRD): a resource belongs to one group and a
    flavor to one group; every flavor of a group lists exactly the group's
    ``coveredResources``, in that order; limits exist only in a cohort. So:

    - Groups are the connected parts of "flavor F has a row for resource R"
      (:func:`workspaces.kueue_coverage.resource_groups_of`, which the submission's check
      uses too): a flavor and every resource it has a row for are in one group, and a
      resource shared by two flavors joins them. The usual shape, an H100 flavor with
      ``nvidia.com/gpu``, ``cpu`` and ``memory`` and a CPU flavor with ``cpu`` and ``memory``,
      is one group.
    - A flavor without a row for one of its group's resources gets ``nominalQuota: 0`` for it,
      and in a cohort ``borrowingLimit: 0`` too: no row means none of it, borrowed or not.
    - Flavors are listed flavors without a GPU model first, then by name: Kueue tries them in
      order, so a CPU-only run lands on CPU nodes when those have room, and a GPU run skips
      a flavor that has no GPUs. Resources: ``cpu``, ``memory``, then the others by name.
    - Amounts are quantities as people write them (``64Gi``, ``500m``, ``8``).
    """
    amounts: dict[tuple[str, str], _Amounts] = {}
    gpu_flavors: set[str] = set()
    for quota in quotas:
        flavor: ResourceFlavor = quota.flavor
        amounts[(flavor.name, quota.resource)] = _Amounts(
            quota.nominal,
            quota.borrowing_limit if in_cohort else None,
            quota.lending_limit if in_cohort else None,
        )
        if flavor.gpu_model:
            gpu_flavors.add(flavor.name)

    rendered: list[Body] = []
    for group in resource_groups_of(amounts):
        covered = sorted(group.resources, key=_resource_order)
        ordered_flavors = sorted(group.flavors, key=lambda name: (name in gpu_flavors, name))
        rendered.append(
            {
                "coveredResources": covered,
                "flavors": [
                    {
                        "name": flavor_name,
                        "resources": [
                            _resource_quota(
                                resource, amounts.get((flavor_name, resource)), in_cohort
                            )
                            for resource in covered
                        ],
                    }
                    for flavor_name in ordered_flavors
                ],
            }
        )
    rendered.sort(key=lambda group: _resource_order(group["coveredResources"][0]))
    return rendered


def _quantity(value: Decimal, resource: str) -> str:
    return format_quantity(value, binary=resource in BYTE_RESOURCES)


def _resource_quota(resource: str, amounts: _Amounts | None, in_cohort: bool) -> Body:
    if amounts is None:  # no row: none of it, and none to borrow
        quota: Body = {"name": resource, "nominalQuota": "0"}
        if in_cohort:
            quota["borrowingLimit"] = "0"
        return quota
    quota = {"name": resource, "nominalQuota": _quantity(amounts.nominal, resource)}
    if amounts.borrowing_limit is not None:
        quota["borrowingLimit"] = _quantity(amounts.borrowing_limit, resource)
    if amounts.lending_limit is not None:
        quota["lendingLimit"] = _quantity(amounts.lending_limit, resource)
    return quota


def workspace_objects(
    workspace: Workspace, quotas: Sequence[WorkspaceQuota], *, namespace_created_by_taugrid: bool
) -> list[Body]:
    """The workspace's objects in the order they are applied: the ClusterQueue first (Kueue's
    webhook judges it; a refusal must leave everything else as it was), then the namespace,
    then the LocalQueue in it."""
    return [
        cluster_queue_object(workspace, quotas),
        namespace_object(workspace, created_by_taugrid=namespace_created_by_taugrid),
        local_queue_object(workspace),
    ]


# -- cluster-wide -----------------------------------------------------------------------------


def resource_flavor_object(flavor: ResourceFlavor) -> Body:
    labels = flavor.node_labels if isinstance(flavor.node_labels, dict) else {}
    tolerations = flavor.tolerations if isinstance(flavor.tolerations, list) else []
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": flavor.name, "labels": managed_labels()},
        "spec": {"nodeLabels": dict(labels), "tolerations": [dict(t) for t in tolerations]},
    }


def cohort_object(cohort: Cohort) -> Body:
    spec: Body = {}
    if cohort.parent_id is not None:
        spec["parentName"] = cohort.parent.name if cohort.parent is not None else ""
    return {
        "apiVersion": KUEUE_API,
        "kind": "Cohort",
        "metadata": {"name": cohort.name, "labels": managed_labels()},
        "spec": spec,
    }


def workload_priority_class_object(priority_class: PriorityClass) -> Body:
    body: Body = {
        "apiVersion": KUEUE_API,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": priority_class.name, "labels": managed_labels()},
        "value": priority_class.value,
    }
    if priority_class.description:
        body["description"] = priority_class.description
    return body


def cluster_objects(
    flavors: Iterable[ResourceFlavor],
    cohorts: Iterable[Cohort],
    priority_classes: Iterable[PriorityClass],
) -> list[Body]:
    """Flavors, cohorts (parents before their children) and priority classes."""
    by_name = {cohort.name: cohort for cohort in cohorts}

    def depth(cohort: Cohort) -> int:
        steps, seen = 0, {cohort.name}
        while cohort.parent_id is not None and cohort.parent is not None:
            cohort = by_name.get(cohort.parent.name, cohort.parent)
            if cohort.name in seen:
                break
            seen.add(cohort.name)
            steps += 1
        return steps

    return [
        *(resource_flavor_object(flavor) for flavor in sorted(flavors, key=lambda f: f.name)),
        *(
            cohort_object(cohort)
            for cohort in sorted(by_name.values(), key=lambda c: (depth(c), c.name))
        ),
        *(
            workload_priority_class_object(pc)
            for pc in sorted(priority_classes, key=lambda p: p.name)
        ),
    ]


# -- comparing with the live object ----------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One field where the live object is not what TauGrid renders (``live`` None: missing)."""

    path: str
    desired: Any
    live: Any


_MISSING = object()


def differences(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> list[Difference]:
    """Where ``live`` differs from ``desired`` in the fields TauGrid sets.

    Maps (the object, its ``metadata.labels``, ``spec``) are compared on the keys TauGrid
    renders only: what Kubernetes and Kueue add (defaults, status, other labels) is not a
    difference. Lists are compared whole, element by element, as Kueue declares them atomic
    (TauGrid owns all of ``resourceGroups``): an element added or changed by hand is one.
    Quantities are compared as amounts. ``live`` None: the whole object is missing.
    """
    if live is None:
        return [Difference("(the whole object)", "present", None)]
    found: list[Difference] = []
    for key, value in desired.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "metadata":
            live_metadata = live.get("metadata") or {}
            for part in ("labels", "annotations"):
                _compare_map(
                    value.get(part) or {},
                    live_metadata.get(part) or {},
                    f"metadata.{part}",
                    found,
                )
            continue
        _compare(value, live.get(key, _MISSING), key, found, key)
    return found


def _compare_map(
    desired: Mapping[str, Any], live: Mapping[str, Any], path: str, found: list[Difference]
) -> None:
    for key, value in desired.items():
        if (
            path == "metadata.labels"
            and key == INSTALLATION_LABEL
            and key not in live
            and value == DEFAULT_INSTALLATION
        ):
            continue  # made before installations had names: the default one's, no hand edit
        _compare(value, live.get(key, _MISSING), f"{path}.{key}", found, key)


def _compare(desired: Any, live: Any, path: str, found: list[Difference], key: str) -> None:
    if isinstance(desired, dict) and isinstance(live, dict):
        _compare_map(desired, live, path, found)
        return
    if isinstance(desired, list) and isinstance(live, list):
        if len(desired) != len(live):
            found.append(Difference(path, desired, live))
            return
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            if isinstance(want, dict) and isinstance(have, dict):
                extra = set(have) - set(want)
                if extra:
                    found.append(Difference(f"{path}[{index}]", want, have))
                    continue
            _compare(want, have, f"{path}[{index}]", found, key)
        return
    if live is _MISSING:
        found.append(Difference(path, desired, None))
    elif not _same_value(desired, live, key):
        found.append(Difference(path, desired, live))


def _same_value(desired: Any, live: Any, key: str) -> bool:
    if key in QUANTITY_KEYS and isinstance(desired, str | int) and isinstance(live, str | int):
        try:
            return parse_quantity(desired) == parse_quantity(live)
        except QuantityError:
            return False
    return bool(desired == live)
