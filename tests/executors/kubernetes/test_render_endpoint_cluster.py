"""Rendered endpoints against the real control plane (deploy/cluster): the real
kube-apiserver with KubeRay's CRDs, Kueue (its RayCluster integration on) and the KubeRay
operator, kube-scheduler and KWOK nodes.

* every object of every endpoint case passes a server-side dry run with strict field
  validation, and the server keeps every field we set;
* the GPU endpoint, created for real: KubeRay makes its Ray cluster with the workspace's queue
  label, Kueue suspends that cluster, admits it with exactly the head and the three GPU
  workers counted against the ClusterQueue, and the scheduler places its pods on the fake
  GPU nodes; deleting the RayService frees the quota;
* each LLM example (vLLM, SGLang, TensorRT-LLM), created for real in a queue of exactly one
  GPU: admitted with its head and its one GPU worker, the GPU counted against the quota, the
  worker placed on a fake H100 node; deleting it frees the GPU;
* an endpoint bigger than the quota waits, not admitted, with Kueue's reason.

No kubelet runs here, so no container starts: the Serve application itself is tested where a
real Ray head runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from executors.kubernetes import labels
from executors.kubernetes.kueue_usage import reserved_from_status
from executors.kubernetes.render import Flavor
from executors.kubernetes.render_endpoint import render_rayservice
from tau.spec import Spec
from tests.cluster.kueue_objects import H100_LABELS
from tests.cluster.plugin import Kube, wait_until

from .render_cases import (
    EndpointCase,
    endpoint_cases,
    endpoint_route_cases,
    render_endpoint_case,
    render_route_case,
    with_changes,
)
from .test_render_cluster import (
    FAKE_OWNER_UID,
    KUEUE,
    Queue,
    condition,
    dry_run,
    missing_from,
    queue_setup,
)

pytestmark = pytest.mark.cluster

RAY = "ray.io/v1"
GPU = "nvidia.com/gpu"
#: The OpenAI-compatible LLM examples: one GPU per replica (examples/*-serve/README.md).
LLM_EXAMPLES = ("vllm-serve", "sglang-serve", "trtllm-serve")
#: KubeRay's label on the Ray cluster a RayService made.
ORIGINATED_FROM = "ray.io/originated-from-cr-name"


def placed(case: EndpointCase, queue: Queue) -> tuple[Spec, Any]:
    spec, target = case.spec, case.target
    if spec.queue.priority is not None:
        spec = with_changes(spec, queue={"priority": queue.priority})
    if spec.compute.gpu_type is not None:
        spec = with_changes(spec, compute={"gpu_type": queue.flavor})
        target = dataclasses.replace(target, flavor=Flavor(queue.flavor, H100_LABELS))
    return spec, dataclasses.replace(target, namespace=queue.namespace, local_queue="alpha")


def test_every_rendered_endpoint_object_passes_a_strict_dry_run(kube: Kube) -> None:
    queue = queue_setup(kube, "ep-dry")
    checked = []
    for case in endpoint_cases():
        spec, target = placed(case, queue)
        for body in render_endpoint_case(spec, target, uid=FAKE_OWNER_UID):
            stored = dry_run(kube, body)
            assert missing_from(body, stored) == [], f"{case.name} {body['kind']}"
            checked.append(f"{case.name}/{body['kind']}")
    assert len(checked) == 2 * len(endpoint_cases())
    assert {f"{name}/RayService" for name in LLM_EXAMPLES} <= set(checked)
    assert kube.list(RAY, "RayService", queue.namespace) == []


def ray_cluster_of(kube: Kube, service: str, namespace: str) -> dict[str, Any] | None:
    found = kube.list(RAY, "RayCluster", namespace, label_selector=f"{ORIGINATED_FROM}={service}")
    return found[0] if found else None


def workload_of_cluster(kube: Kube, cluster: dict[str, Any]) -> dict[str, Any] | None:
    found = kube.list(
        KUEUE,
        "Workload",
        cluster["metadata"]["namespace"],
        label_selector=f"{labels.KUEUE_JOB_UID}={cluster['metadata']['uid']}",
    )
    return found[0] if found else None


def gpus_reserved(kube: Kube, cluster_queue: str) -> int:
    """The GPUs Kueue reports reserved in the ClusterQueue (as the portal reads them)."""
    found = kube.get(KUEUE, "ClusterQueue", cluster_queue, None) or {}
    return int(sum(v for (_, name), v in reserved_from_status(found).items() if name == GPU))


def test_an_endpoint_is_admitted_by_kueue_through_its_ray_cluster_within_the_gpu_quota(
    kube: Kube,
) -> None:
    queue = queue_setup(kube, "ep-admit", gpus=4)
    case = next(case for case in endpoint_cases() if case.name == "serve-gpu-autoscaling")
    spec, target = placed(case, queue)
    service = kube.create(render_rayservice(spec, target))
    name = service["metadata"]["name"]

    cluster = wait_until(
        "KubeRay's Ray cluster for the RayService",
        lambda: ray_cluster_of(kube, name, queue.namespace),
        timeout=120,
        describe=lambda: kube.cluster.log_tail("kuberay-operator", mentioning=name),
    )
    # The queue and priority labels reached the Ray cluster, which is what Kueue manages.
    assert cluster["metadata"]["labels"][labels.KUEUE_QUEUE_NAME] == "alpha"
    assert cluster["metadata"]["labels"][labels.KUEUE_PRIORITY_CLASS] == queue.priority
    workload = wait_until(
        "the Ray cluster's Workload", lambda: workload_of_cluster(kube, cluster), timeout=60
    )
    pod_sets = {pod_set["name"]: pod_set["count"] for pod_set in workload["spec"]["podSets"]}
    assert pod_sets == {"head": 1, "workers": 3}
    wait_until(
        "the Workload to be admitted",
        lambda: (
            condition(workload_of_cluster(kube, cluster), "Admitted").get("status") == "True"
            or None
        ),
        describe=lambda: str(condition(workload_of_cluster(kube, cluster), "QuotaReserved")),
    )
    wait_until(
        "Kueue to report the three GPUs reserved",
        lambda: gpus_reserved(kube, queue.cluster_queue) == 3 or None,
        describe=lambda: f"{gpus_reserved(kube, queue.cluster_queue)} reserved",
    )

    def scheduled_workers() -> int | None:
        pods = kube.list(
            "v1",
            "Pod",
            queue.namespace,
            label_selector=f"ray.io/cluster={cluster['metadata']['name']}",
        )
        on_nodes = [
            pod
            for pod in pods
            if pod["metadata"]["labels"].get(labels.COMPONENT) == labels.COMPONENT_WORKER
            and (pod.get("spec") or {}).get("nodeName")
        ]
        return len(on_nodes) if len(on_nodes) == 3 else None

    wait_until("the three GPU workers on the fake GPU nodes", scheduled_workers, timeout=120)

    kube.delete(RAY, "RayService", name, queue.namespace)
    wait_until(
        "the quota to be free once the endpoint is deleted",
        lambda: gpus_reserved(kube, queue.cluster_queue) == 0 or None,
        timeout=120,
    )


@pytest.mark.parametrize("name", LLM_EXAMPLES)
def test_an_llm_example_is_admitted_against_a_quota_of_one_gpu(kube: Kube, name: str) -> None:
    queue = queue_setup(kube, f"ep-{name}", gpus=1)  # the replica's GPU, no more
    case = next(case for case in endpoint_cases() if case.name == name)
    spec, target = placed(case, queue)
    kube.create(render_rayservice(spec, target))

    cluster = wait_until(
        "KubeRay's Ray cluster for the RayService",
        lambda: ray_cluster_of(kube, name, queue.namespace),
        timeout=120,
        describe=lambda: kube.cluster.log_tail("kuberay-operator", mentioning=name),
    )
    assert cluster["metadata"]["labels"][labels.KUEUE_QUEUE_NAME] == "alpha"
    workload = wait_until(
        "the Ray cluster's Workload", lambda: workload_of_cluster(kube, cluster), timeout=60
    )
    pod_sets = {pod_set["name"]: pod_set["count"] for pod_set in workload["spec"]["podSets"]}
    assert pod_sets == {"head": 1, "workers": 1}
    wait_until(
        "the Workload to be admitted",
        lambda: (
            condition(workload_of_cluster(kube, cluster), "Admitted").get("status") == "True"
            or None
        ),
        describe=lambda: str(condition(workload_of_cluster(kube, cluster), "QuotaReserved")),
    )
    wait_until(
        "Kueue to report the GPU reserved",
        lambda: gpus_reserved(kube, queue.cluster_queue) == 1 or None,
        describe=lambda: f"{gpus_reserved(kube, queue.cluster_queue)} reserved",
    )

    def gpu_worker_node() -> dict[str, Any] | None:
        pods = kube.list(
            "v1",
            "Pod",
            queue.namespace,
            label_selector=f"ray.io/cluster={cluster['metadata']['name']}",
        )
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and pod["metadata"]["labels"].get(labels.COMPONENT) == (
                labels.COMPONENT_WORKER
            ):
                return kube.get("v1", "Node", node, None)
        return None

    node = wait_until("the GPU worker on a fake GPU node", gpu_worker_node, timeout=120)
    assert node["metadata"]["labels"].items() >= H100_LABELS.items()
    assert int(node["status"]["allocatable"][GPU]) >= 1

    kube.delete(RAY, "RayService", name, queue.namespace)
    wait_until(
        "the GPU to be free once the endpoint is deleted",
        lambda: gpus_reserved(kube, queue.cluster_queue) == 0 or None,
        timeout=120,
    )


def test_an_endpoint_bigger_than_the_quota_waits_with_kueue_s_reason(kube: Kube) -> None:
    queue = queue_setup(kube, "ep-wait", gpus=2)
    case = next(case for case in endpoint_cases() if case.name == "serve-gpu-autoscaling")
    spec, target = placed(case, queue)  # three GPU workers, two GPUs of quota
    kube.create(render_rayservice(spec, target))
    name = target.name
    cluster = wait_until(
        "KubeRay's Ray cluster for the RayService",
        lambda: ray_cluster_of(kube, name, queue.namespace),
        timeout=120,
    )

    def pending() -> dict[str, Any] | None:
        found = workload_of_cluster(kube, cluster)
        if found and condition(found, "QuotaReserved").get("reason") == "Pending":
            return found
        return None

    workload = wait_until("a pending Workload saying why", pending, timeout=60)
    message = condition(workload, "QuotaReserved")["message"]
    assert "insufficient quota" in message, message
    assert GPU in message, message
    assert condition(workload, "Admitted").get("status") != "True"
    current = kube.get(RAY, "RayCluster", cluster["metadata"]["name"], queue.namespace) or {}
    assert current["spec"].get("suspend") is True
    assert gpus_reserved(kube, queue.cluster_queue) == 0


def test_every_rendered_ingress_passes_a_strict_dry_run(kube: Kube) -> None:
    """The endpoint's Ingress of each ingress route case (``TAU_ENDPOINT_ROUTE=ingress``), as
    the API server would store it. The HTTPRoute cases are not sent: this cluster serves no
    Gateway API (deploy/cluster installs no Gateway CRDs), which this test also checks, so
    that it is extended once it does."""
    queue = queue_setup(kube, "ep-route")
    checked = []
    for case in endpoint_route_cases():
        spec, target = placed(case, queue)
        body = render_route_case(spec, target, uid=FAKE_OWNER_UID)
        if body["kind"] != "Ingress":
            with pytest.raises(Exception, match=r"No matches found"):
                kube.cluster.resource(body["apiVersion"], body["kind"])
            continue
        stored = dry_run(kube, body)
        assert missing_from(body, stored) == [], case.name
        checked.append(case.name)
    assert checked == ["ingress", "ingress-cert-manager"]
    assert kube.list("networking.k8s.io/v1", "Ingress", queue.namespace) == []
