"""Pods on the test cluster's fake nodes (issue 13): kube-scheduler places them, KWOK runs them.

The nodes come from deploy/cluster/nodes/ (pools gpu-h100 and cpu) and KWOK plays the Stages of
deploy/cluster/kwok/stages.yaml on them: a bound pod becomes Running and Ready; a Job's pod
succeeds after `taugrid.io/test-duration`; `taugrid.io/test-exit-code` and `taugrid.io/test-oom`
make a pod fail; a RayJob's submitter pod runs until `taugrid.io/test-ray-ended`; a deleted
pod goes away. KWOK's server is every node's kubelet endpoint, so
pods/log works through the apiserver from a file the test writes (a KWOK `Logs` object).

Each test owns its namespace (random suffix). Waits poll with timeouts; nothing sleeps blindly.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.kueue_objects import (
    GPU,
    GPU_TOLERATION,
    H100_LABELS,
    TEST_DURATION,
    TEST_EXIT_CODE,
    TEST_OOM,
    batch_job,
    conditions,
    is_true,
    queue_setup,
    workload_of,
)
from tests.cluster.plugin import Kube, KubeCluster, wait_until

pytestmark = pytest.mark.cluster

POOL_LABEL = "taugrid.io/node-pool"
COMPONENT_LABEL = "taugrid.io/component"
RAY_ENDED = "taugrid.io/test-ray-ended"  # deploy/cluster/ray_submitter.py
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_API = "kwok.x-k8s.io/v1alpha1"


def pod(
    name: str,
    namespace: str,
    *,
    gpus: int = 0,
    tolerate_gpu: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A bare pod (no controller), restartPolicy Never."""
    resources = {"cpu": "500m", "memory": "256Mi"}
    if gpus:
        resources[GPU] = str(gpus)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "command": ["sleep", "infinity"],
                "resources": {"requests": resources, "limits": resources},
            }
        ],
    }
    if tolerate_gpu:
        spec["tolerations"] = [dict(GPU_TOLERATION)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": spec,
    }


def get_pod(kube: Kube, name: str, namespace: str) -> dict[str, Any]:
    found = kube.get("v1", "Pod", name, namespace)
    assert found is not None, f"pod {namespace}/{name} disappeared"
    return found


def phase_of(kube: Kube, name: str, namespace: str) -> str:
    return str((get_pod(kube, name, namespace).get("status") or {}).get("phase"))


def in_phase(kube: Kube, name: str, namespace: str, phase: str) -> dict[str, Any] | None:
    current = get_pod(kube, name, namespace)
    return current if (current.get("status") or {}).get("phase") == phase else None


def node_pool(kube: Kube, node_name: str) -> str:
    node = kube.get("v1", "Node", node_name)
    assert node is not None, node_name
    return str(node["metadata"]["labels"][POOL_LABEL])


def terminated(pod_obj: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod_obj["status"]["containerStatuses"]
    state: dict[str, Any] = status["state"]["terminated"]
    return state


# ---------------------------------------------------------------------------------------------
# The nodes: two pools that look like real ones to anything reading the API
# ---------------------------------------------------------------------------------------------


def test_fake_nodes_look_like_real_gpu_and_cpu_nodes(kube: Kube, kube_cluster: KubeCluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube.list("v1", "Node")}
    pools: dict[str, list[str]] = {}
    for name, node in nodes.items():
        pools.setdefault(node["metadata"]["labels"].get(POOL_LABEL, ""), []).append(name)
    assert sorted(pools["gpu-h100"]) == ["gpu-h100-1", "gpu-h100-2"], pools
    assert sorted(pools["cpu"]) == ["cpu-1", "cpu-2"], pools

    kwok_port = kube_cluster.ports["kwok"]
    for name, node in nodes.items():
        status = node["status"]
        labels = node["metadata"]["labels"]
        assert node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == "fake"
        assert labels["kubernetes.io/hostname"] == name
        assert labels["topology.kubernetes.io/zone"].startswith("taugrid-local-")
        assert "node.kubernetes.io/instance-type" in labels
        # Made Ready by KWOK, and schedulable: the node-lifecycle controller lifted the
        # `not-ready` taint the apiserver puts on every new node.
        assert is_true(node, "Ready"), conditions(node)
        assert conditions(node)["MemoryPressure"]["status"] == "False"
        taints = {t["key"] for t in node["spec"].get("taints") or []}
        assert "node.kubernetes.io/not-ready" not in taints
        # Its kubelet is KWOK's server on loopback: where the apiserver fetches pods/log.
        assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
        assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == kwok_port
        assert status["nodeInfo"]["kubeletVersion"].startswith("kwok-")
        # Capacity and allocatable as a kubelet reports them (allocatable a little less).
        assert set(status["capacity"]) >= {"cpu", "memory", "pods", "ephemeral-storage"}
        assert status["allocatable"]["pods"] == status["capacity"]["pods"] == "110"
        # KWOK renews each node's Lease: the node-lifecycle controller's heartbeat.
        lease = kube.get("coordination.k8s.io/v1", "Lease", name, "kube-node-lease")
        assert lease is not None, f"no Lease for {name}"
        assert lease["spec"]["holderIdentity"], lease

    for name in pools["gpu-h100"]:
        node = nodes[name]
        labels = node["metadata"]["labels"]
        assert {k: labels[k] for k in H100_LABELS} == H100_LABELS
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["nvidia.com/gpu.memory"] == "81559"
        assert node["status"]["capacity"][GPU] == node["status"]["allocatable"][GPU] == "8"
        assert node["status"]["capacity"]["cpu"] == "96"
        assert node["status"]["capacity"]["memory"] == "1900Gi"
        assert node["spec"]["taints"] == [
            {"key": GPU, "value": "present", "effect": "NoSchedule"}
        ], node["spec"]["taints"]
    for name in pools["cpu"]:
        assert GPU not in nodes[name]["status"]["capacity"]
        assert not nodes[name]["spec"].get("taints")


# ---------------------------------------------------------------------------------------------
# A Kueue-admitted Job runs on a fake GPU node and succeeds
# ---------------------------------------------------------------------------------------------


def test_admitted_job_runs_on_gpu_nodes_and_succeeds(kube: Kube) -> None:
    namespace, _, _ = queue_setup(kube, "fn-job", gpus=4)
    job = kube.create(
        batch_job(
            "train",
            namespace,
            "team",
            gpus=2,
            parallelism=2,
            pod_annotations={TEST_DURATION: "6s"},
        )
    )
    assert job["spec"]["suspend"] is True
    wait_until(
        "Kueue to admit the Job",
        lambda: True if is_true(workload_of(kube, job), "Admitted") else None,
        describe=lambda: str(conditions(workload_of(kube, job))),
    )

    def pods() -> list[dict[str, Any]]:
        return kube.list("v1", "Pod", namespace, "job-name=train")

    def all_running() -> list[dict[str, Any]] | None:
        found = pods()
        running = [p for p in found if (p.get("status") or {}).get("phase") == "Running"]
        return running if len(running) == 2 else None

    running = wait_until(
        "both pods of the admitted Job to be Running",
        all_running,
        timeout=60,
        interval=0.2,
        describe=lambda: str([(p["metadata"]["name"], p.get("status")) for p in pods()]),
    )
    for item in running:
        # Scheduled by kube-scheduler onto the pool Kueue's flavor points at (node labels and
        # the toleration Kueue added from the flavor), Ready as a kubelet would report it.
        assert node_pool(kube, item["spec"]["nodeName"]) == "gpu-h100", item["spec"]
        assert conditions(item)["PodScheduled"]["status"] == "True"
        assert is_true(item, "Ready"), conditions(item)
        assert item["status"]["podIP"].startswith("10.244."), item["status"]
        (container,) = item["status"]["containerStatuses"]
        assert "running" in container["state"], container

    def job_complete() -> dict[str, Any] | None:
        current = kube.get("batch/v1", "Job", "train", namespace)
        return current if is_true(current, "Complete") else None

    finished = wait_until("the Job to be Complete", job_complete, timeout=90)
    assert finished["status"]["succeeded"] == 2
    for item in pods():
        assert item["status"]["phase"] == "Succeeded"
        state = terminated(item)
        assert (state["exitCode"], state["reason"]) == (0, "Completed"), state
        # It ran for the duration the annotation asked for.
        started = dt.datetime.fromisoformat(state["startedAt"])
        ended = dt.datetime.fromisoformat(state["finishedAt"])
        assert (ended - started).total_seconds() >= 5, state
    # Kueue sees the Job finish and releases its quota.
    wait_until(
        "Kueue to mark the Workload Finished",
        lambda: True if is_true(workload_of(kube, job), "Finished") else None,
        describe=lambda: str(conditions(workload_of(kube, job))),
    )


# ---------------------------------------------------------------------------------------------
# The GPU pool's taint: only pods that tolerate it land there
# ---------------------------------------------------------------------------------------------


def test_gpu_pod_lands_on_a_gpu_node_only_with_the_toleration(kube: Kube) -> None:
    namespace = kube.namespace("fn-taint")
    kube.create(pod("no-toleration", namespace, gpus=1))
    kube.create(pod("tolerates", namespace, gpus=1, tolerate_gpu=True))
    kube.create(pod("cpu-only", namespace))

    placed = wait_until(
        "the tolerating GPU pod to be Running",
        lambda: in_phase(kube, "tolerates", namespace, "Running"),
        describe=lambda: str(get_pod(kube, "tolerates", namespace).get("status")),
    )
    assert node_pool(kube, placed["spec"]["nodeName"]) == "gpu-h100"
    cpu_pod = wait_until(
        "the CPU pod to be Running", lambda: in_phase(kube, "cpu-only", namespace, "Running")
    )
    assert node_pool(kube, cpu_pod["spec"]["nodeName"]) == "cpu"  # the taint keeps it off

    def unschedulable() -> dict[str, Any] | None:
        scheduled = conditions(get_pod(kube, "no-toleration", namespace)).get("PodScheduled")
        return scheduled if scheduled and scheduled.get("reason") == "Unschedulable" else None

    scheduled = wait_until("the scheduler to give up on the untolerating pod", unschedulable)
    message = scheduled["message"]
    # kube-scheduler's own account: GPU nodes are tainted, CPU nodes have no GPUs.
    assert "untolerated taint" in message, message
    assert f"Insufficient {GPU}" in message, message
    current = get_pod(kube, "no-toleration", namespace)
    assert current["status"]["phase"] == "Pending"
    assert not current["spec"].get("nodeName")


# ---------------------------------------------------------------------------------------------
# Failures on request: an exit code, an OOM kill
# ---------------------------------------------------------------------------------------------


def test_annotated_pods_fail_with_the_exit_code_or_oomkilled(kube: Kube) -> None:
    namespace = kube.namespace("fn-fail")
    # A Job's pod that would otherwise succeed: the annotation wins, and the Job fails.
    kube.create(
        batch_job(
            "exits-3",
            namespace,
            None,
            pod_annotations={TEST_EXIT_CODE: "3", TEST_DURATION: "1s"},
            backoff_limit=0,
        )
    )
    kube.create(pod("oom", namespace, annotations={TEST_OOM: "true", TEST_DURATION: "1s"}))

    def job_failed() -> dict[str, Any] | None:
        current = kube.get("batch/v1", "Job", "exits-3", namespace)
        return current if is_true(current, "Failed") else None

    failed_job = wait_until("the Job to fail", job_failed, timeout=60)
    assert conditions(failed_job)["Failed"]["reason"] == "BackoffLimitExceeded"
    (job_pod,) = kube.list("v1", "Pod", namespace, "job-name=exits-3")
    assert job_pod["status"]["phase"] == "Failed"
    state = terminated(job_pod)
    assert (state["exitCode"], state["reason"]) == (3, "Error"), state

    oom = wait_until("the OOM pod to fail", lambda: in_phase(kube, "oom", namespace, "Failed"))
    state = terminated(oom)
    assert (state["exitCode"], state["reason"]) == (137, "OOMKilled"), state
    assert not is_true(oom, "Ready")


def test_a_rayjob_submitter_pod_runs_until_told_its_ray_job_has_ended(kube: Kube) -> None:
    """A TauGrid RayJob's submitter pod (``taugrid.io/component: submitter``) does not end
    after the default 2 s: like ``ray job submit``, it runs until its Ray job has ended, which
    deploy/cluster/ray_submitter.py says with ``taugrid.io/test-ray-ended`` once the job's
    whole log is the pod's; then it succeeds at once (stage ``pod-complete-ray-submitter``)."""
    namespace = kube.namespace("fn-submitter")
    submitter = batch_job("submitter", namespace, None, backoff_limit=0)
    submitter["spec"]["template"]["metadata"]["labels"] = {COMPONENT_LABEL: "submitter"}
    kube.create(submitter)
    kube.create(batch_job("plain", namespace, None, backoff_limit=0))

    def job_pod(job: str) -> dict[str, Any] | None:
        found = kube.list("v1", "Pod", namespace, f"job-name={job}")
        return found[0] if found else None

    def pod_in(job: str, phase: str) -> dict[str, Any] | None:
        found = job_pod(job)
        return found if found and (found.get("status") or {}).get("phase") == phase else None

    held = wait_until("the submitter pod to be Running", lambda: pod_in("submitter", "Running"))
    # The Job's pod beside it, started with it, ends after the default duration; the
    # submitter's does not.
    wait_until("the plain Job's pod to succeed", lambda: pod_in("plain", "Succeeded"))
    name = held["metadata"]["name"]
    assert phase_of(kube, name, namespace) == "Running"

    kube.patch("v1", "Pod", name, namespace, {"metadata": {"annotations": {RAY_ENDED: "true"}}})
    done = wait_until(
        "the released submitter pod to succeed", lambda: pod_in("submitter", "Succeeded")
    )
    state = terminated(done)
    assert (state["exitCode"], state["reason"]) == (0, "Completed"), state


# ---------------------------------------------------------------------------------------------
# Deleted pods go away
# ---------------------------------------------------------------------------------------------


def test_a_deleted_running_pod_goes_away(kube: Kube) -> None:
    namespace = kube.namespace("fn-delete")
    kube.create(pod("server", namespace))
    wait_until("the pod to be Running", lambda: in_phase(kube, "server", namespace, "Running"))

    kube.delete("v1", "Pod", "server", namespace)  # default grace period: 30 s
    wait_until(
        "the deleted pod to be gone (KWOK ends it as a kubelet would, well before 30 s)",
        lambda: True if kube.get("v1", "Pod", "server", namespace) is None else None,
        timeout=20,
    )


# ---------------------------------------------------------------------------------------------
# pods/log through the apiserver, served by KWOK from a file
# ---------------------------------------------------------------------------------------------


def test_pod_log_through_the_apiserver_comes_from_the_file(
    kube: Kube, kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    namespace = kube.namespace("fn-logs")
    kube.create(pod("trainer", namespace))
    wait_until("the pod to be Running", lambda: in_phase(kube, "trainer", namespace, "Running"))

    lines = ["epoch 1 loss=0.93", "epoch 2 loss=0.71", "done: ünïcode ✓"]
    # The container runtime's log format (CRI), as a kubelet reads it from disk.
    log_file = tmp_path / "trainer.log"
    log_file.write_text(
        "".join(
            f"2026-11-30T12:00:0{i}.000000000Z stdout F {line}\n" for i, line in enumerate(lines)
        )
    )
    kube.create(
        {
            "apiVersion": KWOK_API,
            "kind": "Logs",
            "metadata": {"name": "trainer", "namespace": namespace},
            "spec": {"logs": [{"containers": ["main"], "logsFile": str(log_file)}]},
        }
    )

    core = CoreV1Api(kube_cluster.api_client())
    errors: list[str] = []

    def reader(name: str) -> Callable[[], str | None]:
        def read() -> str | None:
            try:
                text: str = core.read_namespaced_pod_log(
                    name, namespace, container="main", _request_timeout=10
                )
            except ApiException as exc:
                # Until KWOK's watch has the Logs object, its kubelet API says "no logs found".
                errors.append(f"{exc.status}: {exc.body!r}")
                return None
            return text

        return read

    text = wait_until(
        "the pod's log through the apiserver",
        reader("trainer"),
        timeout=30,
        describe=lambda: errors[-1] if errors else "no answer",
    )
    assert text == "".join(f"{line}\n" for line in lines)
    tail = core.read_namespaced_pod_log(
        "trainer", namespace, container="main", tail_lines=1, _request_timeout=10
    )
    assert tail == f"{lines[-1]}\n"
    # A pod no Job owns keeps running (KWOK's Stages complete only a Job's pods).
    assert phase_of(kube, "trainer", namespace) == "Running"

    # ClusterLogs: one file for every pod its selector matches (here: this namespace's), for
    # pods that have no Logs object of their own.
    kube.create(pod("evaluator", namespace))
    wait_until(
        "the second pod to be Running", lambda: in_phase(kube, "evaluator", namespace, "Running")
    )
    shared = tmp_path / "shared.log"
    shared.write_text("2026-11-30T12:01:00.000000000Z stderr F from the shared file\n")
    kube.create(
        {
            "apiVersion": KWOK_API,
            "kind": "ClusterLogs",
            "metadata": {"name": namespace},
            "spec": {
                "selector": {"matchNamespaces": [namespace]},
                "logs": [{"logsFile": str(shared)}],
            },
        }
    )
    text = wait_until(
        "the second pod's log (ClusterLogs)",
        reader("evaluator"),
        timeout=30,
        describe=lambda: errors[-1] if errors else "no answer",
    )
    assert text == "from the shared file\n"
