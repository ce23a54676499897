"""What Kubernetes says about one attempt of a run, as what TauGrid says about it: one pure
function, :func:`observe`, from the attempt's objects (its Job or RayJob, Kueue's Workload
for it, its pods, the warning Events about them, the ClusterQueue it waits in, and the XID
conditions of the Nodes its pods are bound to) to a :class:`runs.observations.Observation`:
the run state they mean, a reason in plain words, the failure class and exit code of an
attempt that ended, and where Kueue placed it. No cluster access, no database: the watcher
(``executors.kubernetes.watcher``) gathers the objects and applies the observation with the
core's decision table (``runs.observations.apply_observation``, which the local executor
uses too); ``tests/executors/kubernetes/test_kube_status.py`` is this module's table.

The table, first match wins
===========================

====================================================  ==========  ===================
What Kubernetes says                                  state       failure class
====================================================  ==========  ===================
no Job/RayJob, and TauGrid created one                failed      infrastructure
  (or it has a ``deletionTimestamp``)                             (deleted behind
                                                                  TauGrid's back)
no Job/RayJob yet                                     (nothing)
Job ``Complete``; RayJob ``Complete`` + ``SUCCEEDED``  succeeded
Job ``Failed`` ``DeadlineExceeded``; RayJob           failed      deadline_exceeded
  ``DeadlineExceeded``; Workload evicted
  ``DeactivatedDueToMaximumExecutionTimeExceeded``
Job ``Failed`` / RayJob ``Failed``/``FAILED``/         failed      from the pods (below),
  ``STOPPED``                                                     else user_error
                                                                  (RayJob app) or unknown
  (KubeRay's grace period ran out: the Ray                        unknown (whether it
  dashboard never said how the job ended)                         succeeded is not known)
Workload ``Evicted`` ``Preempted`` (not re-admitted)  preempted   preempted
Workload ``Evicted`` ``NodeFailures``                 failed      node_failure
Workload ``Evicted`` for another reason               evicted     evicted
  (``PodsReadyTimeout``, ``Deactivated``/
  ``InactiveWorkload``, a stopped queue, …)
a pod that cannot start: image pull errors            failed      user_error ("the image
  (``InvalidImageName`` at once; ``ErrImagePull``,                cannot be pulled")
  ``ImagePullBackOff`` after ``IMAGE_PULL_PATIENCE``)
  ``CreateContainerConfigError`` (after the same),                user_error
  ``CrashLoopBackOff`` (``OOMKilled`` before it:                  user_error with the code
  oom_killed; a machine XID on its node:                          (oom_killed;
  node_failure)                                                   node_failure)
Workload ``QuotaReserved`` + ``Admitted``, a pod      running
  running (or ended)
Workload admitted, no pod running yet                 admitted    (a pod unschedulable for
                                                                  ``SCHEDULING_PATIENCE``:
                                                                  the scheduler's reason)
Workload ``QuotaReserved=False``, or none yet         queued      (Kueue's message, in
                                                                  plain words)
====================================================  ==========  ===================

Failed pods are read in this order: a container ``OOMKilled`` → oom_killed (exit 137); an
image that cannot be pulled → user_error; an init container that failed (it fetches the code
bundle, or stages the datasets: its last words, the file that failed, are in the reason) →
infrastructure; a ``DisruptionTarget`` condition (the taint manager or pod GC after
a node died → node_failure; eviction, kubelet termination → evicted; the scheduler's
preemption → preempted) or a ``NodeNotReady`` warning about the pod → node_failure; a pod
that ran on a node reporting a machine XID in the pod's window (below) → node_failure, with
the XID and its meaning; a container that exited non-zero → user_error with its code (and,
when its node reported only user-caused XIDs, their meaning; such an XID with no exit code
at all is user_error too). OOMKilled and the image come first because the kubelet saw them
happen to the pod itself, whereas an XID is read from its node's condition in a time window:
whatever names the pod's own end more precisely (the bundle fetcher, a disruption, a node
that stopped answering) goes before it, and only a plain non-zero exit is read with it. A
crash loop is read with the XIDs the same way.

XID errors
==========

The GPU driver logs an XID when a GPU hits an error, and node-problem-detector turns it into
a Node condition: ``XIDErrors`` (any condition type containing "xid", in any case, is read
the same), its message naming the codes (``executors.kubernetes.gpu_faults.xids_in``). A pod's node
reported one *in the pod's window* when the condition is ``True`` and became so no later than the
pod's failure plus :data:`XID_WINDOW_SLACK` (a node flagged since before the pod started
counts: the pod ran on that GPU), or when its ``lastTransitionTime`` falls between the pod's
start minus the slack and its failure plus the slack (it cleared while the pod ran). A
condition that cleared before the pod started, one that came up only after it failed, one on
a node where the attempt had no pod, or one that names no code changes nothing. The worst of
the codes decides (``executors.kubernetes.gpu_faults.worst``): a machine XID (79 "GPU has fallen off
the bus", 48 "double-bit ECC error", …) makes the failure a node_failure, retried by default; the
user-caused ones (13, 31, 43: a faulting or hung kernel) leave it the program's, with the
meaning added, so a bug in a training script is not retried on another node as if the
machine were to blame. The pod's times (kubelet) and the condition's (node-problem-detector)
come from the same node's clock, so the slack is for lag, not skew: see
:data:`XID_WINDOW_SLACK`.

The condition can also come *after* the program died of the fault (a DCGM health-check plugin
runs every 30 s), so a GPU pod's non-zero exit that no XID explains yet is not read as the
program's failure at once: the observation carries ``settles_at`` (the pod's end plus
:data:`XID_SETTLE`, ``TAU_XID_SETTLE_SECONDS``) and the watcher applies it only then, or
sooner with the node_failure reading if a Node condition arrives meanwhile. Failures of
pods without GPUs, out-of-memory kills and image problems are read at once.

Kueue's waiting message
=======================

While a Workload waits, Kueue v0.17 writes why in ``QuotaReserved=False``'s message, built by
its flavor assigner (``pkg/scheduler/flavorassigner``): ``couldn't assign flavors to pod set
<name>: <reasons>``, pod sets joined by ``"; "`` and each pod set's reasons sorted and joined
by ``", "`` — which also occurs *inside* a reason (``in flavor h100, 4 more needed``), so the
reasons are found by pattern, not split. :func:`waiting_reason` turns the ones people hit
into sentences: "insufficient unused quota … N more needed" becomes "Waiting for 4 GPUs
(nvidia.com/gpu) on flavor h100: the workspace uses 8 of its 8, and its cohort has none to
lend" (the use and the quota from the ClusterQueue, the amount lent by the cohort from what
Kueue found available); "insufficient quota … > maximum capacity" says the run asks for more
than the workspace can ever get; untolerated taints, node affinity, missing or stopped queues
get a sentence each; anything else is passed on after "Waiting for Kueue: ".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from executors.kubernetes.gpu_faults import Xid, worst, xids_in
from runs.models import FailureClass, RunState
from runs.observations import Observation, ObservedState
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import QuantityError, format_quantity, parse_quantity

Body = Mapping[str, Any]

#: An ``ErrImagePull`` or ``ImagePullBackOff`` (or ``CreateContainerConfigError``) this long
#: after the pod started is final: the kubelet has tried several times (it backs off 10 s,
#: 20 s, 40 s), and a registry that blinked has had its chance.
IMAGE_PULL_PATIENCE: Final = timedelta(seconds=60)
#: A pod the scheduler has not placed for this long: its reason becomes the run's.
SCHEDULING_PATIENCE: Final = timedelta(seconds=30)

IMAGE_PULL_FAILURES: Final = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
#: Waiting reasons that are final at once, whatever the patience.
FINAL_AT_ONCE: Final = frozenset({"InvalidImageName"})
IMAGE_HINT: Final = (
    "The image cannot be pulled: check its name and tag (runtime.image in tau.yaml, or the "
    "workspace's default), and that the cluster may pull from its registry."
)

#: A pod's ``DisruptionTarget`` condition reason → what ended it.
DISRUPTIONS: Final[Mapping[str, tuple[FailureClass, str]]] = {
    "DeletionByTaintManager": (
        FailureClass.NODE_FAILURE,
        "its node became unavailable and Kubernetes removed the pod",
    ),
    "DeletionByPodGC": (FailureClass.NODE_FAILURE, "its node disappeared"),
    "TerminationByKubelet": (
        FailureClass.EVICTED,
        "the node's kubelet stopped it (node pressure or shutdown)",
    ),
    "EvictionByEvictionAPI": (FailureClass.EVICTED, "it was evicted (a node drain)"),
    "PreemptionByScheduler": (
        FailureClass.PREEMPTED,
        "the scheduler preempted it for a higher-priority pod",
    ),
}
#: RayJob ``status.reason`` values that say something other than the program failed, with
#: their class and words. KubeRay's grace period running out means its submitter finished
#: but the Ray dashboard never told the operator a final status (the operator cannot reach
#: it, or the head is gone): the program may well have succeeded, so the outcome is
#: ``unknown`` — not ``infrastructure`` ("environment, image or dependencies", retried by
#: default), which would run a job that perhaps finished again, up to three times.
RAYJOB_PLATFORM_FAILURES: Final[Mapping[str, tuple[FailureClass, str]]] = {
    "JobDeploymentStatusTransitionGracePeriodExceeded": (
        FailureClass.UNKNOWN,
        "KubeRay could not learn how the Ray job ended: its submitter finished, but the Ray "
        "dashboard{at} never reported a final status, so whether the program succeeded is "
        "unknown (not retried: it may have finished; the platform team can check that the "
        "KubeRay operator reaches the Ray head's dashboard)",
    ),
    "ValidationFailed": (FailureClass.INFRASTRUCTURE, "KubeRay refused the RayJob"),
}
#: Warning Events about a pod that say its node failed under it.
NODE_FAILURE_EVENTS: Final = frozenset({"NodeNotReady", "NodeShutdown"})
#: How far an XID condition's change may lie outside a pod's life and still be about it
#: (module docstring, "XID errors"). Both sides are lag: node-problem-detector's kernel-log
#: monitor reports within a second or two of the driver's line (it syncs conditions every
#: second), but a custom-plugin monitor (a DCGM health check) runs every 30 s by default, so
#: its condition can come up to half a minute after the XID, and the program itself may fail
#: just before or just after (at its next GPU call, or once NCCL times out). A minute covers
#: the slowest common reporter twice over, and is still short beside a training run, so a
#: condition that came and went minutes before the pod started is not blamed for its end.
XID_WINDOW_SLACK: Final = timedelta(seconds=60)
#: How long a GPU pod's non-zero exit is held before it is read as the program's failure,
#: when no XID explains it yet (module docstring, "XID errors"): node-problem-detector's
#: condition may come after the program has already died of the fault (a DCGM health-check
#: plugin runs every 30 s by default). A condition that arrives meanwhile makes it the node's.
XID_SETTLE: Final = timedelta(seconds=30)

#: Kueue ``Evicted`` reasons → (state, failure class, what happened).
EVICTIONS: Final[Mapping[str, tuple[RunState, FailureClass, str]]] = {
    "Preempted": (
        RunState.PREEMPTED,
        FailureClass.PREEMPTED,
        "Kueue preempted it to make room for higher-priority work",
    ),
    "NodeFailures": (
        RunState.FAILED,
        FailureClass.NODE_FAILURE,
        "Kueue evicted it because a node it ran on failed",
    ),
    "DeactivatedDueToMaximumExecutionTimeExceeded": (
        RunState.FAILED,
        FailureClass.DEADLINE_EXCEEDED,
        "Kueue stopped it after its maximum execution time",
    ),
    "PodsReadyTimeout": (
        RunState.EVICTED,
        FailureClass.EVICTED,
        "Kueue evicted it because its pods were not ready in time",
    ),
    "ClusterQueueStopped": (
        RunState.EVICTED,
        FailureClass.EVICTED,
        "Kueue evicted it because the workspace's ClusterQueue was stopped",
    ),
    "LocalQueueStopped": (
        RunState.EVICTED,
        FailureClass.EVICTED,
        "Kueue evicted it because the workspace's queue was stopped",
    ),
    "AdmissionCheck": (
        RunState.EVICTED,
        FailureClass.EVICTED,
        "Kueue evicted it because an admission check failed",
    ),
}
_DEACTIVATED = (
    RunState.EVICTED,
    FailureClass.EVICTED,
    "Kueue deactivated its Workload (someone set it inactive)",
)


@dataclass(frozen=True)
class AttemptObjects:
    """Everything the cluster holds about one attempt (its objects as the API returns them).

    ``created``: TauGrid created the attempt's Job or RayJob (its submit was delivered, or
    the watcher saw it), so its absence means it was deleted, not "not yet"."""

    workload_object: Body | None = None  # the Job or RayJob
    kueue_workload: Body | None = None
    pods: Sequence[Body] = ()
    events: Sequence[Body] = ()  # warning Events about the pods, the job or the Workload
    cluster_queue: Body | None = None  # the ClusterQueue it is admitted to or waits in
    created: bool = False
    #: The Nodes its pods are bound to, as much of them as :func:`node_facts` keeps (whole
    #: Node objects read the same).
    nodes: Sequence[Body] = ()


# --- small readers ---------------------------------------------------------------------------


def _meta(obj: Body | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _status(obj: Body | None) -> Mapping[str, Any]:
    return (obj or {}).get("status") or {}


def conditions(obj: Body | None) -> dict[str, Mapping[str, Any]]:
    """The object's ``status.conditions`` by type."""
    return {
        str(c.get("type")): c
        for c in _status(obj).get("conditions") or []
        if isinstance(c, Mapping) and c.get("type")
    }


def _true(obj: Body | None, condition: str) -> Mapping[str, Any] | None:
    found = conditions(obj).get(condition)
    return found if found is not None and found.get("status") == "True" else None


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _kind(obj: Body | None) -> str:
    return str((obj or {}).get("kind") or "")


def _is_rayjob(obj: Body | None) -> bool:
    return _kind(obj) == "RayJob"


def _what(obj: Body | None) -> str:
    return "RayJob" if _is_rayjob(obj) else "Job"


def _first_sentence(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- the function ----------------------------------------------------------------------------


def observe(
    objects: AttemptObjects,
    *,
    now: datetime,
    image_pull_patience: timedelta = IMAGE_PULL_PATIENCE,
    scheduling_patience: timedelta = SCHEDULING_PATIENCE,
    xid_settle: timedelta = XID_SETTLE,
) -> Observation:
    """What the attempt's objects mean for the run (see the module docstring's table)."""
    job = objects.workload_object
    workload = objects.kueue_workload
    placement = _placement(workload, objects.pods)
    if job is None or _meta(job).get("deletionTimestamp"):
        if job is None and not objects.created:
            return Observation(state=ObservedState.NOTHING)
        what = _what(job) if job is not None else "Job or RayJob"
        how = "is being deleted" if job is not None else "is gone"
        return Observation(
            state=ObservedState.FAILED,
            failure_class=FailureClass.INFRASTRUCTURE,
            reason=(
                f"Its {what} {how}, deleted outside TauGrid (by a person, another tool, or "
                "its ttlSecondsAfterFinished while TauGrid's watcher was not running) before "
                "TauGrid saw it finish."
            ),
            deleted=True,
            **placement,
        )

    finished = _finished(job, objects, now=now, placement=placement)
    if finished is not None:
        finished = replace(finished, ended_at=_ended_at(job, workload))
        return _held_for_a_late_xid(finished, objects.pods, now=now, settle=xid_settle)

    admitted = bool(workload is not None and _true(workload, "Admitted"))
    evicted = _true(workload, "Evicted")
    if evicted is not None and not admitted:
        return _evicted(evicted, placement)

    stuck = _pod_that_cannot_start(
        objects.pods, objects.nodes, now=now, patience=image_pull_patience
    )
    if stuck is not None:
        failure_class, reason, exit_code = stuck
        return Observation(
            state=ObservedState.FAILED,
            failure_class=failure_class,
            reason=reason,
            exit_code=exit_code,
            object_active=True,
            **placement,
        )

    if admitted or (workload is None and _unsuspended(job)):
        if placement["ran"]:
            return Observation(state=ObservedState.RUNNING, reason="Running.", **placement)
        reason = _unschedulable(objects.pods, objects.events, now=now, patience=scheduling_patience)
        return Observation(state=ObservedState.ADMITTED, reason=reason, **placement)

    return Observation(
        state=ObservedState.QUEUED,
        reason=waiting_reason(workload, objects.cluster_queue),
        **placement,
    )


def _placement(workload: Body | None, pods: Sequence[Body]) -> dict[str, Any]:
    """Where Kueue and the scheduler put it: ClusterQueue, a flavor per resource, nodes."""
    admission = _status(workload).get("admission") or {}
    flavors: dict[str, str] = {}
    for assignment in admission.get("podSetAssignments") or []:
        for resource, flavor in (assignment.get("flavors") or {}).items():
            flavors.setdefault(str(resource), str(flavor))
    nodes = sorted(
        {str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")}
    )
    ran = any(_pod_ran(pod) for pod in pods)
    admitted = _true(workload, "Admitted") or _true(workload, "QuotaReserved")
    return {
        "cluster_queue": str(admission.get("clusterQueue") or ""),
        "flavors": flavors,
        "node_names": tuple(nodes),
        "ran": ran,
        "admitted": bool(admission) or _true(workload, "Admitted") is not None,
        "admitted_at": parse_time((admitted or {}).get("lastTransitionTime")),
    }


def _ended_at(job: Body, workload: Body | None) -> datetime | None:
    """When the job ended by itself, as Kubernetes stamped it: the Job's Complete or Failed
    condition (a RayJob's ``endTime``), else Kueue's Finished on its Workload (which Kueue
    sets a moment after the Job's)."""
    for condition in ("Complete", "Failed"):
        found = _true(job, condition)
        if found is not None and found.get("lastTransitionTime"):
            return parse_time(found.get("lastTransitionTime"))
    end = parse_time(_status(job).get("endTime"))
    if end is not None:
        return end
    finished = _true(workload, "Finished")
    return parse_time((finished or {}).get("lastTransitionTime"))


def _pod_ran(pod: Body) -> bool:
    status = _status(pod)
    if status.get("phase") in {"Running", "Succeeded"}:
        return True
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        last = container.get("lastState") or {}
        if "running" in state or "terminated" in state or "terminated" in last:
            return True
    return False


def _unsuspended(job: Body) -> bool:
    """A job Kueue does not hold (no queue label, or admitted before its Workload was seen)."""
    spec = job.get("spec") or {}
    return spec.get("suspend") is False and not _is_rayjob(job)


# --- an end the job reached by itself --------------------------------------------------------


def _finished(
    job: Body, objects: AttemptObjects, *, now: datetime, placement: dict[str, Any]
) -> Observation | None:
    if _is_rayjob(job):
        return _rayjob_finished(job, objects, now=now, placement=placement)
    if _true(job, "Complete") is not None:
        return Observation(
            state=ObservedState.SUCCEEDED,
            reason="Finished successfully.",
            exit_code=0,
            **{**placement, "ran": True},
        )
    failed = _true(job, "Failed")
    if failed is None:
        finished = _true(objects.kueue_workload, "Finished")
        if finished is not None and finished.get("reason") == "Succeeded":
            return Observation(
                state=ObservedState.SUCCEEDED,
                reason="Finished successfully.",
                exit_code=0,
                **{**placement, "ran": True},
            )
        return None
    reason = str(failed.get("reason") or "")
    message = _first_sentence(str(failed.get("message") or ""))
    if reason == "DeadlineExceeded":
        return Observation(
            state=ObservedState.FAILED,
            failure_class=FailureClass.DEADLINE_EXCEEDED,
            reason=f"Stopped by Kubernetes: {_deadline_words(job, message)}.",
            exit_code=_any_exit_code(objects.pods),
            **placement,
        )
    from_pods = _pod_failure(objects.pods, objects.events, objects.nodes, now=now)
    if from_pods is not None:
        failure_class, words, exit_code = from_pods
        return Observation(
            state=ObservedState.FAILED,
            failure_class=failure_class,
            reason=words,
            exit_code=exit_code,
            **placement,
        )
    return Observation(
        state=ObservedState.FAILED,
        failure_class=FailureClass.UNKNOWN,
        reason=f"The Job failed ({reason or 'no reason given'}): {message}".rstrip(": "),
        **placement,
    )


def _deadline_words(job: Body, message: str) -> str:
    seconds = (job.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(seconds, int):
        return f"it ran longer than its {_duration(seconds)} (run.max_runtime)"
    return message.rstrip(".") or "it ran longer than its deadline"


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _rayjob_finished(
    job: Body, objects: AttemptObjects, *, now: datetime, placement: dict[str, Any]
) -> Observation | None:
    status = _status(job)
    deployment = str(status.get("jobDeploymentStatus") or "")
    job_status = str(status.get("jobStatus") or "")
    reason = str(status.get("reason") or "")
    message = _first_sentence(str(status.get("message") or ""))
    if deployment == "Complete" and job_status == "SUCCEEDED":
        return Observation(
            state=ObservedState.SUCCEEDED,
            reason="Finished successfully.",
            exit_code=0,
            **{**placement, "ran": True},
        )
    if deployment not in {"Complete", "Failed", "ValidationFailed"} and job_status not in {
        "FAILED",
        "STOPPED",
    }:
        return None
    if reason == "DeadlineExceeded":
        return Observation(
            state=ObservedState.FAILED,
            failure_class=FailureClass.DEADLINE_EXCEEDED,
            reason=f"Stopped by KubeRay: {_deadline_words(job, message)}.",
            exit_code=_any_exit_code(objects.pods),
            **placement,
        )
    from_pods = _pod_failure(objects.pods, objects.events, objects.nodes, now=now)
    said = f" KubeRay says: {message}" if message else ""

    def failed(
        failure_class: FailureClass, words: str, exit_code: int | None = None
    ) -> Observation:
        return Observation(
            state=ObservedState.FAILED,
            failure_class=failure_class,
            reason=words,
            exit_code=exit_code,
            **placement,
        )

    if from_pods is not None and from_pods[0] != FailureClass.USER_ERROR:
        return failed(*from_pods)  # out of memory, a node, a GPU, the bundle: whatever the job said
    if reason in RAYJOB_PLATFORM_FAILURES:
        failure_class, words = RAYJOB_PLATFORM_FAILURES[reason]
        dashboard = str(status.get("dashboardURL") or "")
        words = words.format(at=f" ({dashboard})" if dashboard else "")
        return failed(failure_class, f"{words}.{said}")
    if deployment == "ValidationFailed":
        return failed(FailureClass.INFRASTRUCTURE, f"KubeRay refused the RayJob.{said}")
    if from_pods is not None:
        return failed(*from_pods)  # the submitter (ray job submit) or a Ray pod exited non-zero
    if job_status == "FAILED" or reason == "AppFailed":
        return failed(FailureClass.USER_ERROR, f"The Ray job failed.{said}")
    if job_status == "STOPPED":
        return failed(
            FailureClass.INFRASTRUCTURE, f"The Ray job was stopped from outside TauGrid.{said}"
        )
    return failed(
        FailureClass.INFRASTRUCTURE,
        f"The RayJob failed before its Ray job could report a result "
        f"({deployment}{', ' + reason if reason else ''}).{said}",
    )


def _evicted(condition: Mapping[str, Any], placement: dict[str, Any]) -> Observation:
    reason = str(condition.get("reason") or "")
    if reason in EVICTIONS:
        state, failure_class, words = EVICTIONS[reason]
    elif reason.startswith("Deactivated") or reason == "InactiveWorkload":
        state, failure_class, words = _DEACTIVATED
    else:
        state, failure_class, words = (
            RunState.EVICTED,
            FailureClass.EVICTED,
            f"Kueue evicted it ({reason or 'no reason given'})",
        )
    message = str(condition.get("message") or "")
    if message.startswith("Preempted to accommodate"):
        # Kueue's message names uids and queue paths; the cause is what a person can use.
        cause = _PREEMPTION_CAUSE.search(message)
        said = f" ({cause['cause'].strip()})" if cause else ""
    else:
        said = f": {_first_sentence(message, 200).rstrip('.')}" if message else ""
    return Observation(
        state=str(state.value),
        failure_class=failure_class,
        reason=f"{words}{said}.",
        object_active=True,
        **{**placement, "admitted": True},
    )


_PREEMPTION_CAUSE = re.compile(r"due to (?P<cause>[^;]+)")


# --- pods --------------------------------------------------------------------------------------


#: What each of TauGrid's init containers does, for the reason an attempt failed.
_INIT_ROLES: Final[Mapping[str, str]] = {
    "tau-fetch-bundle": "fetches and checks the code bundle",
    "tau-stage-data": "downloads and checks the run's datasets",
}
#: The most of an init container's last words kept in the reason.
_INIT_MESSAGE_CHARS: Final = 600


def _init_failure(pod: Body, container: Mapping[str, Any], code: int) -> str:
    """Why an attempt whose init container failed never started: which one, what it does,
    and its termination message (the file that failed to stage, say)."""
    name = str(container.get("name"))
    role = _INIT_ROLES.get(name)
    said = f" (which {role})" if role else ""
    terminated = (container.get("state") or {}).get("terminated") or {}
    message = str(terminated.get("message") or "").strip()
    lines = [line for line in message.splitlines() if line.strip()]
    last = lines[-1][-_INIT_MESSAGE_CHARS:] if lines else ""
    words = f": {last}" if last else ""
    return (
        f"Its init container {name}{said} exited with code {code} in pod {_pod_name(pod)}"
        f"{words}. The program never started."
    )


def _containers(pod: Body, *, init: bool) -> list[Mapping[str, Any]]:
    key = "initContainerStatuses" if init else "containerStatuses"
    return [c for c in _status(pod).get(key) or [] if isinstance(c, Mapping)]


def _pod_name(pod: Body) -> str:
    return str(_meta(pod).get("name") or "?")


def _sorted_pods(pods: Iterable[Body]) -> list[Body]:
    return sorted(pods, key=_pod_name)


def _memory_limit(pod: Body, container: str) -> str:
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
            return f" (its limit is {limit})" if limit else ""
    return ""


def _any_exit_code(pods: Iterable[Body]) -> int | None:
    for pod in _sorted_pods(pods):
        for container in _containers(pod, init=False):
            terminated = (container.get("state") or {}).get("terminated") or {}
            if isinstance(terminated.get("exitCode"), int) and terminated["exitCode"] != 0:
                return int(terminated["exitCode"])
    return None


def _pod_failure(
    pods: Sequence[Body], events: Sequence[Body], nodes: Sequence[Body], *, now: datetime
) -> tuple[FailureClass, str, int | None] | None:
    """Why the pods of a failed job failed, from what the kubelet recorded and what their
    nodes reported (module docstring, "Failed pods are read in this order")."""
    ordered = _sorted_pods(pods)
    for pod in ordered:
        for container in [*_containers(pod, init=True), *_containers(pod, init=False)]:
            for state in (container.get("state") or {}, container.get("lastState") or {}):
                terminated = state.get("terminated") or {}
                if terminated.get("reason") == "OOMKilled":
                    name = str(container.get("name") or "?")
                    return (
                        FailureClass.OOM_KILLED,
                        f"Container {name} of pod {_pod_name(pod)} ran out of memory and was "
                        f"killed (OOMKilled){_memory_limit(pod, name)}.",
                        int(terminated.get("exitCode") or 137),
                    )
    for pod in ordered:
        pulling = _image_pull_failure(pod)
        if pulling is not None:
            return FailureClass.USER_ERROR, pulling, None
    for pod in ordered:
        for container in _containers(pod, init=True):
            terminated = (container.get("state") or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            if isinstance(code, int) and code != 0:
                return FailureClass.INFRASTRUCTURE, _init_failure(pod, container, code), None
    for pod in ordered:
        disruption = _true(pod, "DisruptionTarget")
        if disruption is not None and disruption.get("reason") in DISRUPTIONS:
            failure_class, words = DISRUPTIONS[str(disruption.get("reason"))]
            return failure_class, f"Pod {_pod_name(pod)} was stopped: {words}.", None
    failed_nodes = _node_failure_events(ordered, events)
    if failed_nodes:
        return (
            FailureClass.NODE_FAILURE,
            f"The node under pod {failed_nodes[0]} failed ({failed_nodes[1]}).",
            None,
        )
    xid = xid_report(ordered, nodes, now=now)
    exited: tuple[str | None, int | None] = (None, None)
    exited_pod: str | None = None
    for pod in ordered:
        for container in _containers(pod, init=False):
            terminated = (container.get("state") or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            if isinstance(code, int) and code != 0:
                said = _first_sentence(str(terminated.get("message") or ""), 300)
                words = (
                    f"Container {container.get('name')} of pod {_pod_name(pod)} exited with "
                    f"code {code}{': ' + said if said else '.'}"
                )
                exited, exited_pod = (words, code), _pod_name(pod)
                break
        if exited[0] is not None:
            break
    if xid is not None:
        return xid.reading(*exited, exited_pod=exited_pod)
    if exited[0] is not None:
        return FailureClass.USER_ERROR, exited[0], exited[1]
    return None


def _held_for_a_late_xid(
    observation: Observation, pods: Sequence[Body], *, now: datetime, settle: timedelta
) -> Observation:
    """``observation`` with :attr:`Observation.settles_at` set while a GPU program's non-zero
    exit, read as its own failure, is younger than ``settle``: its node's XID condition may
    still be on its way (module docstring, "XID errors")."""
    if (
        observation.failure_class != FailureClass.USER_ERROR
        or observation.exit_code is None
        or not settle
    ):
        return observation
    ended = [
        _pod_window(pod, now=now)[1]
        for pod in pods
        if (pod.get("spec") or {}).get("nodeName") and _requests_gpus(pod)
    ]
    if not ended or max(ended) + settle <= now:
        return observation
    return replace(observation, settles_at=max(ended) + settle)


def _requests_gpus(pod: Body) -> bool:
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for amounts in (resources.get("limits") or {}, resources.get("requests") or {}):
            if any(
                _is_gpu(str(name)) and str(value) not in {"", "0"}
                for name, value in amounts.items()
            ):
                return True
    return False


def _node_failure_events(pods: Sequence[Body], events: Sequence[Body]) -> tuple[str, str] | None:
    names = {_pod_name(pod) for pod in pods}
    for event in events:
        involved = event.get("involvedObject") or {}
        if (
            involved.get("kind") == "Pod"
            and involved.get("name") in names
            and event.get("reason") in NODE_FAILURE_EVENTS
        ):
            return str(involved.get("name")), str(event.get("message") or event.get("reason"))
    return None


# --- XID errors on the pods' nodes --------------------------------------------------------------


def is_xid_condition(condition_type: str) -> bool:
    """node-problem-detector's ``XIDErrors``, or any condition type that names XIDs."""
    return "xid" in condition_type.lower()


def node_facts(node: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`observe` reads of a Node: its name and its XID conditions, without their
    heartbeats (which move while nothing changes). The watcher keeps only this of each Node,
    so a thousand nodes cost a few kilobytes, and compares it to skip the Node updates that
    change nothing an observation reads."""
    meta = _meta(node)
    kept = [
        {key: value for key, value in condition.items() if key != "lastHeartbeatTime"}
        for condition in _status(node).get("conditions") or []
        if isinstance(condition, Mapping) and is_xid_condition(str(condition.get("type") or ""))
    ]
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "status": {"conditions": kept},
    }


@dataclass(frozen=True)
class XidReport:
    """An XID error that the node under one of the attempt's pods reported in that pod's
    window (module docstring, "XID errors"): the worst of the condition's codes."""

    pod: str
    node: str
    condition: str  # the condition's type, e.g. XIDErrors
    standing: bool  # the condition is True now (else it cleared during the pod's life)
    changed_at: datetime | None  # its lastTransitionTime
    failed_at: datetime  # when the pod failed (its window's end, less the slack)
    xid: Xid
    also: tuple[int, ...] = ()  # the condition's other codes

    @property
    def machine(self) -> bool:
        return not self.xid.user_caused

    def _condition_words(self) -> str:
        also = "".join(f"; also XID {code}" for code in self.also)
        if self.changed_at is None:
            return f"condition {self.condition}{also}"
        changed_at = self.changed_at.astimezone(UTC)
        same_day = changed_at.date() == self.failed_at.astimezone(UTC).date()
        at = changed_at.strftime("%H:%M:%S UTC" if same_day else "%Y-%m-%d %H:%M:%S UTC")
        if not self.standing:
            return f"condition {self.condition}, cleared at {at}{also}"
        return f"condition {self.condition} since {at}{also}"

    def reading(
        self, exited: str | None, exit_code: int | None, *, exited_pod: str | None = None
    ) -> tuple[FailureClass, str, int | None]:
        """The failure, read with this XID: a machine XID makes it the node's, a user-caused
        one leaves it the program's (``exited``: what the containers of ``exited_pod`` said,
        if anything)."""
        reported = f"The GPU node {self.node} under pod {self.pod} reported {self.xid.sentence()}"
        if self.machine:
            words = (
                f"{reported} ({self._condition_words()}): a fault of the machine, not of the "
                "program."
            )
            return FailureClass.NODE_FAILURE, f"{words} {exited}" if exited else words, exit_code
        if exited and exited_pod == self.pod:
            reported = f"Its GPU on node {self.node} reported {self.xid.sentence()}"
        words = (
            f"{reported} — usually a bug in the program, not the machine "
            f"({self._condition_words()})."
        )
        return FailureClass.USER_ERROR, f"{exited} {words}" if exited else words, exit_code


def xid_report(pods: Sequence[Body], nodes: Sequence[Body], *, now: datetime) -> XidReport | None:
    """The XID to read a failure with, if a node under ``pods`` reported one in the pod's
    window: the first machine XID found (pods by name), else the first user-caused one."""
    by_name = {str(_meta(node).get("name")): node for node in nodes}
    found: list[XidReport] = []
    for pod in pods:
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        node = by_name.get(node_name)
        if not node_name or node is None:
            continue
        started, failed = _pod_window(pod, now=now)
        for condition in _status(node).get("conditions") or []:
            if not isinstance(condition, Mapping):
                continue
            if not is_xid_condition(str(condition.get("type") or "")):
                continue
            standing = condition.get("status") == "True"
            changed_at = parse_time(condition.get("lastTransitionTime"))
            if not _in_window(standing, changed_at, started, failed):
                continue
            codes = xids_in(str(condition.get("message") or ""))
            chosen = worst(codes)
            if chosen is None:
                continue  # names no code: nothing to weigh (the fleet page shows it)
            found.append(
                XidReport(
                    pod=_pod_name(pod),
                    node=node_name,
                    condition=str(condition.get("type")),
                    standing=standing,
                    changed_at=changed_at,
                    failed_at=failed,
                    xid=chosen,
                    also=tuple(code for code in codes if code != chosen.code),
                )
            )
    for report in found:
        if report.machine:
            return report
    return found[0] if found else None


def _pod_window(pod: Body, *, now: datetime) -> tuple[datetime | None, datetime]:
    """When the pod started (the kubelet's ``startTime``, else its first container's start,
    else its creation) and when it failed (its containers' last ``finishedAt``, else now)."""
    starts: list[datetime] = []
    ends: list[datetime] = []
    for container in [*_containers(pod, init=True), *_containers(pod, init=False)]:
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            for phase in ("running", "terminated"):
                begun = parse_time((state.get(phase) or {}).get("startedAt"))
                if begun is not None:
                    starts.append(begun)
            ended = parse_time((state.get("terminated") or {}).get("finishedAt"))
            if ended is not None:
                ends.append(ended)
    started = (
        parse_time(_status(pod).get("startTime"))
        or (min(starts) if starts else None)
        or parse_time(_meta(pod).get("creationTimestamp"))
    )
    return started, max(ends) if ends else now


def _in_window(
    standing: bool, changed_at: datetime | None, started: datetime | None, failed: datetime
) -> bool:
    latest = failed + XID_WINDOW_SLACK
    if standing:
        return changed_at is None or changed_at <= latest  # it stood when the pod failed
    if changed_at is None or started is None:
        return False  # cleared, nobody knows when: not evidence about this pod
    return started - XID_WINDOW_SLACK <= changed_at <= latest


def _image_pull_failure(pod: Body) -> str | None:
    for container in [*_containers(pod, init=True), *_containers(pod, init=False)]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in IMAGE_PULL_FAILURES:
            image = container.get("image") or "?"
            said = _first_sentence(str(waiting.get("message") or ""), 300)
            return (
                f"Container {container.get('name')} of pod {_pod_name(pod)} cannot start: "
                f"image {image}: {reason}{' (' + said + ')' if said else ''}. {IMAGE_HINT}"
            )
    return None


def _pod_that_cannot_start(
    pods: Sequence[Body], nodes: Sequence[Body], *, now: datetime, patience: timedelta
) -> tuple[FailureClass, str, int | None] | None:
    """A pod of a job that is still active but whose containers will not start: an image
    that cannot be pulled, a container configuration error, a crash loop (read with what
    its nodes reported, as a failed pod is)."""
    for pod in _sorted_pods(pods):
        started = parse_time(_status(pod).get("startTime")) or parse_time(
            _meta(pod).get("creationTimestamp")
        )
        waited_long = started is not None and now - started >= patience
        for container in [*_containers(pod, init=True), *_containers(pod, init=False)]:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = str(waiting.get("reason") or "")
            name = str(container.get("name") or "?")
            if reason in IMAGE_PULL_FAILURES and (reason in FINAL_AT_ONCE or waited_long):
                return FailureClass.USER_ERROR, str(_image_pull_failure(pod)), None
            if reason == "CreateContainerConfigError" and waited_long:
                said = _first_sentence(str(waiting.get("message") or ""), 300)
                return (
                    FailureClass.USER_ERROR,
                    f"Container {name} of pod {_pod_name(pod)} cannot be started: {said}. "
                    "Check the secrets and environment its tau.yaml names.",
                    None,
                )
            if reason == "CrashLoopBackOff":
                last = (container.get("lastState") or {}).get("terminated") or {}
                code = last.get("exitCode") if isinstance(last.get("exitCode"), int) else None
                if last.get("reason") == "OOMKilled":
                    return (
                        FailureClass.OOM_KILLED,
                        f"Container {name} of pod {_pod_name(pod)} keeps running out of memory "
                        f"(OOMKilled){_memory_limit(pod, name)}.",
                        code or 137,
                    )
                ended = f"exit code {code}" if code is not None else "no exit code"
                words = (
                    f"Container {name} of pod {_pod_name(pod)} keeps crashing ({ended}; "
                    f"restarted {container.get('restartCount', 0)} times)."
                )
                xid = xid_report(_sorted_pods(pods), nodes, now=now)
                if xid is not None:
                    return xid.reading(words, code, exited_pod=_pod_name(pod))
                return FailureClass.USER_ERROR, words, code
    return None


def _unschedulable(
    pods: Sequence[Body], events: Sequence[Body], *, now: datetime, patience: timedelta
) -> str:
    """The scheduler's reason for a pod it has not placed for ``patience``, else ""."""
    for pod in _sorted_pods(pods):
        condition = conditions(pod).get("PodScheduled")
        if condition is None or condition.get("status") != "False":
            continue
        since = parse_time(condition.get("lastTransitionTime"))
        if since is None or now - since < patience:
            continue
        message = str(condition.get("message") or "")
        for event in events:
            involved = event.get("involvedObject") or {}
            if event.get("reason") == "FailedScheduling" and involved.get("name") == _pod_name(pod):
                message = str(event.get("message") or message)
        words = _scheduler_words(message)
        waited = _duration_words(now - since)
        return (
            f"Admitted by Kueue, but no node has taken pod {_pod_name(pod)} for {waited}"
            f"{': ' + words if words else ''}."
        )
    return ""


def _scheduler_words(message: str) -> str:
    """``0/4 nodes are available: 4 node(s) didn't match …`` without the scheduler's notes
    on claims and preemption."""
    first = " ".join(message.split()).split(". ")[0]
    return first.rstrip(".")


def _duration_words(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


# --- Kueue's waiting message --------------------------------------------------------------------

_UNUSED = re.compile(
    r"insufficient unused quota for (?P<resource>\S+) in flavor (?P<flavor>[^\s,]+), "
    r"(?P<more>\S+) more needed"
)
_MAXIMUM = re.compile(
    r"insufficient quota for (?P<resource>\S+) in flavor (?P<flavor>[^\s,]+), previously "
    r"considered podsets requests \((?P<before>[^)]*)\) \+ current podset request "
    r"\((?P<request>[^)]*)\) > maximum capacity \((?P<maximum>[^)]*)\)"
)
_TAINT = re.compile(r"untolerated taint (?P<taint>.+?) in flavor (?P<flavor>[^\s,;]+)")
_AFFINITY = re.compile(r"flavor (?P<flavor>[^\s,;]+) doesn't match node affinity")
_NOT_FOUND = re.compile(r"flavor (?P<flavor>[^\s,;]+) not found")
_POD_SET = re.compile(r"couldn't assign flavors to pod set (?P<pod_set>[^:]+): ")
_QUEUE_STATE = re.compile(
    r"^(?P<kind>LocalQueue|ClusterQueue) (?P<name>\S+) (?P<what>doesn't exist|is inactive|"
    r"is stopped|not found)"
)
_QUEUE_WORDS = {
    "doesn't exist": "does not exist",
    "not found": "does not exist",
    "is inactive": "is not active (its flavors or cohort may be missing)",
    "is stopped": "is stopped",
}


def _is_gpu(resource: str) -> bool:
    return resource == GPU_RESOURCE or resource.endswith("/gpu")


def _quantity(text: object) -> Decimal | None:
    if text is None:
        return None
    try:
        return parse_quantity(str(text))
    except QuantityError:
        return None


def amount_words(resource: str, amount: Decimal) -> str:
    """4 GPUs (nvidia.com/gpu), 1 GPU (nvidia.com/gpu), 2 CPUs, 16Gi of memory."""
    if _is_gpu(resource):
        count = format_quantity(amount)
        return f"{count} GPU{'' if amount == 1 else 's'} ({resource})"
    if resource == "cpu":
        cores = (
            format(amount.normalize(), "f")
            if amount != amount.to_integral_value()
            else str(int(amount))
        )
        return f"{cores} CPU{'' if amount == 1 else 's'}"
    if resource == "memory" or resource.startswith("hugepages-") or resource.endswith("storage"):
        return f"{format_quantity(amount, binary=True)} of {resource}"
    return f"{format_quantity(amount)} {resource}"


def _number(resource: str, amount: Decimal) -> str:
    binary = resource == "memory" or resource.endswith("storage")
    return format_quantity(amount, binary=binary)


def _requested(workload: Body | None, pod_set: str | None, resource: str) -> Decimal | None:
    total = Decimal(0)
    found = False
    for request in _status(workload).get("resourceRequests") or []:
        if pod_set is not None and request.get("name") != pod_set:
            continue
        value = _quantity((request.get("resources") or {}).get(resource))
        if value is not None:
            total += value
            found = True
    return total if found else None


def _queue_amounts(
    cluster_queue: Body | None, flavor: str, resource: str
) -> tuple[Decimal | None, Decimal | None, bool]:
    """(in use, nominal quota, in a cohort) of ``flavor``/``resource`` in the ClusterQueue."""
    if cluster_queue is None:
        return None, None, False
    spec = cluster_queue.get("spec") or {}
    nominal: Decimal | None = None
    for group in spec.get("resourceGroups") or []:
        for entry in group.get("flavors") or []:
            if entry.get("name") != flavor:
                continue
            for quota in entry.get("resources") or []:
                if quota.get("name") == resource:
                    nominal = _quantity(quota.get("nominalQuota"))
    used: Decimal | None = None
    for entry in _status(cluster_queue).get("flavorsReservation") or []:
        if entry.get("name") != flavor:
            continue
        for usage in entry.get("resources") or []:
            if usage.get("name") == resource:
                used = _quantity(usage.get("total"))
    if used is None and nominal is not None:
        used = Decimal(0)
    return used, nominal, bool(spec.get("cohortName") or spec.get("cohort"))


def waiting_reason(workload: Body | None, cluster_queue: Body | None = None) -> str:
    """Why a queued attempt waits, in plain words, from Kueue's ``QuotaReserved=False``
    message (module docstring) and, for the numbers, the ClusterQueue; "" while Kueue has
    said nothing yet (the run keeps the reason the backend gave it)."""
    if workload is None:
        return ""  # Kueue has not made its Workload yet: nothing to add to the backend's words
    pending = conditions(workload).get("QuotaReserved")
    message = " ".join(str((pending or {}).get("message") or "").split())
    if pending is None or pending.get("status") != "False" or not message:
        return ""
    sentences: list[str] = []
    pod_sets = list(_POD_SET.finditer(message))
    for index, match in enumerate(pod_sets):
        end = pod_sets[index + 1].start() if index + 1 < len(pod_sets) else len(message)
        part = message[match.end() : end]
        sentences.extend(_pod_set_sentences(part, match["pod_set"], workload, cluster_queue))
    if not pod_sets:
        queue = _QUEUE_STATE.match(message)
        if queue is not None:
            which = "queue" if queue["kind"] == "LocalQueue" else "ClusterQueue"
            return (
                f"Waiting: the workspace's {which} {queue['name']} "
                f"{_QUEUE_WORDS[queue['what']]}; the platform team can fix that."
            )
        if "namespace doesn't match ClusterQueue selector" in message:
            return (
                "Waiting: the workspace's ClusterQueue does not admit runs from its namespace; "
                "the platform team can fix that."
            )
    unique = list(dict.fromkeys(sentences))
    if not unique:
        return f"Waiting for Kueue: {_first_sentence(message, 300)}"
    return " ".join(unique[:3])


def _pod_set_sentences(
    part: str, pod_set: str, workload: Body, cluster_queue: Body | None
) -> list[str]:
    sentences: list[str] = []
    for match in _UNUSED.finditer(part):
        sentences.append(_unused_quota(match, pod_set, workload, cluster_queue))
    for match in _MAXIMUM.finditer(part):
        resource, flavor = match["resource"], match["flavor"]
        request = _quantity(match["request"])
        maximum = _quantity(match["maximum"])
        if request is None or maximum is None:
            sentences.append(f"It asks for more {resource} on flavor {flavor} than it can get.")
            continue
        sentences.append(
            f"It asks for {amount_words(resource, request)} on flavor {flavor}, more than the "
            f"workspace can ever get there (at most {_number(resource, maximum)}, borrowing "
            "included): it will wait until the quota is raised."
        )
    for match in _TAINT.finditer(part):
        sentences.append(
            f"Flavor {match['flavor']}'s nodes carry a taint the run does not tolerate "
            f"({match['taint']})."
        )
    for match in _AFFINITY.finditer(part):
        sentences.append(f"Flavor {match['flavor']} does not match the run's node selector.")
    for match in _NOT_FOUND.finditer(part):
        sentences.append(f"Flavor {match['flavor']} does not exist in the cluster.")
    return sentences


def _unused_quota(
    match: re.Match[str], pod_set: str, workload: Body, cluster_queue: Body | None
) -> str:
    resource, flavor = match["resource"], match["flavor"]
    more = _quantity(match["more"])
    requested = _requested(workload, pod_set, resource)
    amount = requested if requested is not None else more
    wanted = amount_words(resource, amount) if amount is not None else resource
    head = f"Waiting for {wanted} on flavor {flavor}"
    used, nominal, in_cohort = _queue_amounts(cluster_queue, flavor, resource)
    if used is None or nominal is None:
        if more is None:
            return f"{head}: not enough is free."
        return f"{head}: {_number(resource, more)} more than is free now."
    words = (
        f"{head}: the workspace uses {_number(resource, used)} of its {_number(resource, nominal)}"
    )
    if not in_cohort:
        return f"{words}."
    lendable = Decimal(0)
    if requested is not None and more is not None:
        available = max(Decimal(0), requested - more)
        lendable = max(Decimal(0), available - max(Decimal(0), nominal - used))
    if lendable <= 0:
        return f"{words}, and its cohort has none to lend."
    return f"{words}, and its cohort can lend only {_number(resource, lendable)}."
