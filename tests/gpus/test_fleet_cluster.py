"""The GPU fleet against the real control plane (deploy/cluster): the KWOK GPU nodes
``gpu-h100-1`` and ``gpu-h100-2`` (8 GPUs each, tainted ``nvidia.com/gpu``), pods placed by the
real kube-scheduler, conditions written the way node-problem-detector writes them (a strategic
merge of ``status.conditions`` through ``nodes/status``), and cordon/uncordon read back from
the Node objects.

Every node a test changes is put back when it ends (the ``gpu_nodes`` fixture: the
conditions it added removed, ``spec.unschedulable`` as it was), so the rest of the suite finds
the nodes schedulable and healthy.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

import kube as adapter
from executors.kubernetes import labels as run_labels
from gpus import actions
from gpus.fleet import sync_fleet
from gpus.models import FleetSync, GpuNode
from kube import KubeClient, new_api_client
from portal.models import AuditEvent
from tests.cluster.kueue_objects import GPU_TOLERATION, TEST_DURATION, batch_job
from tests.cluster.plugin import Kube, KubeCluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]

GPU_NODES = ("gpu-h100-1", "gpu-h100-2")
# Condition types these tests write; removed from both nodes at the end of each test.
WRITTEN_CONDITIONS = ("XIDErrors",)


@pytest.fixture(scope="module")
def admin(kube_cluster: KubeCluster) -> Iterator[KubeClient]:
    client = KubeClient(new_api_client(kube_cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture
def cluster_backend(
    kube_cluster: KubeCluster, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """TauGrid on the test cluster: TAU_BACKEND=kubernetes, the shared client from
    TAU_KUBECONFIG (as in a deployment), auto-cordon off unless a test turns it on."""
    settings.TAU_BACKEND = "kubernetes"
    settings.TAU_GPU_AUTO_CORDON = False
    monkeypatch.setenv("TAU_KUBECONFIG", str(kube_cluster.kubeconfig))
    adapter.reset_client()
    yield
    adapter.reset_client()


@pytest.fixture
def gpu_nodes(admin: KubeClient, cluster_backend: None) -> Iterator[dict[str, Any]]:
    """The GPU nodes as they were; put back afterwards."""
    before = {name: admin.get("v1", "Node", name) for name in GPU_NODES}
    yield before
    for name, node in before.items():
        admin.patch(
            "v1",
            "Node",
            name,
            {
                "status": {
                    "conditions": [
                        {"type": kind, "$patch": "delete"} for kind in WRITTEN_CONDITIONS
                    ]
                }
            },
            patch_type="strategic",
            subresource="status",
        )
        admin.patch(
            "v1",
            "Node",
            name,
            {"spec": {"unschedulable": True if node["spec"].get("unschedulable") else None}},
        )


@pytest.fixture
def staff(django_user_model: Any) -> AbstractBaseUser:
    user: AbstractBaseUser = django_user_model.objects.create_user(
        username="platform-admin", password=None, is_staff=True, is_superuser=True
    )
    return user


def set_condition(
    admin: KubeClient, node: str, kind: str, status: str, message: str, at: datetime
) -> None:
    """Write a condition as node-problem-detector does: nodes/status, merged by type."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    admin.patch(
        "v1",
        "Node",
        node,
        {
            "status": {
                "conditions": [
                    {
                        "type": kind,
                        "status": status,
                        "reason": kind if status == "True" else f"No{kind}",
                        "message": message,
                        "lastHeartbeatTime": stamp,
                        "lastTransitionTime": stamp,
                    }
                ]
            }
        },
        patch_type="strategic",
        subresource="status",
    )


def unschedulable(admin: KubeClient, node: str) -> bool:
    return bool(admin.get("v1", "Node", node)["spec"].get("unschedulable"))


def row(name: str) -> GpuNode:
    return GpuNode.objects.get(name=name)


def utc_minute() -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0)


# ---------------------------------------------------------------------------------------------


def test_a_sync_shows_both_h100_nodes_with_8_gpus(gpu_nodes: dict[str, Any]) -> None:
    result = sync_fleet()
    assert result.ok, result.error
    assert result.error == ""
    nodes = {node.name: node for node in GpuNode.objects.all()}
    assert set(GPU_NODES) <= set(nodes)
    assert not any(name.startswith("cpu-") for name in nodes), "a CPU node is in the GPU fleet"
    for name in GPU_NODES:
        node = nodes[name]
        assert node.source == "kubernetes"
        assert node.pool == "gpu-h100"
        assert node.gpu_model == "NVIDIA-H100-80GB-HBM3"
        assert (node.gpus_total, node.gpus_allocatable) == (8, 8)
        assert node.ready
        assert node.healthy, node.problems
        assert node.problems == []
        assert node.unhealthy_since is None
        assert node.cordoned is False
        assert node.taints == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        ]
        assert node.labels["nvidia.com/gpu.count"] == "8"
        types = [condition["type"] for condition in node.conditions]
        assert types[0] == "Ready"
        assert {"MemoryPressure", "DiskPressure", "PIDPressure"} <= set(types)
    sync = FleetSync.objects.get(pk=1)
    assert sync.source == "kubernetes"
    assert sync.last_error == ""
    assert sync.last_success_at == sync.last_attempt_at
    assert sync.node_count == len(nodes) == result.node_count

    # Nothing changed: nothing is written.
    again = sync_fleet()
    assert (again.created, again.updated, again.deleted) == (0, 0, 0)
    assert row("gpu-h100-1").updated_at == nodes["gpu-h100-1"].updated_at


def test_a_run_pod_holding_4_gpus_is_counted_and_listed(
    admin: KubeClient, kube: Kube, gpu_nodes: dict[str, Any]
) -> None:
    sync_fleet()
    before = {name: row(name).gpus_in_use for name in GPU_NODES}
    namespace = kube.namespace("fleet")
    job = batch_job("train-f4x9", namespace, None, gpus=4, pod_annotations={TEST_DURATION: "1h"})
    template = job["spec"]["template"]
    template["metadata"]["labels"] = {
        run_labels.WORKSPACE: "alpha",
        run_labels.RUN: "train-f4x9",
        run_labels.ATTEMPT: "1",
    }
    template["spec"]["tolerations"] = [dict(GPU_TOLERATION)]
    kube.create(job)

    def running_pod() -> dict[str, Any] | None:
        for pod in admin.list("v1", "Pod", namespace):
            if pod["status"].get("phase") == "Running" and pod["spec"].get("nodeName"):
                return pod
        return None

    pod = wait_until("the Job's pod running on a GPU node", running_pod, timeout=60)
    node_name = pod["spec"]["nodeName"]
    assert node_name in GPU_NODES, f"the scheduler put it on {node_name}"

    result = sync_fleet()
    assert result.ok, result.error
    node = row(node_name)
    assert node.gpus_in_use == before[node_name] + 4
    assert {
        "workspace": "alpha",
        "run": "train-f4x9",
        "namespace": namespace,
        "pod": pod["metadata"]["name"],
        "gpus": 4,
    } in node.runs
    other = next(name for name in GPU_NODES if name != node_name)
    assert row(other).gpus_in_use == before[other]
    # The confirmation page's list: the run, its pod, its GPUs (no such run in TauGrid here).
    affected = actions.runs_affected(node)
    assert {
        "workspace": "alpha",
        "run": "train-f4x9",
        "namespace": namespace,
        "pods": [pod["metadata"]["name"]],
        "gpus": 4,
        "state": "",
    } in affected

    # Once the pod is gone, its GPUs are free again.
    admin.delete("batch/v1", "Job", "train-f4x9", namespace)
    wait_until(
        "the Job's pods deleted",
        lambda: True if not admin.list("v1", "Pod", namespace) else None,
        timeout=60,
    )
    sync_fleet()
    assert row(node_name).gpus_in_use == before[node_name]
    assert not any(entry["run"] == "train-f4x9" for entry in row(node_name).runs)


def test_an_xid_condition_makes_the_node_unhealthy_and_its_clearing_healthy(
    admin: KubeClient, gpu_nodes: dict[str, Any]
) -> None:
    sync_fleet()
    assert row("gpu-h100-2").healthy
    at = utc_minute()
    set_condition(admin, "gpu-h100-2", "XIDErrors", "True", "XID 79 on GPU 3 (PCI:0000:3b:00)", at)

    result = sync_fleet(now=at)  # the sentence is written on the day of `at`
    assert result.ok, result.error
    node = row("gpu-h100-2")
    assert node.healthy is False
    assert node.ready is True
    assert node.problems == [f"XIDErrors since {at:%H:%M} UTC: XID 79 — GPU has fallen off the bus"]
    assert node.unhealthy_since is not None
    xid = next(c for c in node.conditions if c["type"] == "XIDErrors")
    assert xid["status"] == "True"
    assert xid["message"] == "XID 79 on GPU 3 (PCI:0000:3b:00)"
    assert (xid["gpu"], xid["problem"]) == (True, True)
    assert row("gpu-h100-1").healthy, "the other node is unaffected"
    assert node.cordoned is False, "auto-cordon is off"
    assert unschedulable(admin, "gpu-h100-2") is False

    set_condition(
        admin, "gpu-h100-2", "XIDErrors", "False", "no XID errors", at + timedelta(minutes=1)
    )
    sync_fleet()
    cleared = row("gpu-h100-2")
    assert cleared.healthy is True
    assert cleared.problems == []
    assert cleared.unhealthy_since is None


def test_cordon_and_uncordon_reach_the_node_and_the_audit_log(
    admin: KubeClient, gpu_nodes: dict[str, Any], staff: AbstractBaseUser, django_user_model: Any
) -> None:
    sync_fleet()
    node = actions.cordon_node("gpu-h100-1", actor=staff, reason="fan noise, checking it")
    assert node.cordoned is True
    assert unschedulable(admin, "gpu-h100-1") is True
    assert row("gpu-h100-1").cordoned is True
    event = AuditEvent.unscoped_objects.get(action=actions.CORDON_ACTION)
    assert event.actor_username == "platform-admin"
    assert event.object_repr == "gpu-h100-1"
    assert event.object_type == "gpus.gpunode"
    assert event.before == {"cordoned": False}
    assert event.after == {"cordoned": True, "reason": "fan noise, checking it"}

    # A sync reads it back from the Node: still cordoned, still healthy (a state, not a
    # problem), and the unschedulable taint the controller-manager adds (soon after) shows.
    unschedulable_taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}

    def tainted() -> bool | None:
        taints = admin.get("v1", "Node", "gpu-h100-1")["spec"].get("taints") or []
        return True if any(unschedulable_taint.items() <= t.items() for t in taints) else None

    wait_until("the node's unschedulable taint", tainted, timeout=30)
    sync_fleet()
    synced = row("gpu-h100-1")
    assert synced.cordoned is True
    assert synced.healthy is True
    assert {"key": "node.kubernetes.io/unschedulable", "value": "", "effect": "NoSchedule"} in (
        synced.taints
    )

    with pytest.raises(actions.NodeAlreadyInState) as already:
        actions.cordon_node("gpu-h100-1", actor=staff)
    assert already.value.message == "gpu-h100-1 is already cordoned: nothing was changed"
    assert AuditEvent.unscoped_objects.filter(action=actions.CORDON_ACTION).count() == 1

    node = actions.uncordon_node("gpu-h100-1", actor=staff, reason="fan replaced")
    assert node.cordoned is False
    assert unschedulable(admin, "gpu-h100-1") is False
    assert "unschedulable" not in admin.get("v1", "Node", "gpu-h100-1")["spec"]
    event = AuditEvent.unscoped_objects.get(action=actions.UNCORDON_ACTION)
    assert event.actor_username == "platform-admin"
    assert event.after == {"cordoned": False, "reason": "fan replaced"}

    with pytest.raises(actions.NodeActionFailed, match="no GPU node named 'cpu-1'"):
        actions.cordon_node("cpu-1", actor=staff)
    assert unschedulable(admin, "cpu-1") is False

    # Only platform staff: anyone else (or nobody) is refused before Kubernetes is asked.
    researcher = django_user_model.objects.create_user(username="researcher", password=None)
    for who in (researcher, AnonymousUser(), None):
        with pytest.raises(actions.NodeActionFailed, match="only platform staff may cordon"):
            actions.cordon_node("gpu-h100-1", actor=who)
    assert unschedulable(admin, "gpu-h100-1") is False
    assert AuditEvent.unscoped_objects.filter(action=actions.CORDON_ACTION).count() == 1


def test_a_cordon_kubernetes_does_not_answer_is_not_recorded(
    admin: KubeClient,
    gpu_nodes: dict[str, Any],
    staff: AbstractBaseUser,
    kube_cluster: KubeCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sync_fleet()
    monkeypatch.setenv("TAU_KUBECONFIG", str(unreachable_kubeconfig(kube_cluster, tmp_path)))
    adapter.reset_client()
    with pytest.raises(actions.NodeActionFailed) as failed:
        actions.cordon_node("gpu-h100-1", actor=staff, reason="testing")
    assert failed.value.message.startswith("could not cordon gpu-h100-1: cannot reach")
    assert failed.value.message.endswith("nothing was changed")
    assert row("gpu-h100-1").cordoned is False
    assert not AuditEvent.unscoped_objects.filter(action=actions.CORDON_ACTION).exists()
    assert unschedulable(admin, "gpu-h100-1") is False


def test_auto_cordon_cordons_on_an_xid_once_and_says_why(
    admin: KubeClient, gpu_nodes: dict[str, Any], staff: AbstractBaseUser, settings: Any
) -> None:
    settings.TAU_GPU_AUTO_CORDON = True
    sync_fleet()
    at = utc_minute()
    set_condition(admin, "gpu-h100-2", "XIDErrors", "True", "XID 79 on GPU 3", at)

    result = sync_fleet(now=at)  # the sentence is written on the day of `at`
    assert result.cordoned == ("gpu-h100-2",)
    assert unschedulable(admin, "gpu-h100-2") is True
    assert row("gpu-h100-2").cordoned is True
    assert unschedulable(admin, "gpu-h100-1") is False
    [event] = AuditEvent.unscoped_objects.filter(action=actions.AUTO_CORDON_ACTION)
    assert event.source == "system"
    assert event.actor_id is None
    assert event.actor_username == ""
    assert event.object_repr == "gpu-h100-2"
    assert event.after == {
        "cordoned": True,
        "reason": f"auto-cordon: XIDErrors True since {at:%H:%M} UTC: XID 79 — GPU has fallen "
        "off the bus",
        "conditions": ["XIDErrors"],
    }

    # Staff uncordon it while the XID stays: it is left alone.
    actions.uncordon_node("gpu-h100-2", actor=staff, reason="false alarm, GPU re-seated")
    assert sync_fleet().cordoned == ()
    assert unschedulable(admin, "gpu-h100-2") is False
    assert AuditEvent.unscoped_objects.filter(action=actions.AUTO_CORDON_ACTION).count() == 1

    # The condition clears, then comes back: cordoned again.
    set_condition(
        admin, "gpu-h100-2", "XIDErrors", "False", "no XID errors", at + timedelta(minutes=1)
    )
    assert sync_fleet().cordoned == ()
    set_condition(admin, "gpu-h100-2", "XIDErrors", "True", "XID 48", at + timedelta(minutes=2))
    assert sync_fleet().cordoned == ("gpu-h100-2",)
    assert unschedulable(admin, "gpu-h100-2") is True
    latest = AuditEvent.unscoped_objects.filter(action=actions.AUTO_CORDON_ACTION).first()
    assert latest is not None
    assert "XID 48 — double-bit ECC error" in (latest.after or {})["reason"]


def test_kubernetes_unreachable_leaves_the_rows_as_they_were(
    gpu_nodes: dict[str, Any], kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    assert sync_fleet().ok
    rows_before = list(GpuNode.objects.order_by("name").values())
    succeeded_at = FleetSync.objects.get(pk=1).last_success_at

    closed = KubeClient(new_api_client(unreachable_kubeconfig(kube_cluster, tmp_path)))
    try:
        result = sync_fleet(client=closed)
    finally:
        closed.close()
    assert result.ok is False
    assert result.error.startswith("cannot read the fleet from Kubernetes: cannot reach")
    assert list(GpuNode.objects.order_by("name").values()) == rows_before
    sync = FleetSync.objects.get(pk=1)
    assert sync.last_error == result.error
    assert sync.last_success_at == succeeded_at
    assert sync.last_attempt_at is not None
    assert succeeded_at is not None
    assert sync.last_attempt_at > succeeded_at

    # Back again: the error is gone.
    assert sync_fleet().ok
    assert FleetSync.objects.get(pk=1).last_error == ""


def unreachable_kubeconfig(kube_cluster: KubeCluster, tmp_path: Path) -> Path:
    """The admin kubeconfig, pointed at a loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = tmp_path / "closed-port.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path
