"""Kueue objects (v1beta2) and jobs for tests against the control plane: a flavor on the H100
nodes, a ClusterQueue that admits from one namespace only, a LocalQueue, a batch/v1 Job, and
the lookups the tests share (conditions, a job's Workload)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.cluster.plugin import Kube

KUEUE = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
H100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
# The taint of the gpu-h100 pool (deploy/cluster/nodes/gpu-h100.yaml), as GPU pools carry it.
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# What the fake nodes' KWOK Stages read (deploy/cluster/kwok/stages.yaml).
TEST_DURATION = "taugrid.io/test-duration"
TEST_EXIT_CODE = "taugrid.io/test-exit-code"
TEST_OOM = "taugrid.io/test-oom"


def resource_flavor(name: str) -> dict[str, Any]:
    """The H100 flavor: Kueue puts its node labels and toleration on the pods it admits."""
    return {
        "apiVersion": KUEUE,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": dict(H100_LABELS), "tolerations": [dict(GPU_TOLERATION)]},
    }


def cluster_queue(
    name: str,
    flavor: str,
    namespace: str,
    gpus: int,
    cohort: str | None = None,
    *,
    cpu: str = "64",
    memory: str = "512Gi",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        # Only this test's namespace: a null selector would admit from no namespace at all.
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", GPU],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": cpu},
                            {"name": "memory", "nominalQuota": memory},
                            {"name": GPU, "nominalQuota": str(gpus)},
                        ],
                    }
                ],
            }
        ],
    }
    if cohort is not None:
        spec["cohortName"] = cohort
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def batch_job(
    name: str,
    namespace: str,
    queue: str | None,
    gpus: int = 0,
    *,
    pod_annotations: dict[str, str] | None = None,
    parallelism: int = 1,
    backoff_limit: int | None = None,
) -> dict[str, Any]:
    """A batch/v1 Job (Kueue-managed when `queue` is given); `pod_annotations` go on its pod
    template, e.g. TEST_DURATION to keep its pods running longer on the fake nodes."""
    resources = {"cpu": "1", "memory": "1Gi"}
    if gpus:
        resources[GPU] = str(gpus)
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "completions": parallelism,
        "template": {
            "metadata": {"annotations": dict(pod_annotations or {})},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "command": ["true"],
                        "resources": {"requests": resources, "limits": resources},
                    }
                ],
            },
        },
    }
    if backoff_limit is not None:
        spec["backoffLimit"] = backoff_limit
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {QUEUE_LABEL: queue} if queue else {},
        },
        "spec": spec,
    }


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def is_true(obj: dict[str, Any] | None, condition: str) -> bool:
    return conditions(obj).get(condition, {}).get("status") == "True"


def workload_of(kube: Kube, job: dict[str, Any]) -> dict[str, Any] | None:
    """Kueue's Workload for a job, found the documented way: by the job-uid label."""
    found = kube.list(
        KUEUE,
        "Workload",
        job["metadata"]["namespace"],
        label_selector=f"{JOB_UID_LABEL}={job['metadata']['uid']}",
    )
    return found[0] if found else None


def queue_setup(
    kube: Kube, prefix: str, gpus: int, cohort: str | None = None, flavor: str | None = None
) -> tuple[str, str, str]:
    """A namespace, a ResourceFlavor (new unless given), a ClusterQueue with `gpus` GPUs of
    it and a LocalQueue `team`. Borrowing in a cohort is per flavor: share the flavor."""
    namespace = kube.namespace(prefix)
    if flavor is None:
        flavor = kube.create(resource_flavor(kube.unique(f"{prefix}-h100")))["metadata"]["name"]
    cq = kube.create(cluster_queue(kube.unique(f"{prefix}-cq"), flavor, namespace, gpus, cohort))[
        "metadata"
    ]["name"]
    kube.create(local_queue("team", namespace, cq))
    return namespace, flavor, cq
