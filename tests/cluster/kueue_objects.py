"""Kueue objects (v1beta2) for tests against the control plane: a flavor on the H100 nodes,
a ClusterQueue that admits from one namespace only, a LocalQueue."""

from __future__ import annotations

from typing import Any

KUEUE = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
H100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def resource_flavor(name: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": dict(H100_LABELS)},
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
