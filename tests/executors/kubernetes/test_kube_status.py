"""The mapping from Kubernetes status to run state (executors/kubernetes/status.py), as a table.

The objects in tests/executors/kubernetes/kube_objects/ were captured from the test cluster
(kube-apiserver v1.35.4, Kueue v0.17.0, KubeRay v1.6.0, KWOK fake nodes; each file's ``note``
says how the situation was made): Kueue's own messages, the Job controller's conditions, the
pods KWOK ended, the RayJobs the real KubeRay operator moved. One was written in part by hand,
and its note says so: ``image_pull`` (KWOK does not pull images, so the ``ErrImagePull``
container status went through the pods/status subresource, as a kubelet writes it). The rows
below that change a captured object (``edit``) stand for what the test cluster cannot produce (a
node failure, a crash loop, a RayJob that succeeds: no Ray runs on KWOK) and are marked "by
hand" with the fields they set, in the shape the API reference gives. The XID rows give the
pods' nodes a condition as node-problem-detector writes it (``XIDErrors``, the driver's
kernel-log line as its message); ``tests/executors/kubernetes/test_kube_watcher.py`` patches
one into a KWOK node of the test cluster and follows a run to node_failure.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from executors.kubernetes.status import (
    IMAGE_HINT,
    XID_SETTLE,
    AttemptObjects,
    amount_words,
    observe,
    parse_time,
    waiting_reason,
)
from runs.models import FailureClass
from runs.observations import Observation

OBJECTS = Path(__file__).parent / "kube_objects"
Body = dict[str, Any]


def captured(name: str) -> Body:
    data: Body = json.loads((OBJECTS / f"{name}.json").read_text())
    return data


def objects_of(data: Body, *, created: bool = True) -> AttemptObjects:
    return AttemptObjects(
        workload_object=data["job"],
        kueue_workload=data["workload"],
        pods=data["pods"],
        events=data["events"],
        cluster_queue=data["cluster_queue"],
        created=created,
        nodes=data.get("nodes", []),
    )


def when(data: Body, seconds: float = 0) -> datetime:
    return datetime.fromisoformat(data["captured_at"]) + timedelta(seconds=seconds)


@dataclass(frozen=True)
class Row:
    case: str  # a file in kube_objects/
    state: str
    failure_class: FailureClass | None = None
    exit_code: int | None = None
    reason: str | None = None  # the whole reason, when given
    reason_has: tuple[str, ...] = ()  # or parts of it
    edit: Callable[[Body], None] | None = None  # "by hand": what the row changes
    later: float = 0  # seconds after the capture
    created: bool = True
    placed: dict[str, Any] = field(default_factory=dict)  # cluster_queue/node_names/…


def _condition(obj: Body, kind: str) -> Body:
    for condition in obj["status"]["conditions"]:
        if condition["type"] == kind:
            result: Body = condition
            return result
    raise AssertionError(f"no {kind} condition")


def evict(reason: str, message: str) -> Callable[[Body], None]:
    """By hand: Kueue's eviction of an admitted Workload, as Kueue writes it (Evicted=True
    with the reason, Admitted=False NoReservation), for reasons the test cluster cannot make."""

    def edit(data: Body) -> None:
        data["job"]["spec"]["suspend"] = True
        workload = data["workload"]
        workload["status"].pop("admission", None)
        _condition(workload, "Admitted").update(status="False", reason="NoReservation")
        workload["status"]["conditions"].append(
            {"type": "Evicted", "status": "True", "reason": reason, "message": message}
        )
        data["pods"] = []

    return edit


def container_state(**state: Any) -> Callable[[Body], None]:
    """By hand: the first pod's main container in this state (a kubelet's report)."""

    def edit(data: Body) -> None:
        data["pods"][0]["status"]["containerStatuses"][0].update(state)

    return edit


def set_status(**fields: Any) -> Callable[[Body], None]:
    def edit(data: Body) -> None:
        data["job"]["status"].update(fields)

    return edit


def ray_app_failed(data: Body) -> None:
    """By hand: the dashboard reported the Ray job FAILED; no pod says more (the submitter's
    pod is gone)."""
    set_status(jobDeploymentStatus="Complete", jobStatus="FAILED", reason="AppFailed")(data)
    data["pods"] = [p for p in data["pods"] if "submitter" not in str(p)]


def no_job(data: Body) -> None:
    data["job"] = None


def being_deleted(data: Body) -> None:
    data["job"]["metadata"]["deletionTimestamp"] = "2026-12-01T02:40:00Z"


def init_container_failed(data: Body) -> None:
    """By hand: the bundle fetcher (an init container) exited 1 and the pod failed."""
    pod = data["pods"][0]
    pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "PodInitializing"}}
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "tau-fetch-bundle",
            "image": "python:3.11-slim",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
        }
    ]


def staging_failed(data: Body) -> None:
    """By hand: the dataset stager (an init container after the fetcher) found a file whose
    bytes are not its manifest's; its last words are the pod's termination message."""
    init_container_failed(data)
    statuses = data["pods"][0]["status"]["initContainerStatuses"]
    statuses[0]["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    message = (
        "tau-stage-data: wiki@3 file part/a.txt: try 1 failed (timed out)\n"
        "tau-stage-data: wiki@3 file train/0001.jsonl: SHA-256 mismatch (the manifest says "
        + "ab" * 32
        + ", the store gave "
        + "cd" * 32
        + ")\n"
    )
    statuses.append(
        {
            "name": "tau-stage-data",
            "image": "python:3.11-slim",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
        }
    )


def taint_manager(data: Body) -> None:
    """By hand: the pod was deleted by the taint manager after its node went NotReady."""
    pod = data["pods"][0]
    pod["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
        }
    )
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": 137, "reason": "Error"}
    }


def node_not_ready(data: Body) -> None:
    """By hand: the node lifecycle controller's warning about the pod, then its exit 137."""
    pod = data["pods"][0]
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": 137, "reason": "Error"}
    }
    data["events"].append(
        {
            "type": "Warning",
            "reason": "NodeNotReady",
            "message": "Node is not ready",
            "involvedObject": {
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "namespace": pod["metadata"]["namespace"],
            },
        }
    )


#: The driver's kernel-log lines, as node-problem-detector's kernel monitor quotes them.
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2137, name=python, GPU has fallen off the bus."
XID_31 = "NVRM: Xid (PCI:0000:3b:00): 31, pid=2137, name=python, Ch 00000008, intr 10000000."
XID_13_THEN_48 = (
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=2137, Graphics Exception on (GPC 0, TPC 1); "
    "NVRM: Xid (PCI:0000:86:00): 48, pid=2137, DBE (double bit error) ECC error."
)


def xid_condition(
    message: str,
    *,
    node: str = "gpu-h100-1",
    status: str = "True",
    at: str = "2026-12-01T02:33:40Z",
    condition: str = "XIDErrors",
) -> Callable[[Body], None]:
    """By hand: node-problem-detector's XID condition on ``node`` (the failed pods of the
    captured Jobs ran on gpu-h100-1 from 02:33:49 to 02:33:50), with its other conditions
    and the node's other fields as a kubelet writes them, which observe must not mind."""

    def edit(data: Body) -> None:
        data.setdefault("nodes", []).append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {"taugrid.io/pool": "gpu-h100"}},
                "status": {
                    "capacity": {"nvidia.com/gpu": "8"},
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                        {
                            "type": condition,
                            "status": status,
                            "reason": "XIDError" if status == "True" else "NoXIDError",
                            "message": message,
                            "lastHeartbeatTime": "2026-12-01T02:33:55Z",
                            "lastTransitionTime": at,
                        },
                    ],
                },
            }
        )

    edit.__name__ = f"xid_{status.lower()}_on_{node}"
    return edit


def both(*edits: Callable[[Body], None]) -> Callable[[Body], None]:
    def edit(data: Body) -> None:
        for each in edits:
            each(data)

    edit.__name__ = "+".join(each.__name__ for each in edits)
    return edit


def pending_message(message: str) -> Callable[[Body], None]:
    def edit(data: Body) -> None:
        _condition(data["workload"], "QuotaReserved")["message"] = message

    return edit


def no_workload_yet(data: Body) -> None:
    data["workload"] = None


WAITING_H100 = (
    "Waiting for 4 GPUs (nvidia.com/gpu) on flavor h100: the workspace uses 8 of its 8, "
    "and its cohort has none to lend."
)

TABLE: list[Row] = [
    # -- queued: Kueue's message in plain words ---------------------------------------------
    Row("queued_cohort_has_none", "queued", reason=WAITING_H100),
    Row(
        "queued_cohort_lends_some",
        "queued",
        reason="Waiting for 4 GPUs (nvidia.com/gpu) on flavor h100: the workspace uses 8 of its "
        "8, and its cohort can lend only 2.",
    ),
    Row(
        "queued_never_fits",
        "queued",
        reason="It asks for 24 GPUs (nvidia.com/gpu) on flavor h100, more than the workspace "
        "can ever get there (at most 12, borrowing included): it will wait until the quota "
        "is raised.",
    ),
    Row(
        "queued_cohort_has_none",
        "queued",
        reason_has=("Waiting: the workspace's queue alpha does not exist",),
        edit=pending_message("LocalQueue alpha doesn't exist"),
    ),
    Row(
        "queued_cohort_has_none",
        "queued",
        reason_has=("Flavor h100's nodes carry a taint the run does not tolerate",),
        edit=pending_message(
            "couldn't assign flavors to pod set main: untolerated taint "
            "{nvidia.com/gpu present NoSchedule <nil>} in flavor h100"
        ),
    ),
    Row(
        "queued_cohort_has_none",
        "queued",
        reason="Waiting: the workspace's ClusterQueue does not admit runs from its namespace; "
        "the platform team can fix that.",
        edit=pending_message("Workload namespace doesn't match ClusterQueue selector"),
    ),
    Row(
        "queued_cohort_has_none",
        "queued",
        reason="Waiting for Kueue: something new",
        edit=pending_message("something new"),
    ),
    Row(
        "queued_cohort_has_none",
        "queued",
        reason="",  # Kueue has said nothing yet: the backend's reason stays
        edit=no_workload_yet,
    ),
    # -- admitted, running, succeeded ----------------------------------------------------------
    Row(
        "admitted_unschedulable",
        "admitted",
        reason_has=(
            "Admitted by Kueue, but no node has taken pod nosched-",
            "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector.",
        ),
        placed={"node_names": ()},
    ),
    Row("admitted_unschedulable", "admitted", reason="", later=-30),  # not long yet
    Row(
        "running",
        "running",
        reason="Running.",
        placed={
            "node_names": ("gpu-h100-1",),
            "flavors": {"cpu": "h100", "memory": "h100", "nvidia.com/gpu": "h100"},
        },
    ),
    Row("succeeded", "succeeded", exit_code=0, reason="Finished successfully."),
    Row("requeued_readmitted", "running"),  # preempted earlier, admitted again: runs on
    Row("rayjob_running", "running", placed={"node_names": ("cpu-1", "cpu-2")}),
    Row(
        "rayjob_running",
        "succeeded",
        exit_code=0,
        # By hand: what KubeRay writes once the Ray dashboard reports success (no Ray runs on
        # KWOK, so the test cluster's operator never gets there).
        edit=set_status(jobDeploymentStatus="Complete", jobStatus="SUCCEEDED"),
    ),
    # -- failures, each with its class and hint ------------------------------------------------
    Row(
        "failed_oom",
        "failed",
        FailureClass.OOM_KILLED,
        137,
        reason_has=("ran out of memory and was killed (OOMKilled) (its limit is 1Gi)",),
    ),
    Row(
        "failed_exit_code",
        "failed",
        FailureClass.USER_ERROR,
        3,
        reason_has=("Container main of pod exit3-", "exited with code 3."),
    ),
    Row(
        "failed_deadline",
        "failed",
        FailureClass.DEADLINE_EXCEEDED,
        reason="Stopped by Kubernetes: it ran longer than its 3 s (run.max_runtime).",
    ),
    Row(
        "image_pull",
        "failed",
        FailureClass.USER_ERROR,
        reason_has=("image registry.example.org/team/trainer:v9: ErrImagePull", IMAGE_HINT),
    ),
    Row("image_pull", "admitted", later=-179),  # 1 s into the pull: the kubelet tries again
    Row(
        "image_pull",
        "failed",
        FailureClass.USER_ERROR,
        reason_has=(IMAGE_HINT,),
        later=-179,
        edit=container_state(
            state={"waiting": {"reason": "InvalidImageName", "message": "bad name"}}
        ),
    ),
    Row(
        "running",
        "failed",
        FailureClass.OOM_KILLED,
        137,
        reason_has=("keeps running out of memory",),
        edit=container_state(  # by hand: a restarting container, as a kubelet reports it
            state={"waiting": {"reason": "CrashLoopBackOff"}},
            lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            restartCount=3,
        ),
    ),
    Row(
        "running",
        "failed",
        FailureClass.USER_ERROR,
        2,
        reason_has=("keeps crashing (exit code 2; restarted 4 times)",),
        edit=container_state(
            state={"waiting": {"reason": "CrashLoopBackOff"}},
            lastState={"terminated": {"exitCode": 2, "reason": "Error"}},
            restartCount=4,
        ),
    ),
    Row(
        "failed_exit_code",
        "failed",
        FailureClass.INFRASTRUCTURE,
        reason_has=("init container tau-fetch-bundle", "exited with code 1"),
        edit=init_container_failed,
    ),
    Row(
        "failed_exit_code",
        "failed",
        FailureClass.INFRASTRUCTURE,
        reason_has=(
            "init container tau-stage-data (which downloads and checks the run's datasets) "
            "exited with code 1 in pod ",
            ": tau-stage-data: wiki@3 file train/0001.jsonl: SHA-256 mismatch",
        ),
        edit=staging_failed,
    ),
    Row(
        "failed_exit_code",
        "failed",
        FailureClass.NODE_FAILURE,
        reason_has=("its node became unavailable",),
        edit=taint_manager,
    ),
    Row(
        "failed_exit_code",
        "failed",
        FailureClass.NODE_FAILURE,
        reason_has=("(Node is not ready)",),
        edit=node_not_ready,
    ),
    Row(
        "rayjob_submitter_failed",
        "failed",
        FailureClass.USER_ERROR,
        1,
        reason_has=("Container ray-job-submitter of pod rj-subfail-", "exited with code 1"),
    ),
    # -- an XID error on the node under a pod that failed (module docstring, "XID errors") ------
    Row(
        "failed_exit_code",
        "failed",
        FailureClass.NODE_FAILURE,
        3,
        reason="The GPU node gpu-h100-1 under pod exit3-slt7t reported XID 79: GPU has fallen "
        "off the bus (condition XIDErrors since 02:33:40 UTC): a fault of the machine, not of "
        "the program. Container main of pod exit3-slt7t exited with code 3.",
        edit=xid_condition(XID_79),
    ),
    Row(
        "failed_exit_code",
        "failed",
        FailureClass.USER_ERROR,
        3,
        reason="Container main of pod exit3-slt7t exited with code 3. Its GPU on node "
        "gpu-h100-1 reported XID 31: GPU memory page fault (the program accessed memory it "
        "does not own) — usually a bug in the program, not the machine (condition XIDErrors "
        "since 02:33:40 UTC).",
        edit=xid_condition(XID_31),
    ),
    Row(  # several XIDs: the machine's decides, the program's is named with it
        "failed_exit_code",
        "failed",
        FailureClass.NODE_FAILURE,
        3,
        reason_has=(
            "reported XID 48: double-bit ECC error: GPU memory is corrupt (condition XIDErrors "
            "since 02:33:40 UTC; also XID 13): a fault of the machine",
        ),
        edit=xid_condition(XID_13_THEN_48),
    ),
    Row(  # a machine XID on one condition, a program's on another: the machine's
        "failed_exit_code",
        "failed",
        FailureClass.NODE_FAILURE,
        3,
        reason_has=("reported XID 79: GPU has fallen off the bus (condition GpuXidFault since",),
        edit=both(xid_condition(XID_31), xid_condition(XID_79, condition="GpuXidFault")),
    ),
    Row(  # it stood for days before the pod came: the pod ran on that GPU
        "failed_exit_code",
        "failed",
        FailureClass.NODE_FAILURE,
        3,
        reason_has=("(condition XIDErrors since 2026-11-28 09:00:00 UTC)",),
        edit=xid_condition(XID_79, at="2026-11-28T09:00:00Z"),
    ),
    Row(  # it cleared while the pod ran (a GPU reset): it was there during the pod's life
        "failed_exit_code",
        "failed",
        FailureClass.NODE_FAILURE,
        3,
        reason_has=("(condition XIDErrors, cleared at 02:33:50 UTC)",),
        edit=xid_condition(XID_79, status="False", at="2026-12-01T02:33:50Z"),
    ),
    Row(  # it cleared well before the pod started: not about this pod
        "failed_exit_code",
        "failed",
        FailureClass.USER_ERROR,
        3,
        reason="Container main of pod exit3-slt7t exited with code 3.",
        edit=xid_condition(XID_79, status="False", at="2026-12-01T02:20:00Z"),
    ),
    Row(  # it came up minutes after the pod failed: not what ended it
        "failed_exit_code",
        "failed",
        FailureClass.USER_ERROR,
        3,
        reason="Container main of pod exit3-slt7t exited with code 3.",
        edit=xid_condition(XID_79, at="2026-12-01T02:40:00Z"),
        later=600,
    ),
    Row(  # on a node where the attempt had no pod
        "failed_exit_code",
        "failed",
        FailureClass.USER_ERROR,
        3,
        reason="Container main of pod exit3-slt7t exited with code 3.",
        edit=xid_condition(XID_79, node="gpu-h100-2"),
    ),
    Row(  # a condition that names no code: nothing to weigh
        "failed_exit_code",
        "failed",
        FailureClass.USER_ERROR,
        3,
        reason="Container main of pod exit3-slt7t exited with code 3.",
        edit=xid_condition("GPU errors were detected"),
    ),
    Row(  # the kubelet saw the pod run out of memory: that wins over the node's XID
        "failed_oom",
        "failed",
        FailureClass.OOM_KILLED,
        137,
        reason_has=("ran out of memory and was killed (OOMKilled)",),
        edit=xid_condition(XID_79),
    ),
    Row(  # a crash loop on a node whose GPU fell off the bus
        "running",
        "failed",
        FailureClass.NODE_FAILURE,
        2,
        reason_has=(
            "The GPU node gpu-h100-1 under pod blocker-t46v5 reported XID 79",
            "Container main of pod blocker-t46v5 keeps crashing (exit code 2; restarted 4 times).",
        ),
        edit=both(
            container_state(
                state={"waiting": {"reason": "CrashLoopBackOff"}},
                lastState={
                    "terminated": {
                        "exitCode": 2,
                        "reason": "Error",
                        "startedAt": "2026-12-01T02:33:15Z",
                        "finishedAt": "2026-12-01T02:33:16Z",
                    }
                },
                restartCount=4,
            ),
            xid_condition(XID_79, at="2026-12-01T02:33:12Z"),
        ),
    ),
    Row(  # a RayJob whose submitter ran on a node with a machine XID (by hand: on cpu-2)
        "rayjob_submitter_failed",
        "failed",
        FailureClass.NODE_FAILURE,
        1,
        reason_has=("The GPU node cpu-2 under pod rj-subfail-65fdb reported XID 79",),
        edit=xid_condition(XID_79, node="cpu-2", at="2026-12-01T02:34:38Z"),
    ),
    Row(  # the operator never heard from the Ray dashboard: the outcome is unknown, not a
        # platform failure to retry ("environment, image or dependencies")
        "rayjob_grace_failed",
        "failed",
        FailureClass.UNKNOWN,
        reason_has=(
            "KubeRay could not learn how the Ray job ended",
            "the Ray dashboard (rj-grace-c5n7g-head-svc.ray-1738.svc.cluster.local:8265) never "
            "reported a final status, so whether the program succeeded is unknown",
            "KubeRay says: The RayJob submitter finished",
        ),
    ),
    Row(
        "rayjob_running",
        "failed",
        FailureClass.DEADLINE_EXCEEDED,
        reason_has=("Stopped by KubeRay",),
        edit=set_status(jobDeploymentStatus="Failed", reason="DeadlineExceeded"),
    ),
    Row(
        "rayjob_running",
        "failed",
        FailureClass.USER_ERROR,
        edit=ray_app_failed,
        reason_has=("The Ray job failed.",),
    ),
    # -- Kueue's evictions ---------------------------------------------------------------------
    Row(
        "preempted",
        "preempted",
        FailureClass.PREEMPTED,
        reason="Kueue preempted it to make room for higher-priority work (prioritization in "
        "the ClusterQueue).",
    ),
    Row(
        "running",
        "failed",
        FailureClass.NODE_FAILURE,
        reason_has=("a node it ran on failed",),
        edit=evict("NodeFailures", "Workload was evicted due to node failures"),
    ),
    Row(
        "running",
        "failed",
        FailureClass.DEADLINE_EXCEEDED,
        reason_has=("maximum execution time",),
        edit=evict("DeactivatedDueToMaximumExecutionTimeExceeded", "exceeding the maximum"),
    ),
    Row(
        "running",
        "evicted",
        FailureClass.EVICTED,
        reason_has=("deactivated",),
        edit=evict("InactiveWorkload", "The workload is deactivated"),
    ),
    Row(
        "running",
        "evicted",
        FailureClass.EVICTED,
        reason_has=("pods were not ready in time",),
        edit=evict("PodsReadyTimeout", "Exceeded the PodsReady timeout"),
    ),
    # -- objects TauGrid did not delete ---------------------------------------------------------
    Row(
        "running",
        "failed",
        FailureClass.INFRASTRUCTURE,
        reason_has=("Its Job or RayJob is gone, deleted outside TauGrid",),
        edit=no_job,
    ),
    Row("running", "nothing", edit=no_job, created=False),  # not created yet: nothing to say
    Row(
        "running",
        "failed",
        FailureClass.INFRASTRUCTURE,
        reason_has=("Its Job is being deleted",),
        edit=being_deleted,
    ),
]


def _id(row: Row) -> str:
    edited = f"+{row.edit.__name__}" if row.edit is not None else ""
    return f"{row.case}{edited}->{row.state}{':' + row.failure_class if row.failure_class else ''}"


@pytest.mark.parametrize("row", TABLE, ids=[_id(row) for row in TABLE])
def test_kubernetes_status_maps_to_run_state(row: Row) -> None:
    data = copy.deepcopy(captured(row.case))
    if row.edit is not None:
        row.edit(data)
    seen = observe(objects_of(data, created=row.created), now=when(data, row.later))
    assert (seen.state, seen.failure_class, seen.exit_code) == (
        row.state,
        row.failure_class,
        row.exit_code,
    ), seen.reason
    if row.reason is not None:
        assert seen.reason == row.reason
    for part in row.reason_has:
        assert part in seen.reason
    for name, value in row.placed.items():
        assert getattr(seen, name) == value


def test_every_captured_object_is_in_the_table() -> None:
    assert {path.stem for path in OBJECTS.glob("*.json")} <= {row.case for row in TABLE}


def test_where_kueue_placed_it() -> None:
    seen = observe(objects_of(captured("running")), now=when(captured("running")))
    assert seen.cluster_queue.startswith("ws-")
    assert seen.flavors == {"cpu": "h100", "memory": "h100", "nvidia.com/gpu": "h100"}
    assert seen.ran
    assert seen.admitted
    assert not seen.object_active


def test_an_attempt_taugrid_must_clean_up_after() -> None:
    """Preempted (Kueue suspended the Job and would admit it again) and stuck on an image:
    the Job is still active; a Job that failed by itself is not."""
    assert observe(objects_of(captured("preempted")), now=when(captured("preempted"))).object_active
    assert observe(
        objects_of(captured("image_pull")), now=when(captured("image_pull"))
    ).object_active
    oom = captured("failed_oom")
    assert not observe(objects_of(oom), now=when(oom)).object_active


def test_the_same_objects_give_the_same_observation() -> None:
    """What the watcher compares to skip work: equal objects, equal observations."""
    data = captured("running")
    first = observe(objects_of(data), now=when(data))
    again = observe(objects_of(copy.deepcopy(data)), now=when(data, 5))
    assert first == again
    assert isinstance(first, Observation)


def test_waiting_reason_without_the_cluster_queue() -> None:
    """The ClusterQueue not (yet) in the watcher's cache: Kueue's numbers only."""
    data = captured("queued_cohort_has_none")
    assert waiting_reason(data["workload"], None) == (
        "Waiting for 4 GPUs (nvidia.com/gpu) on flavor h100: 4 more than is free now."
    )


def test_waiting_reason_outside_a_cohort() -> None:
    data = captured("queued_cohort_has_none")
    data["cluster_queue"]["spec"].pop("cohortName")
    assert waiting_reason(data["workload"], data["cluster_queue"]) == (
        "Waiting for 4 GPUs (nvidia.com/gpu) on flavor h100: the workspace uses 8 of its 8."
    )


def test_waiting_reason_for_two_pod_sets() -> None:
    """Kueue joins pod sets with "; " and one pod set's reasons with ", " (which also occurs
    inside a reason): each is found by its pattern."""
    workload = copy.deepcopy(captured("queued_cohort_has_none")["workload"])
    _condition(workload, "QuotaReserved")["message"] = (
        "couldn't assign flavors to pod set head: insufficient unused quota for cpu in flavor "
        "cpu, 2 more needed; couldn't assign flavors to pod set workers: insufficient unused "
        "quota for memory in flavor cpu, 16Gi more needed, insufficient unused quota for "
        "nvidia.com/gpu in flavor h100, 1 more needed"
    )
    workload["status"]["resourceRequests"] = [
        {"name": "head", "resources": {"cpu": "2"}},
        {"name": "workers", "resources": {"memory": "64Gi", "nvidia.com/gpu": "8"}},
    ]
    assert waiting_reason(workload, None) == (
        "Waiting for 2 CPUs on flavor cpu: 2 more than is free now. "
        "Waiting for 64Gi of memory on flavor cpu: 16Gi more than is free now. "
        "Waiting for 8 GPUs (nvidia.com/gpu) on flavor h100: 1 more than is free now."
    )


@pytest.mark.parametrize(
    ("resource", "amount", "words"),
    [
        ("nvidia.com/gpu", "1", "1 GPU (nvidia.com/gpu)"),
        ("amd.com/gpu", "2", "2 GPUs (amd.com/gpu)"),
        ("cpu", "500m", "0.5 CPUs"),
        ("cpu", "1", "1 CPU"),
        ("memory", "17179869184", "16Gi of memory"),
        ("example.com/fpga", "3", "3 example.com/fpga"),
    ],
)
def test_amounts_in_words(resource: str, amount: str, words: str) -> None:
    from tau.quantity import parse_quantity

    assert amount_words(resource, parse_quantity(amount)) == words


def test_a_gpu_programs_failure_waits_for_a_late_xid() -> None:
    """A GPU pod's non-zero exit with no XID in its window yet carries ``settles_at`` (its end
    plus the hold) while the hold lasts: node-problem-detector may still report the XID that
    killed it. The reading itself is already the program's; the watcher applies it only then."""
    data = captured("failed_exit_code")  # the 1-GPU pod on gpu-h100-1 exited 3 at 02:33:50
    ended = datetime(2026, 12, 1, 2, 33, 50, tzinfo=UTC)
    for seconds_after, settles_at in (
        (5, ended + XID_SETTLE),
        (29, ended + XID_SETTLE),
        (31, None),
    ):
        seen = observe(objects_of(data), now=ended + timedelta(seconds=seconds_after))
        assert (seen.failure_class, seen.exit_code) == (FailureClass.USER_ERROR, 3)
        assert seen.settles_at == settles_at, seconds_after
    early = ended + timedelta(seconds=5)
    assert observe(objects_of(data), now=early, xid_settle=timedelta(0)).settles_at is None

    # The late XID arrives within the hold: a node failure, read at once.
    late = copy.deepcopy(data)
    xid_condition(XID_79, at="2026-12-01T02:34:10Z")(late)
    seen = observe(objects_of(late), now=ended + timedelta(seconds=21))
    assert (seen.failure_class, seen.settles_at) == (FailureClass.NODE_FAILURE, None)
    assert "reported XID 79: GPU has fallen off the bus" in seen.reason

    # Without GPUs, or killed for memory: nothing for an XID to explain, read at once.
    cpu_only = copy.deepcopy(data)
    for place in ("limits", "requests"):
        del cpu_only["pods"][0]["spec"]["containers"][0]["resources"][place]["nvidia.com/gpu"]
    assert observe(objects_of(cpu_only), now=early).settles_at is None
    oom = captured("failed_oom")
    assert observe(objects_of(oom), now=when(oom)).settles_at is None


@pytest.mark.parametrize(
    ("case", "ended_by"),
    [("succeeded", "Complete"), ("failed_exit_code", "Failed"), ("failed_deadline", "Failed")],
)
def test_kueues_admission_and_the_jobs_end_are_read_as_stamped(case: str, ended_by: str) -> None:
    """What an attempt used is counted between these (runs.accounting): Kueue's admission and
    the Job's own end, from the captured objects, not the time the watcher looked."""
    data = captured(case)
    observation = observe(objects_of(data), now=when(data, 60))
    assert observation.admitted_at == parse_time(
        _condition(data["workload"], "Admitted")["lastTransitionTime"]
    )
    assert observation.ended_at == parse_time(
        _condition(data["job"], ended_by)["lastTransitionTime"]
    )
    assert observation.admitted_at is not None
    assert observation.ended_at is not None
    assert observation.admitted_at <= observation.ended_at


def test_a_running_attempt_has_an_admission_and_no_end() -> None:
    data = captured("running")
    observation = observe(objects_of(data), now=when(data))
    assert observation.admitted_at is not None
    assert observation.ended_at is None
