"""What TauGrid renders for Kueue, from rows that are never saved (executors.kubernetes.kueue is
pure): the ClusterQueue's resource groups follow Kueue's rules, every object carries TauGrid's
labels, and the comparison with a live object sees hand edits but not Kubernetes' own
additions. The cluster's verdict on these objects is in
tests/executors/kubernetes/test_kueue_sync.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from executors.kubernetes.kueue import (
    CREATED_BY_ANNOTATION,
    INSTALLATION_LABEL,
    MANAGED_BY_LABEL,
    WORKSPACE_LABEL,
    cluster_objects,
    cluster_queue_object,
    cohort_object,
    differences,
    is_managed,
    local_queue_object,
    managed_labels,
    namespace_object,
    not_ours,
    owner,
    resource_flavor_object,
    resource_groups,
    workload_priority_class_object,
    workspace_objects,
)
from workspaces.models import (
    Cohort,
    PriorityClass,
    ResourceFlavor,
    Workspace,
    WorkspaceQuota,
)

GPU = "nvidia.com/gpu"
#: The labels of workspace vision's objects, made by the default installation.
VISION_LABELS = {
    MANAGED_BY_LABEL: "taugrid",
    INSTALLATION_LABEL: "default",
    WORKSPACE_LABEL: "vision",
}
H100 = ResourceFlavor(
    name="h100",
    gpu_model="NVIDIA-H100-80GB-HBM3",
    node_labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
)
CPU_POOL = ResourceFlavor(name="cpu-pool", node_labels={"taugrid.io/node-pool": "cpu"})


def quota(
    flavor: ResourceFlavor,
    resource: str,
    nominal: str,
    borrowing: str | None = None,
    lending: str | None = None,
) -> WorkspaceQuota:
    return WorkspaceQuota(
        flavor=flavor,
        resource=resource,
        nominal=Decimal(nominal),
        borrowing_limit=None if borrowing is None else Decimal(borrowing),
        lending_limit=None if lending is None else Decimal(lending),
    )


def workspace(cohort: Cohort | None = None, **fields: Any) -> Workspace:
    return Workspace(
        slug="vision", name="Vision", namespace="tau-vision", local_queue="vision",
        cohort=cohort, **fields,
    )  # fmt: skip


def test_one_gpu_flavor_is_one_group_with_cpu_and_memory_first() -> None:
    groups = resource_groups(
        [
            quota(H100, GPU, "8"),
            quota(H100, "memory", str(512 * 2**30)),
            quota(H100, "cpu", "64.5"),
        ],
        in_cohort=False,
    )
    assert groups == [
        {
            "coveredResources": ["cpu", "memory", GPU],
            "flavors": [
                {
                    "name": "h100",
                    "resources": [
                        {"name": "cpu", "nominalQuota": "64500m"},
                        {"name": "memory", "nominalQuota": "512Gi"},
                        {"name": GPU, "nominalQuota": "8"},
                    ],
                }
            ],
        }
    ]


def test_flavors_sharing_a_resource_are_one_group_and_a_missing_row_is_zero() -> None:
    # Kueue: every flavor of a group lists the same resources, in the group's order. The CPU
    # pool has no GPU row, so it gets 0 GPUs, and in a cohort none to borrow either; it is
    # listed first so that CPU-only runs try it before the GPU nodes.
    rows = [
        quota(H100, GPU, "8", borrowing="4", lending="2"),
        quota(H100, "cpu", "96"),
        quota(CPU_POOL, "cpu", "32", borrowing="8"),
    ]
    assert resource_groups(rows, in_cohort=True) == [
        {
            "coveredResources": ["cpu", GPU],
            "flavors": [
                {
                    "name": "cpu-pool",
                    "resources": [
                        {"name": "cpu", "nominalQuota": "32", "borrowingLimit": "8"},
                        {"name": GPU, "nominalQuota": "0", "borrowingLimit": "0"},
                    ],
                },
                {
                    "name": "h100",
                    "resources": [
                        {"name": "cpu", "nominalQuota": "96"},
                        {
                            "name": GPU,
                            "nominalQuota": "8",
                            "borrowingLimit": "4",
                            "lendingLimit": "2",
                        },
                    ],
                },
            ],
        }
    ]
    # Outside a cohort there are no limits at all (Kueue refuses them there).
    without = resource_groups(rows, in_cohort=False)
    assert not any(
        "borrowingLimit" in resource or "lendingLimit" in resource
        for group in without
        for flavor in group["flavors"]
        for resource in flavor["resources"]
    )


def test_flavors_with_nothing_in_common_are_separate_groups() -> None:
    fpga = ResourceFlavor(name="fpga")
    groups = resource_groups(
        [quota(fpga, "example.com/fpga", "2"), quota(CPU_POOL, "cpu", "4")], in_cohort=False
    )
    assert [group["coveredResources"] for group in groups] == [["cpu"], ["example.com/fpga"]]
    assert [[f["name"] for f in group["flavors"]] for group in groups] == [["cpu-pool"], ["fpga"]]
    assert resource_groups([], in_cohort=False) == []


def test_cluster_queue_selects_only_the_workspace_namespace_with_its_policy() -> None:
    research = Cohort(pk=1, name="research")  # rows as loaded: with their ids
    queue = cluster_queue_object(workspace(research), [quota(H100, GPU, "8")])
    assert queue["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert queue["metadata"] == {
        "name": "tau-vision",
        "labels": {
            MANAGED_BY_LABEL: "taugrid",
            INSTALLATION_LABEL: "default",
            WORKSPACE_LABEL: "vision",
        },
    }
    spec = queue["spec"]
    assert spec["namespaceSelector"] == {
        "matchLabels": {WORKSPACE_LABEL: "vision", "kubernetes.io/metadata.name": "tau-vision"}
    }
    assert spec["cohortName"] == "research"
    assert spec["preemption"] == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "Any",
    }
    alone = cluster_queue_object(
        workspace(preemption_within_queue="Never", preemption_reclaim_in_cohort=""), []
    )
    assert "cohortName" not in alone["spec"]
    assert alone["spec"]["resourceGroups"] == []
    # Blank means TauGrid's default, as in the admin.
    assert alone["spec"]["preemption"] == {
        "withinClusterQueue": "Never",
        "reclaimWithinCohort": "Any",
    }


def test_namespace_carries_the_created_by_record_only_when_taugrid_creates_it() -> None:
    created = namespace_object(workspace(), created_by_taugrid=True)
    assert created["metadata"] == {
        "name": "tau-vision",
        "labels": {
            MANAGED_BY_LABEL: "taugrid",
            INSTALLATION_LABEL: "default",
            WORKSPACE_LABEL: "vision",
        },
        "annotations": {CREATED_BY_ANNOTATION: "taugrid"},
    }
    found = namespace_object(workspace(), created_by_taugrid=False)
    assert found["metadata"] == {"name": "tau-vision", "labels": {WORKSPACE_LABEL: "vision"}}


def test_local_queue_points_at_the_cluster_queue() -> None:
    assert local_queue_object(workspace()) == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {
            "name": "vision",
            "namespace": "tau-vision",
            "labels": {
                MANAGED_BY_LABEL: "taugrid",
                INSTALLATION_LABEL: "default",
                WORKSPACE_LABEL: "vision",
            },
        },
        "spec": {"clusterQueue": "tau-vision"},
    }
    kinds = [
        obj["kind"] for obj in workspace_objects(workspace(), [], namespace_created_by_taugrid=True)
    ]
    assert kinds == ["ClusterQueue", "Namespace", "LocalQueue"]  # Kueue judges first


def test_cluster_wide_objects() -> None:
    assert resource_flavor_object(H100)["spec"] == {
        "nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
    }
    parent = Cohort(pk=1, name="org")
    child = Cohort(pk=2, name="research", parent=parent)
    assert cohort_object(child)["spec"] == {"parentName": "org"}
    assert cohort_object(parent)["spec"] == {}
    high = PriorityClass(name="high", value=10000, description="Deadlines.")
    assert workload_priority_class_object(high) == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "WorkloadPriorityClass",
        "metadata": {
            "name": "high",
            "labels": {MANAGED_BY_LABEL: "taugrid", INSTALLATION_LABEL: "default"},
        },
        "value": 10000,
        "description": "Deadlines.",
    }
    objects = cluster_objects([H100, CPU_POOL], [child, parent], [high])
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ResourceFlavor", "cpu-pool"),
        ("ResourceFlavor", "h100"),
        ("Cohort", "org"),  # parents before their children
        ("Cohort", "research"),
        ("WorkloadPriorityClass", "high"),
    ]
    assert all(is_managed(obj) for obj in objects)
    assert not is_managed({"metadata": {"labels": {WORKSPACE_LABEL: "vision"}}})


def live_copy(desired: dict[str, Any]) -> dict[str, Any]:
    """``desired`` as the API server would return it: defaults, status and other labels added."""
    import copy

    live = copy.deepcopy(desired)
    live["metadata"]["labels"]["someone.else/label"] = "x"
    live["metadata"]["resourceVersion"] = "42"
    live["spec"]["queueingStrategy"] = "BestEffortFIFO"
    live["spec"]["preemption"]["borrowWithinCohort"] = {"policy": "Never"}
    live["status"] = {"pendingWorkloads": 1}
    return live


def test_differences_see_hand_edits_not_kubernetes_additions() -> None:
    desired = cluster_queue_object(
        workspace(Cohort(pk=1, name="research")), [quota(H100, GPU, "8"), quota(H100, "cpu", "1")]
    )
    live = live_copy(desired)
    assert differences(desired, live) == []
    # The API server may spell an amount differently: the same amount is no difference.
    live["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "1000m"
    assert differences(desired, live) == []

    edited = live_copy(desired)
    edited["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] = "2"
    edited["spec"]["cohortName"] = "elsewhere"
    del edited["metadata"]["labels"][WORKSPACE_LABEL]
    found = {difference.path: difference for difference in differences(desired, edited)}
    path = "spec.resourceGroups[0].flavors[0].resources[1].nominalQuota"
    assert set(found) == {path, "spec.cohortName", f"metadata.labels.{WORKSPACE_LABEL}"}
    assert (found[path].live, found[path].desired) == ("2", "8")

    # An element of an atomic list changed by hand, e.g. a limit added to a resource.
    added = live_copy(desired)
    added["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["borrowingLimit"] = "1"
    assert [d.path for d in differences(desired, added)] == [
        "spec.resourceGroups[0].flavors[0].resources[1]"
    ]
    gone = differences(desired, None)
    assert [d.path for d in gone] == ["(the whole object)"]


@pytest.mark.django_db
def test_allowed_priorities_must_name_priority_classes(world: Any) -> None:
    world.alpha.allowed_priorities = ["normal", "urgent"]
    with pytest.raises(ValidationError) as caught:
        world.alpha.full_clean()
    assert caught.value.message_dict["allowed_priorities"] == [
        "No priority class called 'urgent'; add it under Priority classes first "
        "(each name has one value everywhere)."
    ]
    PriorityClass.objects.create(name="urgent", value=5000)
    world.alpha.full_clean()
    world.alpha.save()
    assert PriorityClass.objects.get(name="urgent").workspaces_using() == ["alpha"]


@pytest.mark.django_db
def test_blank_preemption_means_the_default_and_cohorts_cannot_loop(world: Any) -> None:
    world.alpha.preemption_within_queue = ""
    world.alpha.preemption_reclaim_in_cohort = ""
    world.alpha.full_clean()
    assert (world.alpha.preemption_within_queue, world.alpha.preemption_reclaim_in_cohort) == (
        "LowerPriority",
        "Any",
    )
    child = Cohort.objects.create(name="child", parent=world.cohort)
    world.cohort.parent = child
    with pytest.raises(ValidationError) as caught:
        world.cohort.full_clean()
    assert "cannot be inside itself" in caught.value.message_dict["parent"][0]


def test_objects_carry_the_installation_and_only_its_own_are_managed(settings: Any) -> None:
    def live(**labels: str) -> dict[str, Any]:
        return {"kind": "ClusterQueue", "metadata": {"name": "tau-x", "labels": labels}}

    mine = live(**{MANAGED_BY_LABEL: "taugrid", INSTALLATION_LABEL: "eu"})
    legacy = live(**{MANAGED_BY_LABEL: "taugrid"})  # made before installations had names
    foreign = live(**{MANAGED_BY_LABEL: "someone-else"})

    settings.TAU_INSTALLATION = "eu"
    assert managed_labels("vision") == {
        MANAGED_BY_LABEL: "taugrid",
        INSTALLATION_LABEL: "eu",
        WORKSPACE_LABEL: "vision",
    }
    assert [owner(obj) for obj in (mine, legacy, foreign)] == ["eu", "default", None]
    assert [is_managed(obj) for obj in (mine, legacy, foreign)] == [True, False, False]
    assert not_ours(legacy) == (
        "it belongs to the TauGrid installation 'default', not to this one ('eu')"
    )
    assert not_ours(foreign) == f"it has no label {MANAGED_BY_LABEL}=taugrid"

    settings.TAU_INSTALLATION = "default"
    assert [is_managed(obj) for obj in (mine, legacy, foreign)] == [False, True, False]
    # The default installation's objects from before need no repair for the missing label;
    # any other difference is still one.
    queue = cluster_queue_object(workspace(), [])
    unlabelled = {**queue, "metadata": {**queue["metadata"], "labels": dict(legacy_labels())}}
    assert differences(queue, unlabelled) == []
    settings.TAU_INSTALLATION = "eu"
    labelled_eu = cluster_queue_object(workspace(), [])
    assert [d.path for d in differences(labelled_eu, unlabelled)] == [
        f"metadata.labels.{INSTALLATION_LABEL}"
    ]


def legacy_labels() -> dict[str, str]:
    return {MANAGED_BY_LABEL: "taugrid", WORKSPACE_LABEL: "vision"}
