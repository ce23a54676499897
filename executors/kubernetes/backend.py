"""The Kubernetes backend: a run's attempt becomes a Kueue-admitted RayJob or batch Job in its
workspace's namespace, created through the one adapter (:mod:`kube`).

Submitting (``submit``, called by the delivery of a ``submit`` outbox row, outside any
database transaction) renders the attempt with :mod:`executors.kubernetes.render` and creates, in
the workspace's namespace:

1. the workload, ``<run name>-a<attempt>`` (:func:`executors.kubernetes.render.workload_name`),
   labelled ``app.kubernetes.io/managed-by=taugrid``, ``taugrid.io/workspace``, ``taugrid.io/run``,
   ``taugrid.io/run-id``, ``taugrid.io/attempt``, ``taugrid.io/spec-name``, the workspace's
   LocalQueue (``kueue.x-k8s.io/queue-name``) and, when the run has one, its
   WorkloadPriorityClass (``kueue.x-k8s.io/priority-class``); Kueue's webhook suspends it;
2. its dependents, owned by it (deleted with it by the garbage collector): the attempt's
   run-token Secret ``<workload>-run-token`` and, for a multi-worker Job, the headless
   rendezvous Service named like the workload.

Each step is idempotent, so delivering twice leaves one set of objects: a create that finds
the object already there (``Conflict``) reads it, and an object with this run's and this
attempt's labels counts as done; one without them is an error that names it (a name TauGrid
did not make is never taken over). The token is issued only when the Secret has to be made,
so a second delivery does not change it; it is never logged (the adapter logs no bodies).
Objects of the run's earlier attempts are deleted (with their pods and dependents) before a
new attempt's are made: a preempted Job that Kueue would otherwise re-admit never runs
beside its successor. The run becomes ``queued`` (waiting for Kueue) once its objects exist;
the watcher (``executors.kubernetes.watcher``) takes it from there through the run services.

Cancelling (``cancel``) deletes the run's workload objects with **foreground** propagation:
the workload stays, marked for deletion, until the garbage collector has deleted what it
owns (Kueue's Workload, the pods — for a RayJob through its RayCluster — the Secret, the
Service), and only then disappears. So "the workload is gone" means "nothing of the attempt
runs any more": the watcher moves a ``cancelling`` run to ``cancelled`` on that one signal,
while background deletion would remove the workload at once and leave pods running for a
while without an owner to watch. The state machine is the run core's (``runs.lifecycle.
cancel_run``): a run that was only waiting is ``cancelled`` at once and the delivery just
removes its objects; a run holding resources is ``cancelling`` until the watcher sees its
pods gone; a run that finished meanwhile keeps its outcome. A cancel that races with a
submission is safe both ways: the submission checks the run again after creating its objects
and deletes them if the run no longer wants them.

Logs are read through ``pods/log`` (:func:`kube.pod_logs.read_pod_log`), up to
``TAU_RUN_LOG_MAX_BYTES`` like local logs; a pod that never started says why (scheduling,
image or bundle-fetch trouble, from its status and its warning events). Checkpoints live on
the workspace's storage (``Workspace.storage_claim``, a ReadWriteMany
PersistentVolumeClaim mounted with the run's own sub-path); quota in use is what Kueue has
reserved (``executors.kubernetes.kueue_usage``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Final

from django.conf import settings
from django.db import transaction

import kube
from catalog.prefixes import workspace_folder
from catalog.runs import staged_totals
from executors.kubernetes import kueue_usage, labels, render
from executors.kubernetes import queue as kube_queue
from executors.kubernetes.endpoints import KubernetesEndpoints
from executors.kubernetes.render_endpoint import worker_count
from kube import Conflict, KubeClient, KubeError, NotFound
from kube.pod_logs import read_pod_log
from runs import run_tokens
from runs.backends import CheckpointUnreadable, PodSet, QueuedRun, QueueReading, QuotaUse
from runs.checkpoint_paths import CheckpointPathRefused, parts_inside
from runs.logs import (
    LogChunk,
    WholeLog,
    open_log_file,
    read_log_bytes,
    read_log_file,
    whole_log_bytes,
)
from runs.models import (
    LIVE_STATES,
    TERMINAL_STATES,
    Checkpoint,
    FailureClass,
    Run,
    RunAttempt,
    RunState,
)
from runs.policy import worker_pod_set
from runs.state import lock_run, transition
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import QuantityError, format_quantity, parse_quantity
from tau.spec import Spec, spec_from_dict
from workspaces.models import ResourceFlavor, Workspace

logger = logging.getLogger(__name__)

BATCH_JOB: Final = ("batch/v1", "Job")
RAY_JOB: Final = ("ray.io/v1", "RayJob")
#: How long what the Node objects say (allocatable resources, labels) is reused for the
#: "could this ever fit?" check at submission.
NODE_CACHE_SECONDS: Final = 60
#: What the containers that run the user's code are called (``executors.kubernetes.render``), per
#: component.
_MAIN_CONTAINER: Final = {
    ("job", labels.COMPONENT_WORKER): "workload",
    ("rayjob", labels.COMPONENT_SUBMITTER): "ray-job-submitter",
    ("rayjob", labels.COMPONENT_HEAD): "ray-head",
    ("rayjob", labels.COMPONENT_WORKER): "ray-worker",
}
_FETCHER_CONTAINER: Final = "tau-fetch-bundle"
#: When an attempt ends, the logs of at most this many of its pods are kept (the default
#: pod's first, then in the page's order): a 64-worker Job keeps its first workers' logs, not
#: 64 times the log cap.
KEPT_POD_LOGS: Final = 16
#: What a node answers for a container it keeps no log for (KWOK's fake nodes, whose pods run
#: no container, unless a test gave the pod a log file).
NO_LOG_ON_NODE: Final = "no logs found"
#: Which pod's log is shown by default: a RayJob's driver log is its submitter pod's.
_COMPONENT_ORDER: Final = {
    labels.COMPONENT_SUBMITTER: 0,
    labels.COMPONENT_HEAD: 1,
    labels.COMPONENT_WORKER: 2,
}


class KubernetesDeliveryError(RuntimeError):
    """The cluster holds something that stops the delivery (a foreign object with the
    attempt's name, an object being deleted); the message says what, for the run page."""


def workload_kind(spec: Spec) -> tuple[str, str]:
    """(apiVersion, kind) of a run's workload."""
    return RAY_JOB if spec.run.workload_kind == "rayjob" else BATCH_JOB


def run_selector(run: Run) -> str:
    """The label selector of every object TauGrid made for the run (all attempts): its id
    and its name (an id alone could match a leftover of another database's run)."""
    return (
        f"{labels.MANAGED_BY}={labels.MANAGED_BY_TAUGRID},{labels.RUN_ID}={run.pk},"
        f"{labels.RUN}={run.name}"
    )


def data_volume(workspace: Workspace) -> dict[str, Any] | None:
    """The volume a workspace's runs keep outputs and checkpoints on: its storage claim, or
    None (an ``emptyDir``, lost with the pod) when it has none."""
    if not workspace.storage_claim:
        return None
    return {"persistentVolumeClaim": {"claimName": workspace.storage_claim}}


def outputs_problems(spec: Spec, workspace: Workspace) -> list[tuple[str, str]]:
    """``outputs.dataset`` and ``outputs.model`` need the attempt's TAU_OUTPUT_DIR where the
    portal reads it when the attempt succeeds: on the workspace's storage claim, mounted in
    the portal at ``TAU_DATA_PREFIX_DIR/<workspace>/`` (``catalog.runs.cluster_outputs``)."""
    problems: list[tuple[str, str]] = []
    for kind, declared in (("dataset", spec.outputs.dataset), ("model", spec.outputs.model)):
        if declared is None:
            continue
        if not workspace.storage_claim:
            problems.append(
                (
                    f"outputs.{kind}",
                    f"{workspace.slug} has no storage claim: a cluster run's TAU_OUTPUT_DIR is "
                    "a scratch volume gone with the pod, so no version could be made of it. "
                    "The platform team sets the workspace's PersistentVolumeClaim in the admin "
                    "(and mounts it for the portal); until then keep the files with "
                    "outputs.artifacts.",
                )
            )
        elif not workspace_folder(workspace).is_dir():
            problems.append(
                (
                    f"outputs.{kind}",
                    f"{workspace.slug}'s storage claim is not mounted in the portal at "
                    f"{workspace_folder(workspace)}, where the {kind} would be read when the "
                    "run succeeds: the platform team mounts it there (TAU_DATA_PREFIX_DIR).",
                )
            )
    return problems


def no_storage_warning(workspace: Workspace) -> str:
    """What to tell someone submitting to a workspace without storage, or ''."""
    if workspace.storage_claim:
        return ""
    return (
        f"{workspace.slug} has no storage for checkpoints (the platform team sets a "
        "PersistentVolumeClaim in the admin): on Kubernetes its runs write outputs and "
        "checkpoints to a scratch volume that is deleted when an attempt ends, so a retry or "
        "a resume starts from the beginning."
    )


def target_for(run: Run, attempt: RunAttempt) -> tuple[Spec, render.RunTarget]:
    """The spec and the render target of ``attempt`` of ``run``."""
    spec = spec_from_dict(run.spec)
    workspace = run.workspace
    flavor = None
    gpu_type = spec.compute.gpu_type
    if gpu_type is not None:
        row = ResourceFlavor.objects.filter(name=gpu_type).values_list("node_labels", flat=True)
        node_labels = row.first()
        if node_labels is None:
            raise KubernetesDeliveryError(
                f"compute.gpu_type names the flavor {gpu_type!r}, which no longer exists"
            )
        flavor = render.Flavor(gpu_type, dict(node_labels))
    resume_from = None
    if attempt.resume_from_id is not None:
        checkpoint = Checkpoint.objects.unscoped().filter(pk=attempt.resume_from_id).first()
        resume_from = checkpoint.path if checkpoint is not None else None
    bundle = run.bundle
    target = render.RunTarget(
        run_id=run.pk,
        run_name=run.name,
        workspace=workspace.slug,
        namespace=workspace.namespace,
        local_queue=workspace.local_queue,
        attempt=attempt.number,
        portal_url=settings.TAU_API_URL,
        token_secret=render.run_token_secret_name(run.name, attempt.number),
        bundle_sha256=bundle.sha256 if bundle is not None else None,
        flavor=flavor,
        resume_from=resume_from,
        retry_reason=attempt.retry_reason,
        data_volume=data_volume(workspace),
        staged_data=staged_totals(run),
    )
    return spec, target


def _labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labelled: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labelled


def is_attempt_object(obj: Mapping[str, Any], target: render.RunTarget) -> bool:
    """Whether ``obj`` is TauGrid's object of the target's run and attempt (its labels)."""
    found = _labels_of(obj)
    return (
        found.get(labels.MANAGED_BY) == labels.MANAGED_BY_TAUGRID
        and found.get(labels.RUN_ID) == str(target.run_id)
        and found.get(labels.RUN) == target.run_name
        and found.get(labels.ATTEMPT) == str(target.attempt)
    )


def _describe(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{obj.get('kind', 'object')} {metadata.get('namespace', '')}/{metadata.get('name')}"


# ---------------------------------------------------------------------------------------------
# Nodes: could this ever fit?
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeCapacity:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, Decimal]


_node_lock = threading.Lock()
_node_cache: tuple[float, list[NodeCapacity]] | None = None


def forget_nodes() -> None:
    """Read the Node objects again at the next check (tests; a changed cluster)."""
    global _node_cache
    with _node_lock:
        _node_cache = None


def cluster_nodes(client: KubeClient) -> list[NodeCapacity] | None:
    """What each node can give pods (``status.allocatable``), read at most once a minute;
    None when the cluster cannot say (the check is then skipped, never guessed)."""
    global _node_cache
    with _node_lock:
        if _node_cache is not None and time.monotonic() - _node_cache[0] < NODE_CACHE_SECONDS:
            return _node_cache[1]
    try:
        listed = client.list("v1", "Node")
    except KubeError as exc:
        logger.warning("nodes not read for the submission check: %s", exc)
        return None
    nodes = []
    for node in listed:
        allocatable: dict[str, Decimal] = {}
        for resource, amount in ((node.get("status") or {}).get("allocatable") or {}).items():
            try:
                allocatable[str(resource)] = parse_quantity(str(amount))
            except QuantityError:
                continue
        nodes.append(
            NodeCapacity(
                name=str(node["metadata"]["name"]),
                labels=dict(_labels_of(node)),
                allocatable=allocatable,
            )
        )
    with _node_lock:
        _node_cache = (time.monotonic(), nodes)
    return nodes


_FIELD_OF: Final = {GPU_RESOURCE: "compute.gpus", "cpu": "compute.cpus", "memory": "compute.memory"}


def _amount(resource: str, value: Decimal) -> str:
    if resource == GPU_RESOURCE:
        return f"{format_quantity(value)} GPU{'' if value == 1 else 's'}"
    if resource == "cpu":
        return f"{format_quantity(value)} CPU{'' if value == 1 else 's'}"
    return f"{format_quantity(value, binary=True)} of memory"


def never_fits(spec: Spec, nodes: list[NodeCapacity]) -> list[tuple[str, str]]:
    """(tau.yaml path, message) for what no node of the cluster could ever give one worker
    of ``spec`` (each worker is one pod on one node), however idle it is. Nothing is said
    about a cluster without nodes (a node pool scaled to zero may grow)."""
    if not nodes:
        return []
    candidates = nodes
    gpu_type = spec.compute.gpu_type
    where = "this cluster"
    if gpu_type is not None:
        node_labels = (
            ResourceFlavor.objects.filter(name=gpu_type).values_list("node_labels", flat=True)
        ).first()
        if node_labels is None:
            return []  # the workspace policy says the flavor is unknown
        candidates = [
            node
            for node in nodes
            if all(node.labels.get(key) == value for key, value in dict(node_labels).items())
        ]
        where = f"flavor {gpu_type}"
        if not candidates:
            return [
                (
                    "compute.gpu_type",
                    f"No node of this cluster has the labels of flavor {gpu_type} "
                    f"({', '.join(f'{k}={v}' for k, v in sorted(dict(node_labels).items()))}): "
                    "a run on it could never be placed; ask the platform team.",
                )
            ]
    demand = {
        GPU_RESOURCE: Decimal(spec.compute.gpus),
        "cpu": parse_quantity(spec.compute.cpus),
        "memory": parse_quantity(spec.compute.memory),
    }
    problems: list[tuple[str, str]] = []
    for resource in (GPU_RESOURCE, "cpu", "memory"):  # the scarcest first
        wanted = demand[resource]
        if wanted <= 0:
            continue
        largest = max(candidates, key=lambda node: node.allocatable.get(resource, Decimal(0)))
        have = largest.allocatable.get(resource, Decimal(0))
        if wanted <= have:
            continue
        if resource == GPU_RESOURCE and have == 0:
            message = (
                f"Each worker needs {_amount(resource, wanted)}, but no node of {where} has "
                "any GPU; ask for none, or choose a GPU flavor (compute.gpu_type)."
            )
        else:
            message = (
                f"Each worker needs {_amount(resource, wanted)} on one node, but the largest "
                f"node of {where} ({largest.name}) has {_amount(resource, have)} for pods; "
                "ask for at most that per worker (use more workers for more)."
            )
        problems.append((_FIELD_OF[resource], message))
    if problems:
        return problems
    if not any(
        all(node.allocatable.get(res, Decimal(0)) >= amount for res, amount in demand.items())
        for node in candidates
    ):
        asked = ", ".join(_amount(res, amount) for res, amount in demand.items() if amount > 0)
        problems.append(
            (
                "compute",
                f"Each worker needs {asked} on one node, but no single node of {where} has "
                "all of that for pods at once; ask for less per worker.",
            )
        )
    return problems


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


def no_pod_left(attempt: RunAttempt) -> str:
    """Why an ended attempt has no kept log when none of its pods remained to read it from
    (its ``log_note``, which its evidence records)."""
    if attempt.started_at is None:
        return f"no log was written: attempt {attempt.number} never had a running pod"
    return (
        f"no log was kept: no pod of attempt {attempt.number} remained when it ended (a cancel "
        "or Kubernetes had removed them before the portal could read the log)"
    )


class KubernetesBackend:
    name = "kubernetes"
    #: A script may live in the image: a run without a project zip starts in the image's
    #: own working directory.
    scripts_need_bundle = False

    def __init__(self, client: KubeClient | None = None) -> None:
        self._client = client
        #: What it does for endpoints (serving.backends.EndpointBackend).
        self.endpoints = KubernetesEndpoints(self)

    @property
    def client(self) -> KubeClient:
        return self._client if self._client is not None else kube.client()

    # -- submission ----------------------------------------------------------------------

    def submission_problems(self, spec: Spec, workspace: Workspace) -> list[tuple[str, str]]:
        """What the Kubernetes backend cannot run exactly as written
        (:func:`executors.kubernetes.render.kubernetes_problems`), output versions the portal
        could not read back (:func:`outputs_problems`), and a worker no node of the cluster
        could ever hold (its GPUs, CPUs or memory above every node's allocatable, or a flavor
        whose labels no node has). The nodes are read at most once a minute; when the cluster
        does not answer, only the first kinds are checked."""
        problems = list(render.kubernetes_problems(spec)) + outputs_problems(spec, workspace)
        try:
            client = self.client
        except KubeError as exc:
            logger.warning("no cluster to check the submission against: %s", exc)
            return problems
        nodes = cluster_nodes(client)
        if nodes is not None:
            problems += never_fits(spec, nodes)
        return problems

    def pod_sets(self, spec: Spec) -> list[PodSet]:
        """The workers, and for a RayJob the Ray head and KubeRay's submitter pod (their size
        is fixed by :mod:`executors.kubernetes.render`): Kueue admits each as a pod set."""
        if spec.is_endpoint:
            # A RayService: its Ray cluster's workers (one per replica, or the most replicas
            # autoscaling may reach: executors.kubernetes.render_endpoint) and its head.
            replicas = worker_count(spec)
            each = worker_pod_set(spec).requests
            return [
                PodSet(
                    f"the {replicas} replica(s) need",
                    {resource: amount * replicas for resource, amount in each.items()},
                ),
                PodSet(
                    "the Ray head needs",
                    {r: parse_quantity(a) for r, a in render.head_requests(spec).items()},
                ),
            ]
        pod_sets = [worker_pod_set(spec)]
        if spec.run.workload_kind == "rayjob":
            for who, fixed in (
                ("the Ray head needs", render.head_requests(spec)),
                ("KubeRay's submitter pod needs", render.SUBMITTER_RESOURCES),
            ):
                pod_sets.append(PodSet(who, {r: parse_quantity(a) for r, a in fixed.items()}))
        return pod_sets

    def submit(self, run: Run, attempt: RunAttempt) -> None:
        spec, target = target_for(run, attempt)
        if not self._still_wanted(run.pk, attempt.pk):
            logger.info("%s attempt %s is not wanted any more; nothing created", run.name, attempt)
            return
        if not run_tokens.can_issue(run):
            self._fail(
                run,
                f"It could not be started: its submitter {run.submitted_by_username} can no "
                "longer act in TauGrid, so it cannot be given a token to report with.",
            )
            return
        api_version, kind = workload_kind(spec)
        # Where the attempt runs, recorded as the local agent records its process
        # (runs.attempts.note_placement; importing runs.attempts here would make an import
        # cycle through the delivery that calls this backend). The name is fixed by the
        # attempt, so it is written first: the watcher may see the pods run before this call
        # returns, and a try that fails halfway is repeated under the same name.
        RunAttempt.objects.unscoped().filter(pk=attempt.pk).update(
            backend_name=f"{kind}/{target.workload_name}"
        )
        self._delete_other_attempts(run, spec, keep=attempt.number)
        workload = self._create_or_adopt(render.render_workload(spec, target), target)
        self._create_dependents(run, attempt, spec, target, workload)
        if not self._still_wanted(run.pk, attempt.pk):
            # Cancelled (or moved on) while the objects were being made: take them back.
            self.client.delete(
                api_version,
                kind,
                target.workload_name,
                target.namespace,
                propagation="Foreground",
                missing_ok=True,
            )
            return
        with transaction.atomic():
            locked = lock_run(run.pk)
            if locked.state == RunState.PENDING:
                transition(
                    locked,
                    RunState.QUEUED,
                    reason=(
                        f"Waiting for Kueue to admit it (LocalQueue {target.local_queue} in "
                        f"namespace {target.namespace})."
                    ),
                    data={"workload": f"{kind}/{target.workload_name}"},
                )

    def _still_wanted(self, run_id: int, attempt_id: int) -> bool:
        state = Run.objects.unscoped().filter(pk=run_id).values_list("state", flat=True).first()
        attempt_state = (
            RunAttempt.objects.unscoped().filter(pk=attempt_id).values_list("state", flat=True)
        ).first()
        return (
            state is not None
            and state not in TERMINAL_STATES
            and state != RunState.CANCELLING
            and attempt_state
            in {RunAttempt.State.WAITING, RunAttempt.State.STARTING, RunAttempt.State.RUNNING}
        )

    def _fail(self, run: Run, reason: str) -> None:
        with transaction.atomic():
            locked = lock_run(run.pk)
            if locked.state not in LIVE_STATES:
                return
            transition(
                locked, RunState.FAILED, reason=reason, failure_class=FailureClass.INFRASTRUCTURE
            )

    def _create_or_adopt(self, body: Mapping[str, Any], target: render.RunTarget) -> dict[str, Any]:
        """``body`` created, or the object of that name when it is this attempt's already."""
        try:
            return self.client.create(body)
        except Conflict:
            metadata = body["metadata"]
            existing = self.client.get(
                body["apiVersion"], body["kind"], metadata["name"], metadata.get("namespace")
            )
        if not is_attempt_object(existing, target):
            raise KubernetesDeliveryError(
                f"{_describe(existing)} already exists and is not TauGrid's object of attempt "
                f"{target.attempt} of run {target.run_name}; it is left as it is"
            )
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise KubernetesDeliveryError(
                f"{_describe(existing)} is being deleted; the attempt is handed over again "
                "once it is gone"
            )
        return existing

    def _create_dependents(
        self,
        run: Run,
        attempt: RunAttempt,
        spec: Spec,
        target: render.RunTarget,
        workload: Mapping[str, Any],
    ) -> None:
        owner = render.Owner.of(workload)
        self._ensure_secret(run, attempt, spec, target, owner)
        if render.needs_rendezvous_service(spec):
            self._create_or_adopt(
                render.render_rendezvous_service(spec, target, owner=owner), target
            )

    def _ensure_secret(
        self,
        run: Run,
        attempt: RunAttempt,
        spec: Spec,
        target: render.RunTarget,
        owner: render.Owner,
    ) -> None:
        """The attempt's token Secret, owned by this workload; a token is issued only when
        the Secret has to be made (so delivering again leaves the token as it was)."""
        try:
            existing: dict[str, Any] | None = self.client.get(
                "v1", "Secret", target.token_secret, target.namespace
            )
        except NotFound:
            existing = None
        if existing is not None:
            if not is_attempt_object(existing, target):
                raise KubernetesDeliveryError(
                    f"{_describe(existing)} already exists and is not TauGrid's token Secret "
                    f"of attempt {target.attempt} of run {target.run_name}; it is left as it is"
                )
            owners = (existing.get("metadata") or {}).get("ownerReferences") or []
            if any(reference.get("uid") == owner.uid for reference in owners):
                return
            # Left by an earlier object of the same name, on its way to the garbage collector.
            self.client.delete(
                "v1", "Secret", target.token_secret, target.namespace, missing_ok=True
            )
        token = run_tokens.issue_run_token(
            run=run, attempt=attempt, max_runtime_seconds=spec.run.max_runtime
        )
        if token is None:
            raise KubernetesDeliveryError(
                f"no run token can be issued: {run.submitted_by_username} can no longer act"
            )
        body = render.render_run_secret(spec, target, token=token, owner=owner)
        try:
            self.client.create(body)
        except Conflict:
            # Another delivery of this attempt made it meanwhile, with the token issued
            # before this one (now revoked): this token replaces it.
            self.client.delete(
                "v1", "Secret", target.token_secret, target.namespace, missing_ok=True
            )
            self.client.create(body)

    def _delete_other_attempts(self, run: Run, spec: Spec, *, keep: int | None) -> int:
        """Delete the run's workloads of attempts other than ``keep`` (all when None), with
        foreground propagation; how many were asked to go."""
        api_version, kind = workload_kind(spec)
        namespace = run.workspace.namespace
        deleted = 0
        for obj in self.client.list(api_version, kind, namespace, label_selector=run_selector(run)):
            metadata = obj.get("metadata") or {}
            if keep is not None and _labels_of(obj).get(labels.ATTEMPT) == str(keep):
                continue
            if metadata.get("deletionTimestamp"):
                continue
            if self.client.delete(
                api_version,
                kind,
                str(metadata["name"]),
                namespace,
                propagation="Foreground",
                missing_ok=True,
            ):
                deleted += 1
        return deleted

    # -- cancel --------------------------------------------------------------------------

    def cancel(self, run: Run) -> None:
        """Delete the run's workloads (foreground: they go once their pods and dependents
        have gone). A run resumed since the cancel keeps its newest attempt's objects."""
        current = Run.objects.unscoped().filter(pk=run.pk).values_list("state", flat=True).first()
        still_cancelled = current in {RunState.CANCELLED, RunState.CANCELLING}
        keep = None if still_cancelled else run.attempt_count
        spec = spec_from_dict(run.spec)
        deleted = self._delete_other_attempts(run, spec, keep=keep)
        logger.info("cancel of %s: %d workload(s) asked to go", run.name, deleted)
        if current == RunState.CANCELLED:
            # Nothing of it ran or runs any more: its tokens serve nothing.
            run_tokens.revoke_run_tokens(run_id=run.pk)

    # -- logs ----------------------------------------------------------------------------

    def _attempt_pods(self, run: Run, attempt: RunAttempt) -> list[dict[str, Any]]:
        selector = f"{run_selector(run)},{labels.ATTEMPT}={attempt.number}"
        pods = self.client.list("v1", "Pod", run.workspace.namespace, label_selector=selector)

        def order(pod: Mapping[str, Any]) -> tuple[int, int, str]:
            metadata = pod.get("metadata") or {}
            component = _labels_of(pod).get(labels.COMPONENT, "")
            index = (metadata.get("annotations") or {}).get(labels.JOB_COMPLETION_INDEX, "0")
            return (
                _COMPONENT_ORDER.get(component, 3),
                int(index) if str(index).isdigit() else 0,
                str(metadata.get("name", "")),
            )

        return sorted(pods, key=order)

    def _log_bytes(
        self,
        run: Run,
        attempt: RunAttempt,
        pod: str | None,
        pods: list[dict[str, Any]] | None = None,
    ) -> tuple[bytes, str, tuple[str, ...], str]:
        """(the log, the pod it is of, the attempt's pods, a note on why there is none);
        ``pods``: the attempt's pods when the caller has just listed them."""
        spec = spec_from_dict(run.spec)
        if pods is None:
            try:
                pods = self._attempt_pods(run, attempt)
            except KubeError as exc:
                return b"", "", (), f"The cluster did not answer: {exc}"
        names = tuple(str(p["metadata"]["name"]) for p in pods)
        if not pods:
            if attempt.finished_at is not None:
                return (
                    b"",
                    "",
                    (),
                    (
                        f"Attempt {attempt.number}'s pods are gone (Kubernetes deletes finished "
                        "pods) and its log was not kept."
                    ),
                )
            return (
                b"",
                "",
                (),
                (
                    f"Attempt {attempt.number} has no pod yet: "
                    f"{run.state_reason or 'it waits for Kueue to admit it.'}"
                ),
            )
        chosen = next((p for p in pods if p["metadata"]["name"] == pod), None) if pod else pods[0]
        if chosen is None:
            return b"", "", names, f"Attempt {attempt.number} has no pod called {pod}."
        name = str(chosen["metadata"]["name"])
        component = _labels_of(chosen).get(labels.COMPONENT, labels.COMPONENT_WORKER)
        container = _MAIN_CONTAINER.get((spec.run.workload_kind, component))
        started, note, fetch_failed = _container_state(chosen, container)
        if not started and fetch_failed:
            container = _FETCHER_CONTAINER  # the bundle fetcher's log says why
        elif not started:
            return b"", name, names, self._why_not_started(run, chosen, note)
        try:
            data = read_pod_log(
                self.client,
                run.workspace.namespace,
                name,
                container=container,
                limit_bytes=int(settings.TAU_RUN_LOG_MAX_BYTES),
            )
        except KubeError as exc:
            if NO_LOG_ON_NODE in str(exc):
                return b"", name, names, f"{name} has no log: its node keeps none for it."
            return b"", name, names, f"The log of {name} could not be read: {exc}"
        if not data and not fetch_failed:
            return data, name, names, _wrote_nothing(chosen)
        return data, name, names, (note if fetch_failed else "")

    def _why_not_started(self, run: Run, pod: Mapping[str, Any], note: str) -> str:
        """Why a pod has not started, in Kubernetes' words: its containers' waiting reason
        (an image that cannot be pulled), the scheduler's condition, and its newest warning
        events (each message once)."""
        name = str(pod["metadata"]["name"])
        reasons = [note] if note else []
        said: set[str] = set()
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                message = str(condition.get("message", "")).strip()
                said.add(message)
                reasons.append(f"not scheduled ({condition.get('reason', '')}): {message}")
        try:
            events = self.client.list(
                "v1",
                "Event",
                run.workspace.namespace,
                field_selector=f"involvedObject.name={name},type=Warning",
            )
        except KubeError:
            events = []
        events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        for event in events[-3:]:
            message = str(event.get("message", "")).strip()
            if message in said or any(message and message in reason for reason in reasons):
                continue
            said.add(message)
            reasons.append(f"{event.get('reason', '')}: {message}")
        why = "; ".join(reason.strip() for reason in reasons if reason.strip())
        return f"{name} has not started yet" + (f": {why}" if why else " (no reason given yet).")

    def read_log(
        self,
        run: Run,
        attempt: RunAttempt,
        *,
        offset: int | None,
        tail_lines: int | None,
        pod: str | None = None,
    ) -> LogChunk:
        complete = attempt.finished_at is not None
        kept = KeptLogs.of(attempt)
        if kept is not None:
            path, chosen, note = kept.file_of(pod)
            chunk = read_log_file(
                path,
                attempt=attempt.number,
                complete=complete,
                offset=offset,
                tail_lines=tail_lines,
            )
            return dataclasses.replace(chunk, pod=chosen, pods=kept.pods, note=note)
        data, chosen, pods, note = self._log_bytes(run, attempt, pod)
        chunk = read_log_bytes(
            data, attempt=attempt.number, complete=complete, offset=offset, tail_lines=tail_lines
        )
        return dataclasses.replace(chunk, pod=chosen, pods=pods, note=note)

    def open_log(self, run: Run, attempt: RunAttempt, *, pod: str | None = None) -> WholeLog:
        live = attempt.finished_at is None
        kept = KeptLogs.of(attempt)
        if kept is not None:
            path, _, _ = kept.file_of(pod)
            return open_log_file(path, attempt=attempt.number, live=live)
        data, _, _, _ = self._log_bytes(run, attempt, pod)
        return whole_log_bytes(data, attempt=attempt.number, live=live)

    def archive_log(self, run: Run, attempt: RunAttempt) -> tuple[Path, int] | None:
        """Keep an ended attempt's logs under ``VAR_DIR/kube-logs/`` before Kubernetes
        deletes its pods: its default pod's (a RayJob's driver, a Job's worker 0) as
        ``attempt-N.log``, and those of its other pods, up to :data:`KEPT_POD_LOGS` in all,
        beside it (:class:`KeptLogs`); each at most TAU_RUN_LOG_MAX_BYTES. The caller notes
        the first on the attempt (``attempts.note_log_kept``), and from then on the logs are
        served from there. Returns that file and its size; None when there is nothing to
        keep: no pod of the attempt remains (it never had one, or a cancel or Kubernetes
        removed them first). Raises ``KubeError`` when the cluster did not answer (nobody
        knows yet whether there is a log)."""
        pods = self._attempt_pods(run, attempt)
        data, chosen, names, note = self._log_bytes(run, attempt, None, pods)
        if not chosen:
            return None
        path = Path(settings.VAR_DIR) / "kube-logs" / str(run.pk) / f"attempt-{attempt.number}.log"
        folder = KeptLogs.folder_of(path)
        folder.mkdir(parents=True, exist_ok=True)
        kept = [chosen]
        # Why a kept log is empty (no log on its node, nothing written), said when it is read.
        notes = {chosen: note} if note and not data else {}
        for name in names:
            if name == chosen or len(kept) >= KEPT_POD_LOGS:
                continue
            other, _, _, other_note = self._log_bytes(run, attempt, name, pods)
            _write_whole(folder / f"{name}.log", other)
            kept.append(name)
            if other_note and not other:
                notes[name] = other_note
        _write_whole(
            folder / KeptLogs.INDEX,
            json.dumps({"pods": kept, "not_kept": len(names) - len(kept), "notes": notes}).encode(),
        )
        _write_whole(path, data)  # last: once it is there, the logs are served from here
        return path, len(data)

    # -- checkpoints ---------------------------------------------------------------------

    def checkpoint_path(self, run: Run, path: str) -> str:
        """Inside the pods the run's checkpoint folder is ``/tau/checkpoints``
        (``TAU_CHECKPOINT_DIR``; for a Job with ``resilience.checkpoint_dir`` also that folder
        of the project directory); the path may be given absolute or relative to it and is
        kept absolute under ``/tau/checkpoints``."""
        return str(PurePosixPath(render.CHECKPOINT_DIR, *parts_inside(_folders(run), path)))

    def checkpoint_exists(self, run: Run, checkpoint: Checkpoint) -> bool:
        """The portal cannot look inside the workspace's volume, so a checkpoint the workload
        reported is trusted to be there (a workload that deletes old ones should report
        them as such) — as long as the workspace has storage: without a storage claim the
        checkpoints were written to a scratch volume that went with the attempt's pods, and
        no later attempt can resume from them. Only a path inside the run's checkpoint
        folder counts."""
        if not run.workspace.storage_claim or not checkpoint.complete:
            return False
        try:
            return (
                bool(parts_inside(_folders(run), checkpoint.path))
                and PurePosixPath(checkpoint.path).is_absolute()
            )
        except CheckpointPathRefused:
            return False

    def checkpoint_files(self, run: Run, checkpoint: Checkpoint) -> Path:
        """Never: a cluster run's checkpoints are on the workspace's volume, which the portal
        does not read them from (and without a storage claim they went with the attempt's
        pods). The refusal says the two ways a cluster run's model becomes a version."""
        raise CheckpointUnreadable(
            f"{run.name} ran on Kubernetes: its checkpoints are on the workspace's volume, "
            "which the portal cannot read them from. Declare outputs.model in its tau.yaml "
            "(the run's model is then registered when it succeeds), or keep the checkpoint "
            "with outputs.artifacts and register it with `tau data model register NAME "
            f"--run {run.name} --path PATH`."
        )

    # -- quota ---------------------------------------------------------------------------

    def quota_in_use(self, workspace_ids: Collection[int] | None) -> dict[int, QuotaUse]:
        """What Kueue has reserved for each workspace's ClusterQueue (its status); nothing
        when the cluster does not answer (logged)."""
        return {
            workspace_id: dict(reserved)
            for workspace_id, reserved in kueue_usage.reserved_by_workspace(workspace_ids).items()
        }

    # -- what pages, the API and evidence ask -------------------------------------------

    def queue_positions(self, workspace: Workspace, runs: list[QueuedRun]) -> QueueReading:
        """Kueue's positions, from its visibility API: one call for the workspace's
        LocalQueue (:mod:`executors.kubernetes.queue`)."""
        return kube_queue.read_queue(workspace, runs, client=self._client)

    def storage_warning(self, workspace: Workspace) -> str:
        return no_storage_warning(workspace)

    def environment(self, run: Run) -> dict[str, Any] | None:
        return None  # the image's: its reference is in the record, its digest is not known

    def attempt_objects(self, run: Run, attempt: RunAttempt) -> list[dict[str, Any]]:
        if not attempt.backend_name:
            return []
        _, kind = workload_kind(spec_from_dict(run.spec))
        return [{"kind": kind, "name": attempt.backend_name, "namespace": run.workspace.namespace}]

    def readiness_note(self) -> dict[str, Any] | None:
        return None  # the watcher's health is its heartbeat (/metrics, the platform pages)


def _folders(run: Run) -> list[PurePosixPath]:
    folders = [PurePosixPath(render.CHECKPOINT_DIR)]
    checkpoint_dir = (run.spec.get("resilience") or {}).get("checkpoint_dir")
    if isinstance(checkpoint_dir, str) and checkpoint_dir not in {"", "."}:
        folders.append(PurePosixPath(render.CODE_DIR, checkpoint_dir))
    return folders


def _write_whole(path: Path, data: bytes) -> None:
    """Whole or not at all: a reader never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


@dataclass(frozen=True)
class KeptLogs:
    """An ended attempt's logs as the portal kept them (:meth:`KubernetesBackend.archive_log`):
    ``attempt-N.log`` is the default pod's, and the folder ``attempt-N.pods/`` beside it holds
    the others' (``<pod>.log``) and ``index.json`` naming them all, the default first."""

    INDEX: ClassVar[str] = "index.json"

    path: Path
    pods: tuple[str, ...]
    not_kept: int
    #: Why a pod's kept log is empty, by pod (its node had none, it wrote nothing).
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @staticmethod
    def folder_of(path: Path) -> Path:
        return path.with_name(path.stem + ".pods")

    @classmethod
    def of(cls, attempt: RunAttempt) -> KeptLogs | None:
        """The attempt's kept logs, if it has any (a log kept by an earlier version has no
        index: the default pod's only, name unknown)."""
        if not attempt.log_path:
            return None
        path = Path(attempt.log_path)
        if not path.is_file():
            return None
        try:
            index = json.loads((cls.folder_of(path) / cls.INDEX).read_text())
            pods = tuple(str(name) for name in index["pods"])
            not_kept = int(index.get("not_kept", 0))
            notes = {str(pod): str(note) for pod, note in dict(index.get("notes") or {}).items()}
        except (OSError, ValueError, KeyError, TypeError):
            pods, not_kept, notes = (), 0, {}
        return cls(path=path, pods=pods, not_kept=not_kept, notes=notes)

    def file_of(self, pod: str | None) -> tuple[Path | None, str, str]:
        """(the file of ``pod``'s log, or of the default pod's when None; the pod's name; a
        note when it was not kept, or why it is empty)."""
        default = self.pods[0] if self.pods else ""
        if pod is None or pod == default:
            return self.path, default, self.notes.get(default, "")
        if pod in self.pods:
            return self.folder_of(self.path) / f"{pod}.log", pod, self.notes.get(pod, "")
        more = (
            f" (the logs of {len(self.pods)} of its pods were kept, {self.not_kept} not)"
            if self.not_kept
            else ""
        )
        return None, "", f"The log of pod {pod} was not kept when the attempt ended{more}."


def _wrote_nothing(pod: Mapping[str, Any]) -> str:
    """Why a started pod's log is empty, in words (not a blank box)."""
    name = str(pod["metadata"]["name"])
    if (pod.get("status") or {}).get("phase") in {"Succeeded", "Failed"}:
        return f"{name} wrote nothing to its log."
    return f"{name} has written nothing to its log yet."


def _container_state(pod: Mapping[str, Any], container: str | None) -> tuple[bool, str, bool]:
    """(whether the container has started, why not in Kubernetes' words, whether the bundle
    fetcher failed)."""
    status = pod.get("status") or {}
    fetch_failed = False
    note = ""
    for init in status.get("initContainerStatuses") or []:
        terminated = (init.get("state") or {}).get("terminated")
        if init.get("name") == _FETCHER_CONTAINER and terminated and terminated.get("exitCode"):
            fetch_failed = True
            note = f"the code bundle could not be fetched (exit code {terminated['exitCode']})"
    statuses = status.get("containerStatuses") or []
    for state in statuses:
        if container is not None and state.get("name") != container:
            continue
        current = state.get("state") or {}
        if "running" in current or "terminated" in current:
            return True, "", fetch_failed
        waiting = current.get("waiting") or {}
        if waiting:
            reason = str(waiting.get("reason", ""))
            message = str(waiting.get("message", ""))
            if reason in {"ErrImagePull", "ImagePullBackOff", "InvalidImageName"}:
                message = f"the image cannot be pulled ({reason}): {message}"
            elif reason:
                message = f"{reason}: {message}" if message else reason
            note = "; ".join(part for part in (note, message) if part)
    return False, note, fetch_failed
