"""What the fleet shows of each GPU node (gpus/fleet.py ``node_views``), as a table.

The node is the test cluster's ``gpu-h100-1`` (deploy/cluster/nodes/gpu-h100.yaml: the
labels GPU Feature Discovery sets, the ``nvidia.com/gpu`` taint, 8 GPUs) with the standard
conditions as KWOK's node stages wrote them on the test cluster (captured from
``GET /api/v1/nodes/gpu-h100-1``); each row changes what it is about: allocatable lowered as
the NVIDIA device plugin lowers it for a bad GPU, conditions in the shape node-problem-detector
plugins write (type, status, reason, message, transition time), pods in the shape the API
server returns them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from executors.kubernetes import labels as run_labels
from gpus.fleet import (
    NodeView,
    explain_message,
    looks_gpu_related,
    node_views,
    pod_gpus,
    problem_sentence,
)
from workspaces.models import ResourceFlavor

Body = dict[str, Any]

NODES = Path(__file__).resolve().parents[2] / "deploy" / "cluster" / "nodes" / "gpu-h100.yaml"
NOW = datetime(2026, 12, 1, 19, 40, tzinfo=UTC)
HEALTH_CONDITIONS = (
    "GPUMissing",
    "XIDErrors",
    "NVLinkStatusInactive",
    "IBLinkFlapping",
    "GPUClockThrottling",
    "UnhealthyNvidiaDevicePlugin",
    "SiteBurnInFailed",  # a site's own check, GPU-related only because it is configured
)
# As KWOK's node-initialize stage writes them on the test cluster (captured).
KWOK_CONDITIONS: list[Body] = [
    {
        "type": "Ready",
        "status": "True",
        "lastHeartbeatTime": "2026-12-01T19:36:54Z",
        "lastTransitionTime": "2026-12-01T19:32:50Z",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
    },
    {
        "type": "MemoryPressure",
        "status": "False",
        "lastHeartbeatTime": "2026-12-01T19:36:54Z",
        "lastTransitionTime": "2026-12-01T19:32:50Z",
        "reason": "KubeletHasSufficientMemory",
        "message": "kubelet has sufficient memory available",
    },
    {
        "type": "DiskPressure",
        "status": "False",
        "lastHeartbeatTime": "2026-12-01T19:36:54Z",
        "lastTransitionTime": "2026-12-01T19:32:50Z",
        "reason": "KubeletHasNoDiskPressure",
        "message": "kubelet has no disk pressure",
    },
    {
        "type": "PIDPressure",
        "status": "False",
        "lastHeartbeatTime": "2026-12-01T19:36:54Z",
        "lastTransitionTime": "2026-12-01T19:32:50Z",
        "reason": "KubeletHasSufficientPID",
        "message": "kubelet has sufficient PID available",
    },
    {
        "type": "NetworkUnavailable",
        "status": "False",
        "lastHeartbeatTime": "2026-12-01T19:36:54Z",
        "lastTransitionTime": "2026-12-01T19:32:50Z",
        "reason": "RouteCreated",
        "message": "RouteController created a route",
    },
]


def h100_node(name: str = "gpu-h100-1") -> Body:
    for document in yaml.safe_load_all(NODES.read_text()):
        if document and document["metadata"]["name"] == name:
            body: Body = document
            body["status"]["conditions"] = copy.deepcopy(KWOK_CONDITIONS)
            return body
    raise AssertionError(f"{name} is not in {NODES}")


def cpu_node() -> Body:
    return {
        "metadata": {"name": "cpu-1", "labels": {"taugrid.io/node-pool": "cpu"}},
        "spec": {},
        "status": {
            "capacity": {"cpu": "32", "memory": "128Gi"},
            "allocatable": {"cpu": "31850m", "memory": "124Gi"},
            "conditions": copy.deepcopy(KWOK_CONDITIONS),
        },
    }


def condition(
    kind: str, status: str, message: str = "", *, at: str = "2026-12-01T12:03:00Z", reason: str = ""
) -> Body:
    return {
        "type": kind,
        "status": status,
        "reason": reason or kind,
        "message": message,
        "lastHeartbeatTime": "2026-12-01T19:39:00Z",
        "lastTransitionTime": at,
    }


def set_condition(node: Body, entry: Body) -> None:
    conditions = node["status"]["conditions"]
    for index, existing in enumerate(conditions):
        if existing["type"] == entry["type"]:
            conditions[index] = entry
            return
    conditions.append(entry)


def container(
    name: str = "main", *, requests: str | None = None, limits: str | None = None, **extra: Any
) -> Body:
    resources: Body = {}
    if requests is not None:
        resources["requests"] = {"cpu": "1", "nvidia.com/gpu": requests}
    if limits is not None:
        resources["limits"] = {"nvidia.com/gpu": limits}
    return {"name": name, "image": "busybox", "resources": resources, **extra}


def pod(
    name: str,
    *,
    node: str | None = "gpu-h100-1",
    phase: str = "Running",
    containers: list[Body] | None = None,
    init: list[Body] | None = None,
    namespace: str = "tau-alpha",
    run: tuple[str, str] | None = None,
    overhead: str | None = None,
) -> Body:
    pod_labels: dict[str, str] = {"job-name": name.rsplit("-", 1)[0]}
    if run is not None:
        pod_labels[run_labels.WORKSPACE] = run[0]
        pod_labels[run_labels.RUN] = run[1]
    spec: Body = {"containers": containers or [container(requests="4", limits="4")]}
    if init is not None:
        spec["initContainers"] = init
    if node is not None:
        spec["nodeName"] = node
    if overhead is not None:
        spec["overhead"] = {"nvidia.com/gpu": overhead}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels},
        "spec": spec,
        "status": {"phase": phase},
    }


def flavor(name: str, gpu_model: str = "", **node_labels: str) -> ResourceFlavor:
    return ResourceFlavor(name=name, gpu_model=gpu_model, node_labels=dict(node_labels))


H100 = flavor(
    "h100", "NVIDIA-H100-80GB-HBM3", **{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
)


@dataclass(frozen=True)
class Row:
    case: str
    expect: dict[str, Any]
    edit: Callable[[Body], None] | None = None
    pods: tuple[Body, ...] = ()
    flavors: tuple[ResourceFlavor, ...] = (H100,)


def _without_label(key: str) -> Callable[[Body], None]:
    def edit(node: Body) -> None:
        del node["metadata"]["labels"][key]

    return edit


def _allocatable(gpus: str) -> Callable[[Body], None]:
    def edit(node: Body) -> None:
        node["status"]["allocatable"]["nvidia.com/gpu"] = gpus

    return edit


def _with(*entries: Body) -> Callable[[Body], None]:
    def edit(node: Body) -> None:
        for entry in entries:
            set_condition(node, entry)

    return edit


def _cordoned(node: Body) -> None:
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"].append(
        {
            "key": "node.kubernetes.io/unschedulable",
            "effect": "NoSchedule",
            "timeAdded": "2026-12-01T13:00:00Z",
        }
    )


def _no_ready(node: Body) -> None:
    node["status"]["conditions"] = [c for c in node["status"]["conditions"] if c["type"] != "Ready"]


def _chain(*edits: Callable[[Body], None]) -> Callable[[Body], None]:
    def edit(node: Body) -> None:
        for step in edits:
            step(node)

    return edit


ROWS = [
    # --- capacity --------------------------------------------------------------------------
    Row(
        "as the test cluster has it",
        {
            "name": "gpu-h100-1",
            "pool": "gpu-h100",
            "gpu_model": "NVIDIA-H100-80GB-HBM3",
            "gpus_total": 8,
            "gpus_allocatable": 8,
            "gpus_in_use": 0,
            "other_gpus_in_use": 0,
            "ready": True,
            "healthy": True,
            "cordoned": False,
            "problems": [],
            "runs": [],
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
    ),
    Row(
        "the device plugin marked two GPUs bad: allocatable below capacity",
        {"gpus_total": 8, "gpus_allocatable": 6, "healthy": True},
        edit=_allocatable("6"),
    ),
    # --- GPUs in use -----------------------------------------------------------------------
    Row(
        "a TauGrid run's pod holding 4 GPUs",
        {
            "gpus_in_use": 4,
            "other_gpus_in_use": 0,
            "runs": [
                {
                    "workspace": "alpha",
                    "run": "train-k3x9q2",
                    "namespace": "tau-alpha",
                    "pod": "train-k3x9q2-a1-0",
                    "gpus": 4,
                }
            ],
        },
        pods=(pod("train-k3x9q2-a1-0", run=("alpha", "train-k3x9q2")),),
    ),
    Row(
        "limits only: the request defaults to the limit",
        {"gpus_in_use": 2, "other_gpus_in_use": 2},
        pods=(pod("notebook-0", containers=[container(limits="2")]),),
    ),
    Row(
        "finished pods hold nothing, a pending pod bound to the node does",
        {"gpus_in_use": 1, "other_gpus_in_use": 1},
        pods=(
            pod("done-0", phase="Succeeded"),
            pod("crashed-0", phase="Failed"),
            pod("starting-0", phase="Pending", containers=[container(requests="1", limits="1")]),
        ),
    ),
    Row(
        "pods elsewhere or not bound yet are not this node's",
        {"gpus_in_use": 0},
        pods=(pod("other-node-0", node="gpu-h100-2"), pod("unbound-0", node=None, phase="Pending")),
    ),
    Row(
        "several containers add up; CPU-only containers count nothing",
        {"gpus_in_use": 3},
        pods=(
            pod(
                "two-0",
                containers=[
                    container("a", requests="2", limits="2"),
                    container("b", requests="1", limits="1"),
                    container("log"),
                ],
            ),
        ),
    ),
    Row(
        "an init container that needs more than the containers sets the pod's amount",
        {"gpus_in_use": 6},
        pods=(
            pod(
                "warm-0",
                init=[container("warmup", requests="6", limits="6")],
                containers=[container(requests="2", limits="2")],
            ),
        ),
    ),
    Row(
        "a sidecar (init, restartPolicy Always) adds to the containers",
        {"gpus_in_use": 3},
        pods=(
            pod(
                "side-0",
                init=[container("proxy", requests="1", limits="1", restartPolicy="Always")],
                containers=[container(requests="2", limits="2")],
            ),
        ),
    ),
    Row(
        "an init container after a sidecar runs beside it",
        {"gpus_in_use": 5},
        pods=(
            pod(
                "both-0",
                init=[
                    container("proxy", requests="1", limits="1", restartPolicy="Always"),
                    container("setup", requests="4", limits="4"),
                ],
                containers=[container(requests="2", limits="2")],
            ),
        ),
    ),
    Row(
        "pod overhead counts",
        {"gpus_in_use": 5},
        pods=(pod("vm-0", overhead="1"),),
    ),
    Row(
        "TauGrid runs and other pods side by side",
        {
            "gpus_in_use": 8,
            "other_gpus_in_use": 4,
            "runs": [
                {
                    "workspace": "alpha",
                    "run": "a-1",
                    "namespace": "tau-alpha",
                    "pod": "a-1-a1-0",
                    "gpus": 2,
                },
                {
                    "workspace": "beta",
                    "run": "b-1",
                    "namespace": "tau-beta",
                    "pod": "b-1-a1-0",
                    "gpus": 2,
                },
            ],
        },
        pods=(
            pod(
                "b-1-a1-0",
                run=("beta", "b-1"),
                namespace="tau-beta",
                containers=[container(requests="2", limits="2")],
            ),
            pod("a-1-a1-0", run=("alpha", "a-1"), containers=[container(requests="2", limits="2")]),
            pod("jupyter-0", namespace="ml", containers=[container(requests="3", limits="3")]),
            # a workspace label without a run: not a run TauGrid can name
            pod("half-0", containers=[container(requests="1", limits="1")])
            | {
                "metadata": {
                    "name": "half-0",
                    "namespace": "tau-alpha",
                    "labels": {run_labels.WORKSPACE: "alpha"},
                }
            },
        ),
    ),
    # --- pool, flavor, model ---------------------------------------------------------------
    Row(
        "no pool label: the flavor whose node labels the node carries",
        {"pool": "h100", "flavor": "h100", "gpu_model": "NVIDIA-H100-80GB-HBM3"},
        edit=_without_label("taugrid.io/node-pool"),
    ),
    Row(
        "the flavor naming more of the node's labels wins",
        {"pool": "h100-zone-a", "flavor": "h100-zone-a"},
        edit=_without_label("taugrid.io/node-pool"),
        flavors=(
            H100,
            flavor(
                "h100-zone-a",
                "",
                **{
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "topology.kubernetes.io/zone": "taugrid-local-a",
                },
            ),
            flavor("anything", ""),  # no node labels: selects no node in particular
        ),
    ),
    Row(
        "no pool label and no flavor: no pool",
        {"pool": "", "flavor": None},
        edit=_without_label("taugrid.io/node-pool"),
        flavors=(
            flavor(
                "a100",
                "NVIDIA-A100-SXM4-80GB",
                **{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            ),
        ),
    ),
    Row(
        "a pool label and a flavor: the label names the pool, the flavor is still known",
        {"pool": "gpu-h100", "flavor": "h100"},
    ),
    Row(
        "no product label: the flavor's GPU model",
        {"gpu_model": "NVIDIA H100 (from the flavor)"},
        edit=_chain(
            _without_label("nvidia.com/gpu.product"),
            lambda node: node["metadata"]["labels"].update({"pool-kind": "h100"}),
        ),
        flavors=(flavor("h100x", "NVIDIA H100 (from the flavor)", **{"pool-kind": "h100"}),),
    ),
    # --- health ----------------------------------------------------------------------------
    Row(
        "NPD's XIDErrors True: unhealthy, the XID explained",
        {
            "healthy": False,
            "ready": True,
            "problems": ["XIDErrors since 12:03 UTC: XID 79 — GPU has fallen off the bus"],
        },
        edit=_with(condition("XIDErrors", "True", "XID 79 on GPU 3 (PCI:0000:3b:00)")),
    ),
    Row(
        "several XIDs in one message",
        {
            "problems": [
                "XIDErrors since 12:03 UTC: XID 48 — double-bit ECC error: GPU memory is "
                "corrupt; XID 63 — ECC page retirement or row remapping recorded"
            ]
        },
        edit=_with(condition("XIDErrors", "True", "Xid (PCI:0000:3b:00): 48, XID 63")),
    ),
    Row(
        "XIDErrors False (NPD's all-clear) is no problem",
        {"healthy": True, "problems": []},
        edit=_with(condition("XIDErrors", "False", "No XID errors", reason="NoXIDErrors")),
    ),
    Row(
        "a configured condition without XIDs: its message",
        {
            "healthy": False,
            "problems": ["NVLinkStatusInactive since 12:03 UTC: NVLink 2 of GPU 5 is inactive"],
        },
        edit=_with(condition("NVLinkStatusInactive", "True", "NVLink 2 of GPU 5 is inactive.")),
    ),
    Row(
        "a configured condition that does not look GPU-related",
        {"healthy": False, "problems": ["SiteBurnInFailed since 12:03 UTC: burn-in failed"]},
        edit=_with(condition("SiteBurnInFailed", "True", "burn-in failed")),
    ),
    Row(
        "an unknown GPU-ish condition (an NPD plugin's own) is a problem too",
        {
            "healthy": False,
            "problems": [
                "GPUECCErrors since 12:03 UTC: 3 uncorrectable ECC errors on GPU 1",
                "DcgmHealthProblem since 12:03 UTC: DCGM health watch: PCIe replay",
            ],
        },
        edit=_with(
            condition("GPUECCErrors", "True", "3 uncorrectable ECC errors on GPU 1"),
            condition("DcgmHealthProblem", "True", "DCGM health watch: PCIe replay"),
        ),
    ),
    Row(
        "a condition from another day names the day",
        {"problems": ["XIDErrors since 2026-11-29 23:50 UTC: XID 79 — GPU has fallen off the bus"]},
        edit=_with(condition("XIDErrors", "True", "XID 79", at="2026-11-29T23:50:00Z")),
    ),
    Row(
        "no message: the reason; neither: the condition alone",
        {
            "problems": [
                "GPUMissing since 12:03 UTC: GPUCountMismatch",
                "IBLinkFlapping since 12:03 UTC",
            ]
        },
        edit=_with(
            condition("GPUMissing", "True", reason="GPUCountMismatch"),
            {
                "type": "IBLinkFlapping",
                "status": "True",
                "lastTransitionTime": "2026-12-01T12:03:00Z",
            },
        ),
    ),
    Row(
        "NotReady (the node lifecycle controller's Unknown)",
        {
            "ready": False,
            "healthy": False,
            "problems": ["NotReady since 18:55 UTC: Kubelet stopped posting node status"],
        },
        edit=_with(
            condition(
                "Ready",
                "Unknown",
                "Kubelet stopped posting node status.",
                at="2026-12-01T18:55:00Z",
                reason="NodeStatusUnknown",
            )
        ),
    ),
    Row(
        "Ready False",
        {
            "ready": False,
            "healthy": False,
            "problems": ["NotReady since 18:55 UTC: container runtime network not ready"],
        },
        edit=_with(
            condition(
                "Ready",
                "False",
                "container runtime network not ready",
                at="2026-12-01T18:55:00Z",
                reason="KubeletNotReady",
            )
        ),
    ),
    Row(
        "no Ready condition at all",
        {
            "ready": False,
            "healthy": False,
            "problems": ["NotReady: the node reports no Ready condition"],
        },
        edit=_no_ready,
    ),
    Row(
        "the kubelet's pressure conditions True",
        {
            "ready": True,
            "healthy": False,
            "problems": [
                "MemoryPressure since 19:10 UTC: kubelet has insufficient memory available",
                "DiskPressure since 19:10 UTC: kubelet has disk pressure",
            ],
        },
        edit=_with(
            condition(
                "MemoryPressure",
                "True",
                "kubelet has insufficient memory available",
                at="2026-12-01T19:10:00Z",
            ),
            condition(
                "DiskPressure", "True", "kubelet has disk pressure", at="2026-12-01T19:10:00Z"
            ),
        ),
    ),
    Row(
        "another NPD condition (KernelDeadlock) is shown, not judged",
        {"healthy": True, "problems": []},
        edit=_with(condition("KernelDeadlock", "True", "task docker:7 blocked for more than 120s")),
    ),
    Row(
        "cordoned is a state, not a problem",
        {"cordoned": True, "healthy": True, "problems": []},
        edit=_cordoned,
    ),
    Row(
        "cordoned and unhealthy",
        {
            "cordoned": True,
            "healthy": False,
            "problems": ["XIDErrors since 12:03 UTC: XID 79 — GPU has fallen off the bus"],
        },
        edit=_chain(_cordoned, _with(condition("XIDErrors", "True", "XID 79"))),
    ),
]


def view_of(row: Row) -> NodeView:
    node = h100_node()
    if row.edit is not None:
        row.edit(node)
    views = node_views(
        [node, h100_node("gpu-h100-2"), cpu_node()],
        [copy.deepcopy(p) for p in row.pods],
        flavors=list(row.flavors),
        health_conditions=HEALTH_CONDITIONS,
        now=NOW,
    )
    return next(view for view in views if view.name == "gpu-h100-1")


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
def test_node_view(row: Row) -> None:
    view = view_of(row)
    for attribute, expected in row.expect.items():
        actual = getattr(view, attribute)
        if attribute == "flavor":
            actual = actual.name if actual is not None else None
        assert actual == expected, f"{attribute}: {actual!r} != {expected!r}"


def test_only_nodes_with_gpus_are_listed_in_pool_order() -> None:
    gpu_less = h100_node("gpu-h100-2")
    gpu_less["status"]["capacity"]["nvidia.com/gpu"] = "0"
    first = h100_node("gpu-h100-1")
    first["metadata"]["labels"]["taugrid.io/node-pool"] = "a-first"
    second = h100_node("gpu-h100-1")
    second["metadata"]["name"] = "gpu-b"
    no_capacity = h100_node("gpu-h100-2")
    no_capacity["metadata"]["name"] = "gpu-capacity-missing"
    del no_capacity["status"]["capacity"]["nvidia.com/gpu"]
    views = node_views(
        [second, first, gpu_less, no_capacity, cpu_node()],
        [],
        flavors=[H100],
        health_conditions=HEALTH_CONDITIONS,
        now=NOW,
    )
    assert [(view.pool, view.name) for view in views] == [
        ("a-first", "gpu-h100-1"),
        ("gpu-h100", "gpu-b"),
    ]


def test_every_condition_is_kept_flagged() -> None:
    node = h100_node()
    set_condition(node, condition("XIDErrors", "True", "XID 79"))
    set_condition(node, condition("KernelDeadlock", "False", "kernel has no deadlock"))
    [view] = node_views([node], [], flavors=[], health_conditions=HEALTH_CONDITIONS, now=NOW)
    flags = {c["type"]: (c["status"], c["gpu"], c["problem"]) for c in view.conditions}
    assert flags == {
        "Ready": ("True", False, False),
        "MemoryPressure": ("False", False, False),
        "DiskPressure": ("False", False, False),
        "PIDPressure": ("False", False, False),
        "NetworkUnavailable": ("False", False, False),
        "XIDErrors": ("True", True, True),
        "KernelDeadlock": ("False", False, False),
    }
    xid = next(c for c in view.conditions if c["type"] == "XIDErrors")
    assert xid == {
        "type": "XIDErrors",
        "status": "True",
        "reason": "XIDErrors",
        "message": "XID 79",
        "last_transition_time": "2026-12-01T12:03:00Z",
        "gpu": True,
        "problem": True,
    }
    # What auto-cordon acts on: the GPU conditions that are True, with their sentences.
    assert view.gpu_alerts == {
        "XIDErrors": "XIDErrors since 12:03 UTC: XID 79 — GPU has fallen off the bus"
    }
    assert view.problems_since == datetime(2026, 12, 1, 12, 3, tzinfo=UTC)


def test_notready_is_a_problem_but_not_a_gpu_alert() -> None:
    node = h100_node()
    set_condition(node, condition("Ready", "Unknown", "Kubelet stopped posting node status."))
    [view] = node_views([node], [], flavors=[], health_conditions=HEALTH_CONDITIONS, now=NOW)
    assert view.problems == ["NotReady since 12:03 UTC: Kubelet stopped posting node status"]
    assert view.gpu_alerts == {}


@pytest.mark.parametrize(
    ("kind", "gpu"),
    [
        ("XIDErrors", True),
        ("GPUMissing", True),
        ("GPUECCErrors", True),
        ("GPUThrottle", True),
        ("NVLinkStatusInactive", True),
        ("IBLinkFlapping", True),
        ("InfiniBandDown", True),
        ("DcgmHealthProblem", True),
        ("UnhealthyNvidiaDevicePlugin", True),
        ("EccUncorrectable", True),
        ("xid_errors", True),
        ("Ready", False),
        ("MemoryPressure", False),
        ("KernelDeadlock", False),
        ("ReadonlyFilesystem", False),
        ("Oxidation", False),  # "xid" inside a word is not an XID
        ("Success", False),
        ("FrequentKubeletRestart", False),
    ],
)
def test_looks_gpu_related(kind: str, gpu: bool) -> None:
    assert looks_gpu_related(kind) is gpu


@pytest.mark.parametrize(
    ("message", "explained"),
    [
        ("XID 79", "XID 79 — GPU has fallen off the bus"),
        (
            "XID 13 on GPU 0",
            "XID 13 — graphics engine exception (often an out-of-range access by a kernel)",
        ),
        ("XID 999", "XID 999 — GPU error (not in TauGrid's XID table)"),
        ("  PCIe link   degraded.  ", "PCIe link degraded"),
        ("", ""),
    ],
)
def test_explain_message(message: str, explained: str) -> None:
    assert explain_message(message) == explained


def test_problem_sentence_without_a_time() -> None:
    assert problem_sentence("XIDErrors", "XID 48", None, NOW) == (
        "XIDErrors: XID 48 — double-bit ECC error: GPU memory is corrupt"
    )


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        ({"containers": [container(requests="1", limits="1")]}, 1),
        ({"containers": [container(limits="8")]}, 8),
        ({"containers": [container()]}, 0),
        ({"containers": [container(requests="junk")]}, 0),  # not a quantity: counts nothing
        ({}, 0),
    ],
)
def test_pod_gpus(spec: Body, gpus: int) -> None:
    assert pod_gpus({"spec": spec}) == gpus
