"""Rendered objects against the real control plane (deploy/cluster): the real kube-apiserver
with the real Kueue and KubeRay CRDs, Kueue's webhooks, the KubeRay operator and the
controller-manager's garbage collector.

* every object of every rendering case passes a server-side dry run with strict field
  validation (an unknown or misspelt field is an error, not silently pruned), and the server
  keeps every field we set;
* the gpu-quickstart RayJob, created for real, is suspended by Kueue's webhook, gets a
  Workload with the pod sets we expect, is admitted and unsuspended, and KubeRay accepts it
  (it creates the Ray cluster);
* the run Secret owned by that RayJob is accepted and garbage-collected with it;
* the multi-node Job is admitted, its pods get their stable names, and its headless Service
  and Secret go away with it;
* the DDP example's two CPU workers, as written, are admitted together and run on the fake
  nodes with the rendezvous variables in their pod specs;
* every GPU example and GPU form (``examples/*/tau.gpu.yaml``) is admitted within exactly its
  GPUs' quota, and a Job's admitted pods carry the GPU pool's toleration and node labels
  from the flavor.

No kubelet runs here, so no container starts; everything up to that point is real.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from executors.kubernetes import labels
from executors.kubernetes.render import Flavor, Owner, RunTarget, render_dependents, render_workload
from tau import rendezvous
from tau.quantity import parse_quantity
from tau.spec import Spec
from tests.cluster.kueue_objects import (
    GPU_TOLERATION,
    H100_LABELS,
    cluster_queue,
    local_queue,
    resource_flavor,
)
from tests.cluster.plugin import Kube, wait_until

from .render_cases import TOKEN, cases, render_case, with_changes

pytestmark = pytest.mark.cluster

KUEUE = "kueue.x-k8s.io/v1beta2"
RAY = "ray.io/v1"
GPU = "nvidia.com/gpu"
FAKE_OWNER_UID = "00000000-0000-4000-8000-00000000beef"


@dataclasses.dataclass(frozen=True)
class Queue:
    namespace: str
    flavor: str
    cluster_queue: str
    priority: str


def queue_setup(kube: Kube, prefix: str, *, gpus: int = 16) -> Queue:
    """A namespace with LocalQueue ``alpha`` (the cases' workspace queue), a ClusterQueue
    with room for every case, a ResourceFlavor on the H100 nodes and a priority class."""
    namespace = kube.namespace(prefix)
    flavor = kube.unique(f"{prefix}-h100")
    kube.create(resource_flavor(flavor))
    cluster_queue_name = kube.unique(f"{prefix}-cq")
    kube.create(cluster_queue(cluster_queue_name, flavor, namespace, gpus, cpu="256", memory="2Ti"))
    kube.create(local_queue("alpha", namespace, cluster_queue_name))
    priority = kube.unique(f"{prefix}-high")
    kube.create(
        {
            "apiVersion": KUEUE,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": priority},
            "value": 1000,
            "description": "test priority",
        }
    )
    return Queue(namespace, flavor, cluster_queue_name, priority)


def placed(spec: Spec, target: RunTarget, queue: Queue) -> tuple[Spec, RunTarget]:
    """A case moved into the test's namespace, with the test's flavor and priority names."""
    if spec.queue.priority is not None:
        spec = with_changes(spec, queue={"priority": queue.priority})
    if spec.compute.gpu_type is not None:
        spec = with_changes(spec, compute={"gpu_type": queue.flavor})
        target = dataclasses.replace(target, flavor=Flavor(queue.flavor, H100_LABELS))
    return spec, dataclasses.replace(target, namespace=queue.namespace, local_queue="alpha")


def dry_run(kube: Kube, body: dict[str, Any]) -> dict[str, Any]:
    """A server-side dry-run create with strict field validation: an unknown field is
    refused rather than silently pruned. Returns the object as the server would store it."""
    resource = kube.cluster.resource(body["apiVersion"], body["kind"])
    stored: dict[str, Any] = resource.create(
        body=body,
        namespace=body["metadata"].get("namespace"),
        dry_run="All",
        query_params=[("fieldValidation", "Strict")],
    ).to_dict()
    return stored


def missing_from(sent: Any, stored: Any, path: str = "") -> list[str]:
    """Paths of what we sent that the server did not keep as sent (additions are fine)."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [path or "."]
        problems = []
        for key, value in sent.items():
            if key not in stored:
                problems.append(f"{path}.{key}")
            else:
                problems += missing_from(value, stored[key], f"{path}.{key}")
        return problems
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return [path]
        return [
            p for i, item in enumerate(sent) for p in missing_from(item, stored[i], f"{path}[{i}]")
        ]
    return [] if sent == stored else [f"{path}: sent {sent!r}, stored {stored!r}"]


def workload_of(kube: Kube, job: dict[str, Any]) -> dict[str, Any] | None:
    found = kube.list(
        KUEUE,
        "Workload",
        job["metadata"]["namespace"],
        label_selector=f"{labels.KUEUE_JOB_UID}={job['metadata']['uid']}",
    )
    return found[0] if found else None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry["type"] == kind:
            return dict(entry)
    return {}


def admitted(kube: Kube, job: dict[str, Any]) -> bool | None:
    return True if condition(workload_of(kube, job), "Admitted").get("status") == "True" else None


# ---------------------------------------------------------------------------------------------
# (a) every object of every case passes a strict server-side dry run
# ---------------------------------------------------------------------------------------------


def test_every_rendered_object_passes_a_strict_dry_run(kube: Kube) -> None:
    queue = queue_setup(kube, "render-dry")
    checked = []
    for case in cases():
        spec, target = placed(case.spec, case.target, queue)
        for body in render_case(spec, target, uid=FAKE_OWNER_UID):
            stored = dry_run(kube, body)
            problems = missing_from(body, stored)
            assert problems == [], f"{case.name} {body['kind']}: {problems}"
            if body["kind"] in {"RayJob", "Job"}:
                # Kueue's mutating webhook ran (dry runs call side-effect-free webhooks).
                assert stored["spec"]["suspend"] is True, f"{case.name}: not suspended"
            checked.append(f"{case.name}/{body['kind']}")
    assert len(checked) >= 2 * len(cases())
    # Dry runs persist nothing.
    assert kube.list(RAY, "RayJob", queue.namespace) == []
    assert kube.list("batch/v1", "Job", queue.namespace) == []


def test_a_misspelt_field_would_be_caught(kube: Kube) -> None:
    """The dry run above is strict: prove that an unknown field fails rather than vanishes."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    queue = queue_setup(kube, "render-strict")
    case = next(case for case in cases() if case.name == "gpu-quickstart")
    spec, target = placed(case.spec, case.target, queue)
    body = render_workload(spec, target)
    body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 1
    with pytest.raises(DynamicApiError) as refused:
        dry_run(kube, body)
    message = json.loads(refused.value.body or "{}").get("message", "")
    assert 'unknown field "spec.rayClusterSpec.workerGroupSpecs[0].replica"' in message


# ---------------------------------------------------------------------------------------------
# (b) + (c) the gpu-quickstart RayJob for real: suspended, Workload, admitted; its Secret GC'd
# ---------------------------------------------------------------------------------------------


def test_the_gpu_quickstart_rayjob_is_suspended_then_admitted(kube: Kube) -> None:
    queue = queue_setup(kube, "render-rj")
    case = next(case for case in cases() if case.name == "gpu-quickstart")
    spec, target = placed(case.spec, case.target, queue)
    spec = with_changes(spec, queue={"priority": queue.priority})
    name = target.workload_name

    rayjob = kube.create(render_workload(spec, target))
    assert rayjob["spec"]["suspend"] is True, "Kueue's webhook did not suspend the RayJob"

    workload = wait_until("the RayJob's Workload", lambda: workload_of(kube, rayjob), timeout=30)
    owner = workload["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("RayJob", name)
    assert workload["spec"]["queueName"] == "alpha"
    assert workload["spec"]["priorityClassRef"]["name"] == queue.priority
    pod_sets = {pod_set["name"]: pod_set for pod_set in workload["spec"]["podSets"]}
    assert set(pod_sets) == {"head", "workers", "submitter"}
    assert {name: pod_set["count"] for name, pod_set in pod_sets.items()} == {
        "head": 1,
        "workers": 1,
        "submitter": 1,
    }
    worker = pod_sets["workers"]["template"]["spec"]["containers"][0]["resources"]
    assert worker["requests"] == {"cpu": "16", "memory": "64Gi", GPU: "1"}

    wait_until(
        "the Workload to be admitted",
        lambda: admitted(kube, rayjob),
        describe=lambda: str(condition(workload_of(kube, rayjob), "QuotaReserved")),
    )

    def unsuspended() -> bool | None:
        current = kube.get(RAY, "RayJob", name, queue.namespace) or {}
        return None if current.get("spec", {}).get("suspend", False) else True

    wait_until("Kueue to unsuspend the RayJob", unsuspended)

    # KubeRay accepts the RayJob (no ValidationFailed) and builds its Ray cluster.
    cluster = kube.ray_cluster_of(name, queue.namespace)
    group = cluster["spec"]["workerGroupSpecs"][0]
    assert group["template"]["spec"]["containers"][0]["resources"]["limits"][GPU] == "1"


def test_the_run_secret_goes_away_with_its_rayjob(kube: Kube) -> None:
    queue = queue_setup(kube, "render-gc", gpus=0)  # no admission needed
    case = next(case for case in cases() if case.name == "gpu-quickstart")
    spec, target = placed(case.spec, case.target, queue)
    rayjob = kube.create(render_workload(spec, target))

    (secret_body,) = render_dependents(spec, target, token=TOKEN, owner=Owner.of(rayjob))
    secret = kube.create(secret_body)
    reference = secret["metadata"]["ownerReferences"][0]
    assert (reference["kind"], reference["uid"]) == ("RayJob", rayjob["metadata"]["uid"])

    kube.delete(RAY, "RayJob", target.workload_name, queue.namespace)
    wait_until(
        "the garbage collector to delete the run Secret",
        lambda: (
            True if kube.get("v1", "Secret", target.token_secret, queue.namespace) is None else None
        ),
        timeout=90,
    )


# ---------------------------------------------------------------------------------------------
# The multi-node Job: admitted, stable pod names, dependents collected with it
# ---------------------------------------------------------------------------------------------


def test_the_multi_node_job_runs_its_pods_under_stable_names(kube: Kube) -> None:
    queue = queue_setup(kube, "render-job")
    case = next(case for case in cases() if case.name == "multi-node-torchrun")
    spec, target = placed(case.spec, case.target, queue)
    name = target.workload_name
    run_label = f"{labels.RUN}={target.run_name}"

    job = kube.create(render_workload(spec, target))
    assert job["spec"]["suspend"] is True
    dependents = [
        kube.create(body)
        for body in render_dependents(spec, target, token=TOKEN, owner=Owner.of(job))
    ]
    assert [obj["kind"] for obj in dependents] == ["Secret", "Service"]

    wait_until("the Job to be admitted", lambda: admitted(kube, job), timeout=60)
    pods = wait_until(
        "both pods of the Indexed Job",
        lambda: (lambda found: found if len(found) == 2 else None)(
            kube.list("v1", "Pod", queue.namespace, run_label)
        ),
        timeout=60,
    )
    assert sorted(pod["spec"]["hostname"] for pod in pods) == [f"{name}-0", f"{name}-1"]
    assert {pod["spec"]["subdomain"] for pod in pods} == {name}
    # Kueue put the flavor's node labels on the admitted pods.
    assert all(pod["spec"]["nodeSelector"] == H100_LABELS for pod in pods)

    kube.delete("batch/v1", "Job", name, queue.namespace)

    def dependents_gone() -> bool | None:
        secret = kube.get("v1", "Secret", target.token_secret, queue.namespace)
        service = kube.get("v1", "Service", name, queue.namespace)
        return True if secret is None and service is None else None

    wait_until("the Job's Secret and Service to be collected", dependents_gone, timeout=90)


@pytest.mark.parametrize("example", ["ddp", "fsdp", "deepspeed"])
def test_a_distributed_example_as_written_runs_its_two_workers_on_the_fake_nodes(
    kube: Kube, example: str
) -> None:
    """Issue 32: the CPU forms of examples/ddp, fsdp and deepspeed, unchanged, go as far as
    the test cluster goes: Kueue admits the two workers as one workload, kube-scheduler
    places both pods on the fake nodes and KWOK runs them, and each pod's spec carries the
    rendezvous table (tau/rendezvous.py), its RANK read from its own completion index."""
    queue = queue_setup(kube, f"render-{example}")
    case = next(case for case in cases() if case.name == example)
    spec, target = placed(case.spec, case.target, queue)
    name = target.workload_name
    run_label = f"{labels.RUN}={target.run_name}"
    job = kube.create(render_workload(spec, target))
    for body in render_dependents(spec, target, token=TOKEN, owner=Owner.of(job)):
        kube.create(body)

    wait_until("the Job to be admitted", lambda: admitted(kube, job), timeout=60)

    def both_running() -> list[dict[str, Any]] | None:
        found = kube.list("v1", "Pod", queue.namespace, run_label)
        running = [pod for pod in found if (pod.get("status") or {}).get("phase") == "Running"]
        return running if len(running) == 2 else None

    pods = wait_until("both workers' pods to run on the fake nodes", both_running, timeout=60)
    index_of = {pod["metadata"]["annotations"][labels.JOB_COMPLETION_INDEX]: pod for pod in pods}
    assert sorted(index_of) == ["0", "1"]
    for index, pod in sorted(index_of.items()):
        assert pod["spec"]["nodeName"], pod["spec"]  # placed by kube-scheduler
        (container,) = pod["spec"]["containers"]
        assert "train.py" in container["command"] + container.get("args", [])
        env = [item for item in container["env"] if item["name"] in rendezvous.NAMES]
        assert [item["name"] for item in env] == list(rendezvous.NAMES)
        values = {item["name"]: item.get("value") for item in env}
        assert values["MASTER_ADDR"] == values["PET_MASTER_ADDR"] == f"{name}-0.{name}"
        assert values["MASTER_PORT"] == values["PET_MASTER_PORT"] == str(rendezvous.DEFAULT_PORT)
        assert values["WORLD_SIZE"] == values["PET_NNODES"] == "2"
        assert values["LOCAL_RANK"] == "0"
        # RANK and PET_NODE_RANK: the pod's own completion index, 0 and 1.
        for item in env:
            if item["name"] in {"RANK", "PET_NODE_RANK"}:
                field = item["valueFrom"]["fieldRef"]["fieldPath"]
                assert field == f"metadata.annotations['{labels.JOB_COMPLETION_INDEX}']"
        assert pod["spec"]["hostname"] == f"{name}-{index}"
    kube.delete("batch/v1", "Job", name, queue.namespace)


@pytest.mark.parametrize("example", ["ray-train", "ray-tune"])
def test_a_ray_example_as_written_gets_its_ray_cluster_on_the_fake_nodes(
    kube: Kube, example: str
) -> None:
    """Issue 32: the CPU forms of examples/ray-train and ray-tune, unchanged (their
    runtime.pip names Ray for the local executor, left to the image here): Kueue admits the
    RayJob's head, two workers and submitter together, KubeRay builds the Ray cluster, and
    kube-scheduler places its head and both worker pods on the fake nodes, each worker with
    one worker's compute."""
    queue = queue_setup(kube, f"render-{example}")
    case = next(case for case in cases() if case.name == example)
    spec, target = placed(case.spec, case.target, queue)
    name = target.workload_name
    rayjob = kube.create(render_workload(spec, target))
    for body in render_dependents(spec, target, token=TOKEN, owner=Owner.of(rayjob)):
        kube.create(body)
    wait_until("the RayJob to be admitted", lambda: admitted(kube, rayjob), timeout=60)

    cluster_name = kube.ray_cluster_of(name, queue.namespace)["metadata"]["name"]

    def placed_pods() -> dict[str, list[dict[str, Any]]] | None:
        found = kube.list("v1", "Pod", queue.namespace, f"ray.io/cluster={cluster_name}")
        kinds: dict[str, list[dict[str, Any]]] = {"head": [], "worker": []}
        for pod in found:
            kind = pod["metadata"]["labels"].get("ray.io/node-type", "?")
            if (pod.get("spec") or {}).get("nodeName"):
                kinds.setdefault(kind, []).append(pod)
        return kinds if (len(kinds["head"]), len(kinds["worker"])) == (1, 2) else None

    # KubeRay makes the head first and the workers once it runs: minutes on a loaded machine.
    pods = wait_until(
        "the head and both workers placed on the fake nodes", placed_pods, timeout=240
    )
    for pod in pods["worker"]:
        container = pod["spec"]["containers"][0]
        assert container["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    kube.delete(RAY, "RayJob", name, queue.namespace)

    def pods_gone() -> bool | None:  # their room on the fake nodes is the next test's
        found = kube.list("v1", "Pod", queue.namespace, f"ray.io/cluster={cluster_name}")
        return True if not found else None

    wait_until("the Ray cluster's pods to go", pods_gone, timeout=180)


#: What waits for its pods after admission: the Job controller makes them at once (KubeRay's
#: RayJob pods come later, through its RayCluster: test_the_gpu_quickstart_rayjob_… above).
WORKLOAD_API = {"Job": ("batch/v1", "Job"), "RayJob": (RAY, "RayJob")}


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        ("qlora", 1),
        ("multi-node-torchrun", 16),
        # The GPU forms of the CPU examples (examples/<name>/tau.gpu.yaml, render_cases).
        ("ddp-gpu", 16),
        ("fsdp-gpu", 16),
        ("lora-gpu", 1),
        ("ray-tune-gpu", 2),
        ("ray-train-gpu", 8),
        ("deepspeed-gpu", 16),
    ],
)
def test_a_gpu_example_is_admitted_by_kueue_within_exactly_its_gpu_quota(
    kube: Kube, name: str, gpus: int
) -> None:
    """Issue 32: the GPU forms as written, in a ClusterQueue with just the GPUs they ask for:
    Kueue admits them, and a Job's pods carry the GPU pool's toleration and node labels, put
    there by Kueue from the flavor (the over-quota side is refused at submission,
    tests/runs/test_policy.py)."""
    queue = queue_setup(kube, f"render-{name[:8]}", gpus=gpus)
    case = next(case for case in cases() if case.name == name)
    spec, target = placed(case.spec, case.target, queue)
    workload_body = render_workload(spec, target)
    job = kube.create(workload_body)
    for body in render_dependents(spec, target, token=TOKEN, owner=Owner.of(job)):
        kube.create(body)
    wait_until("the workload to be admitted", lambda: admitted(kube, job), timeout=60)
    workload = workload_of(kube, job)
    assert workload is not None
    assignments = workload["status"]["admission"]["podSetAssignments"]
    used = sum(parse_quantity(a["resourceUsage"].get(GPU, "0")) for a in assignments)
    assert used == gpus, assignments
    if workload_body["kind"] == "Job":
        run_label = f"{labels.RUN}={target.run_name}"
        pods = wait_until(
            "the admitted Job's pods",
            lambda: (lambda found: found if len(found) == spec.compute.workers else None)(
                kube.list("v1", "Pod", queue.namespace, run_label)
            ),
            timeout=60,
        )
        for pod in pods:
            assert GPU_TOLERATION in pod["spec"]["tolerations"], pod["spec"]["tolerations"]
            assert pod["spec"]["nodeSelector"] == H100_LABELS
            resources = pod["spec"]["containers"][0]["resources"]
            assert resources["requests"][GPU] == resources["limits"][GPU] == str(spec.compute.gpus)
    api_version, kind = WORKLOAD_API[workload_body["kind"]]
    kube.delete(api_version, kind, target.workload_name, queue.namespace)
