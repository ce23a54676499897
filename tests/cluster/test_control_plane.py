"""Smoke tests proving the test control plane is the real thing (issue 3).

Each test owns its namespaces, ResourceFlavors and ClusterQueues (random suffixes; each
ClusterQueue selects only its test's namespace), so the tests are independent of each other and
of anything else running on the shared cluster. Waits poll with timeouts; nothing sleeps blindly.

Admission and the operators' reactions are tested here; what happens to the pods afterwards
(kube-scheduler, KWOK's fake nodes and their Stages, pods/log) in test_fake_nodes.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.kueue_objects import (
    GPU,
    GPU_TOLERATION,
    H100_LABELS,
    KUEUE,
    QUEUE_LABEL,
    TEST_DURATION,
    batch_job,
    conditions,
    is_true,
    queue_setup,
    workload_of,
)
from tests.cluster.plugin import RAY_SUBMITTER, Kube, KubeCluster, load_controlplane, wait_until
from tests.scripts import load_script

pytestmark = pytest.mark.cluster

RAY = "ray.io/v1"
RAY_IMAGE = "rayproject/ray:2.46.0"


# ---------------------------------------------------------------------------------------------
# Object builders (Kueue v1beta2, ray.io/v1, batch/v1)
# ---------------------------------------------------------------------------------------------


def ray_job(
    name: str,
    namespace: str,
    queue: str | None,
    *,
    gpus: int = 1,
    shutdown_after_finish: bool = True,
) -> dict[str, Any]:
    """A Kueue-managed RayJob: a CPU head and one worker with `gpus` GPUs."""
    head = {"cpu": "1", "memory": "2Gi"}
    worker = {"cpu": "4", "memory": "16Gi", GPU: str(gpus)}
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {
        "apiVersion": RAY,
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "entrypoint": "python -c 'import ray; ray.init(); print(ray.cluster_resources())'",
            "shutdownAfterJobFinishes": shutdown_after_finish,
            "rayClusterSpec": {
                "rayVersion": "2.46.0",
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "ray-head",
                                    "image": RAY_IMAGE,
                                    "resources": {"requests": head, "limits": head},
                                }
                            ]
                        }
                    },
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": {
                            "spec": {
                                "containers": [
                                    {
                                        "name": "ray-worker",
                                        "image": RAY_IMAGE,
                                        "resources": {"requests": worker, "limits": worker},
                                    }
                                ]
                            }
                        },
                    }
                ],
            },
        },
    }


def suspended(kube: Kube, api_version: str, kind: str, name: str, namespace: str) -> bool:
    """spec.suspend of a job; an absent field (Kueue writes `false`, omitted) is not suspended."""
    job = kube.get(api_version, kind, name, namespace)
    assert job is not None, f"{kind} {namespace}/{name} disappeared"
    return bool(job["spec"].get("suspend", False))


# ---------------------------------------------------------------------------------------------
# 1. batch/v1 Job: suspended by Kueue's webhook, Workload by job-uid, admitted and unsuspended
# ---------------------------------------------------------------------------------------------


def test_labelled_job_is_suspended_then_admitted(kube: Kube) -> None:
    namespace, _, _ = queue_setup(kube, "t1", gpus=2)
    job = kube.create(batch_job("train", namespace, "team", gpus=1))
    assert job["spec"]["suspend"] is True, "Kueue's mutating webhook did not suspend the Job"

    workload = wait_until(
        "the Job's Workload (by kueue.x-k8s.io/job-uid)", lambda: workload_of(kube, job), timeout=30
    )
    owner = workload["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Job", "train", job["metadata"]["uid"])

    wait_until(
        "the Workload to be Admitted",
        lambda: True if is_true(workload_of(kube, job), "Admitted") else None,
        describe=lambda: str(conditions(workload_of(kube, job))),
    )
    wait_until(
        "Kueue to unsuspend the admitted Job",
        lambda: None if suspended(kube, "batch/v1", "Job", "train", namespace) else True,
    )
    # The controller-manager's Job controller then creates the pod, with what Kueue put on the
    # admitted Job from its flavor: the H100 node labels and the GPU pool's toleration.
    pods = wait_until(
        "the Job's pod", lambda: kube.list("v1", "Pod", namespace, "job-name=train") or None
    )
    assert pods[0]["spec"]["nodeSelector"] == H100_LABELS
    assert GPU_TOLERATION in pods[0]["spec"]["tolerations"]


# ---------------------------------------------------------------------------------------------
# 2. Quota of 2 GPUs, three 1-GPU RayJobs: two admitted, one pending with Kueue's own message
# ---------------------------------------------------------------------------------------------


def test_gpu_quota_admits_two_of_three_rayjobs(kube: Kube) -> None:
    namespace, _, _ = queue_setup(kube, "t2", gpus=2)
    jobs = [kube.create(ray_job(f"rj-{i}", namespace, "team")) for i in range(3)]
    assert all(j["spec"]["suspend"] is True for j in jobs)

    def split() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        workloads = [workload_of(kube, j) for j in jobs]
        if any(w is None for w in workloads):
            return None
        admitted = [w for w in workloads if w and is_true(w, "Admitted")]
        pending = [
            w
            for w in workloads
            if w and conditions(w).get("QuotaReserved", {}).get("status") == "False"
        ]
        return (admitted, pending) if len(admitted) == 2 and len(pending) == 1 else None

    admitted, pending = wait_until(
        "two admitted Workloads and one pending",
        split,
        timeout=90,
        describe=lambda: str([conditions(workload_of(kube, j)) for j in jobs]),
    )
    message = conditions(pending[0])["QuotaReserved"]["message"]
    assert "insufficient unused quota" in message, message
    assert GPU in message, message

    # Kueue's visibility API, served by Kueue through the apiserver's aggregator.
    visibility = (
        f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}"
        "/localqueues/team/pendingworkloads"
    )
    listed = wait_until(
        "the pending Workload in Kueue's visibility API",
        lambda: kube.raw_get(visibility)["items"] or None,
    )
    assert [w["metadata"]["name"] for w in listed] == [pending[0]["metadata"]["name"]]
    assert listed[0]["positionInLocalQueue"] == 0

    def job_named(workload: dict[str, Any]) -> str:
        return str(workload["metadata"]["ownerReferences"][0]["name"])

    def unsuspended(name: str) -> Callable[[], bool | None]:
        return lambda: None if suspended(kube, RAY, "RayJob", name, namespace) else True

    for workload in admitted:
        wait_until(
            f"RayJob {job_named(workload)} to be unsuspended", unsuspended(job_named(workload))
        )
    waiting = job_named(pending[0])
    assert suspended(kube, RAY, "RayJob", waiting, namespace)

    kube.delete(RAY, "RayJob", job_named(admitted[0]), namespace)
    wait_until(
        f"the pending RayJob {waiting} to be admitted once quota is freed",
        lambda: (
            True
            if is_true(
                workload_of(kube, kube.get(RAY, "RayJob", waiting, namespace) or {}), "Admitted"
            )
            else None
        ),
        timeout=90,
        describe=lambda: str(conditions(pending[0])),
    )


# ---------------------------------------------------------------------------------------------
# 3. Cohort: a busy ClusterQueue borrows an idle one's quota
# ---------------------------------------------------------------------------------------------


def test_cohort_borrows_idle_quota(kube: Kube) -> None:
    cohort = kube.unique("t3-cohort")
    namespace, flavor, busy_cq = queue_setup(kube, "t3a", gpus=2, cohort=cohort)
    # The idle queue: same flavor, nothing is ever submitted to it.
    queue_setup(kube, "t3b", gpus=4, cohort=cohort, flavor=flavor)

    # 2 own + 3 borrowed; its pod keeps running (fake node) while the reservation is read.
    job = kube.create(
        batch_job("needs-five", namespace, "team", gpus=5, pod_annotations={TEST_DURATION: "10m"})
    )
    wait_until(
        "the 5-GPU Job to be admitted by borrowing",
        lambda: True if is_true(workload_of(kube, job), "Admitted") else None,
        describe=lambda: str(conditions(workload_of(kube, job))),
    )

    def gpu_reservation() -> dict[str, Any] | None:
        cq = kube.get(KUEUE, "ClusterQueue", busy_cq)
        for flavor in ((cq or {}).get("status") or {}).get("flavorsReservation") or []:
            for res in flavor.get("resources", []):
                if res["name"] == GPU and str(res.get("borrowed")) == "3":
                    return dict(res)
        return None

    reservation = wait_until(
        "ClusterQueue status to show 3 borrowed GPUs",
        gpu_reservation,
        describe=lambda: str(kube.get(KUEUE, "ClusterQueue", busy_cq)),
    )
    assert str(reservation["total"]) == "5"


# ---------------------------------------------------------------------------------------------
# 4. Real validation: Kueue's webhook and the CRD schema both reject bad RayJobs
# ---------------------------------------------------------------------------------------------


def rejection(error: Exception) -> tuple[int, str]:
    """HTTP status and the apiserver's Status message of a refused request."""
    status = int(getattr(error, "status", 0))
    body = getattr(error, "body", b"") or b""
    try:
        message = str(json.loads(body).get("message", body))
    except ValueError:
        message = str(body)
    return status, message


def test_bad_rayjobs_are_rejected(kube: Kube) -> None:
    from kubernetes.dynamic.exceptions import DynamicApiError

    namespace, _, _ = queue_setup(kube, "t4", gpus=2)

    with pytest.raises(DynamicApiError) as by_kueue:
        kube.create(ray_job("keeps-cluster", namespace, "team", shutdown_after_finish=False))
    status, message = rejection(by_kueue.value)
    assert status == 403, message
    assert message.startswith('admission webhook "vrayjob.kb.io" denied the request'), message
    assert "spec.shutdownAfterJobFinishes: Invalid value: false" in message, message

    # Missing headGroupSpec decodes fine in Go (so Kueue's webhook is not what objects): the
    # apiserver's structural schema from the KubeRay CRD rejects it.
    invalid = ray_job("no-head", namespace, None)
    del invalid["spec"]["rayClusterSpec"]["headGroupSpec"]
    with pytest.raises(DynamicApiError) as by_schema:
        kube.create(invalid)
    status, message = rejection(by_schema.value)
    assert status == 422, message
    assert "spec.rayClusterSpec.headGroupSpec: Required value" in message, message
    assert "admission webhook" not in message, message


# ---------------------------------------------------------------------------------------------
# 5. The KubeRay operator reacts to an admitted RayJob
# ---------------------------------------------------------------------------------------------


def test_admitted_rayjob_gets_a_raycluster(kube: Kube) -> None:
    """An admitted RayJob makes the real KubeRay operator create its RayCluster.

    (Its pods are then scheduled to the fake GPU nodes and run there; no Ray process runs.)
    """
    namespace, _, _ = queue_setup(kube, "t5", gpus=2)
    job = kube.create(ray_job("trainer", namespace, "team"))
    wait_until(
        "the RayJob to be admitted",
        lambda: True if is_true(workload_of(kube, job), "Admitted") else None,
    )

    ray_cluster = kube.ray_cluster_of("trainer", namespace)
    owners = ray_cluster["metadata"].get("ownerReferences") or []
    assert any(o["kind"] == "RayJob" and o["uid"] == job["metadata"]["uid"] for o in owners)
    workers = ray_cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert workers["resources"]["limits"][GPU] == "1"


# ---------------------------------------------------------------------------------------------
# 6. Its processes listen on loopback only (and `down` leaves none of them behind)
# ---------------------------------------------------------------------------------------------


def test_every_process_of_the_control_plane_listens_on_loopback_only(
    kube_cluster: KubeCluster,
) -> None:
    """Every socket the session's control plane listens on, its Ray head's and the stand-in
    for KubeRay's submitter pods' included, is on 127.0.0.1 (the Ray head's dashboard on
    another loopback address). That ``down`` then leaves none of these processes and ports
    behind is checked when the session stops the control plane it started (tests/cluster/
    plugin.py, ``kube_cluster``): a second control plane only for that took a minute and a
    half of the two cores."""
    controlplane = load_controlplane()
    state = kube_cluster.state_dir
    head = load_script(RAY_SUBMITTER, "taugrid_ray_submitter").head_of(state)
    assert head is not None, "the session's control plane has no Ray head?"
    ray_pids = controlplane.load_ray_head().pids_naming(head.temp_dir)
    assert ray_pids, "no process of the Ray head?"
    pids = controlplane.owned_pids(state) + ray_pids
    assert len(pids) >= len(controlplane.PROCESSES + controlplane.RAY_PROCESSES), pids
    listening = controlplane.listening_sockets(pids)
    assert listening, "the control plane's processes listen on nothing?"
    assert {host for host, _ in listening} == {"127.0.0.1", head.dashboard_host}, listening
