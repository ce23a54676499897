"""The GPU fleet: which nodes have GPUs, how many are in use and by which runs, and whether
each node is healthy, read from Kubernetes (or, on the embedded default, NVML) and written
into :class:`gpus.models.GpuNode` rows that the fleet pages and the API read.

Reading
=======

:func:`read_fleet` makes two list calls, whatever the fleet's size: every Node, and the
unfinished pods of the whole cluster bound to a node (field selector
``status.phase!=Succeeded,status.phase!=Failed,spec.nodeName!=``), never one call per node.
:func:`node_views` turns those bodies into a :class:`NodeView` per node with
``nvidia.com/gpu`` capacity: a pure function, tested as a table
(``tests/gpus/test_fleet_table.py``).

- **Pool**: the ``taugrid.io/node-pool`` label; else the name of the ResourceFlavor whose
  ``node_labels`` the node carries (all of them; the flavor naming most labels wins, then
  the first by name); else empty. **GPU model**: ``nvidia.com/gpu.product`` (what GPU
  Feature Discovery sets), else the flavor's.
- **GPUs**: ``gpus_total`` is the capacity, ``gpus_allocatable`` the allocatable (lower when
  the NVIDIA device plugin has marked GPUs unhealthy), ``gpus_in_use`` the GPUs the node's
  unfinished pods request, counted as the scheduler counts them: per container the request,
  else the limit (an extended resource's request defaults to its limit); a pod holds the
  larger of its containers plus sidecars (init containers with ``restartPolicy: Always``)
  and its peak init container plus the sidecars started before it, plus ``spec.overhead``.
  Pods with TauGrid's ``taugrid.io/workspace`` and ``taugrid.io/run`` labels are listed in
  ``runs``; the GPUs of the others are ``other_gpus_in_use``.

Health
======

Every condition is kept, flagged ``gpu`` (its type is in ``TAU_GPU_HEALTH_CONDITIONS``, or
looks GPU-related: a word GPU, XID, NVLink, ECC, DCGM, NVIDIA, IBLink or InfiniBand in it, as
REFERENCE.md says to treat the conditions NPD plugins invent) and ``problem``. A node is
``healthy`` when its ``Ready`` condition is True and no condition is a problem:

==========================================================  ==========================
condition                                                   a problem when
==========================================================  ==========================
``Ready``                                                   False, Unknown, or missing
a GPU condition (above)                                     True
``MemoryPressure``, ``DiskPressure``, ``PIDPressure``,      True
``NetworkUnavailable`` (the kubelet's own)
anything else (``KernelDeadlock``, …)                       never (shown, not judged)
==========================================================  ==========================

Each problem is a sentence: ``XIDErrors since 12:03 UTC: XID 79 — GPU has fallen off the
bus`` (XID codes in the message explained with :mod:`executors.kubernetes.gpu_faults`; the day is
named when it is not the sync's), ``NotReady since 09:12 UTC: Kubelet stopped posting node status``.
Being cordoned (``spec.unschedulable``) is a state, not a problem: a cordoned node can be
healthy.

Syncing
=======

:func:`sync_fleet` (Celery beat, ``gpus.tasks.sync_fleet`` every ``TAU_GPU_SYNC_SECONDS``)
reads the fleet and writes the rows in a few queries whatever its size: one read of the rows,
one ``bulk_create`` of new nodes, one ``bulk_update`` of the rows that changed, naming only
the fields that changed (nothing is written for a node that did not change), one delete of
the nodes that are gone or have no GPUs any more, and the :class:`~gpus.models.FleetSync` row.
``unhealthy_since`` is set when a node turns unhealthy (for a node first seen unhealthy: the
earliest transition of its problems) and cleared when it is healthy again. When Kubernetes
cannot be read the rows are left as they were (pages keep the last-known state) and
``FleetSync.last_error`` says why; nothing raises into Celery.

Auto-cordon (``TAU_GPU_AUTO_CORDON``): a node whose GPU condition turned True since the last
sync (or that is first seen with one True) and is not cordoned is cordoned
(:mod:`gpus.actions`), audited with the system as the actor and the condition as the reason.
``GpuNode.auto_cordon_seen`` remembers which True conditions were answered: a node staff
uncordon while the condition stays True is left alone until it clears and comes back; a
cordon that failed is tried again at the next sync. Only GPU conditions trigger it, never
``NotReady`` (Kubernetes' own node lifecycle handles that). Kubernetes is never called inside
a database transaction.

On the embedded default (``TAU_BACKEND=local``) the fleet is this machine: one node named
after the host with the GPUs NVML finds (:mod:`telemetry.nvml`) and the local runs holding
them. Without a GPU the fleet is empty and ``FleetSync.last_error`` says why ("no NVIDIA
driver on this machine (NVML: …)"), with ``last_success_at`` set: the machine was read, and
that is its answer.
"""

from __future__ import annotations

import itertools
import logging
import re
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any, Final

from django.conf import settings
from django.db import transaction
from django.utils import timezone

import kube
from executors.kubernetes import labels as run_labels
from executors.kubernetes.gpu_faults import describe, xids_in
from gpus import actions
from gpus.models import FleetSync, GpuNode, NodeSource
from kube import KubeClient, KubeError
from runs.models import RUNNING_STATES, Backend, Run
from runs.policy import requested_totals
from tau.k8s_names import GPU_RESOURCE
from tau.quantity import QuantityError, parse_quantity
from tau.spec import SpecError, spec_from_dict
from telemetry.nvml import probe_local_gpus
from workspaces.models import ResourceFlavor

__all__ = [
    "KUBELET_PRESSURE_CONDITIONS",
    "NODE_POOL_LABEL",
    "UNFINISHED_PODS",
    "NodeView",
    "SyncResult",
    "looks_gpu_related",
    "node_views",
    "pod_gpus",
    "read_fleet",
    "sync_fleet",
]

logger = logging.getLogger(__name__)

Body = dict[str, Any]

#: The pool a node belongs to, when its operators name one.
NODE_POOL_LABEL: Final = "taugrid.io/node-pool"
#: What GPU Feature Discovery says the GPUs are.
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
#: Pods that hold resources on a node: bound to one and not finished (the one pod list of a
#: sync; ``spec.nodeName!=`` leaves out the pending pods no node has taken yet).
UNFINISHED_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed,spec.nodeName!="
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
#: The kubelet's own conditions that are bad news when True.
KUBELET_PRESSURE_CONDITIONS: Final = frozenset(
    {"MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"}
)
#: Words that make a condition type GPU-related ("XIDErrors", "GPUECCErrors",
#: "NVLinkStatusInactive", "DcgmHealthProblem", "IBLinkFlapping", "UnhealthyNvidiaDevicePlugin").
GPU_WORDS: Final = frozenset({"gpu", "xid", "nvlink", "ecc", "dcgm", "nvidia", "iblink"})
# Acronyms run together in capitals ("GPUECC"): looked for inside such a run too.
GPU_ACRONYMS: Final = ("GPU", "XID", "ECC", "DCGM", "NVIDIA")
# Words of a CamelCase or snake_case type: "XIDErrors" → XID, Errors; "NVLink" → NV, Link.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z][a-z]*|[a-z]+|\d+")

FIELDS_SYNCED: Final = (
    "source",
    "pool",
    "flavor",
    "gpu_model",
    "gpus_total",
    "gpus_allocatable",
    "gpus_in_use",
    "other_gpus_in_use",
    "ready",
    "healthy",
    "cordoned",
    "conditions",
    "problems",
    "taints",
    "runs",
    "labels",
)


@dataclass(frozen=True)
class NodeView:
    """One GPU node as the fleet pages show it (the shapes of ``conditions``, ``taints`` and
    ``runs`` are :class:`~gpus.models.GpuNode`'s)."""

    name: str
    pool: str
    flavor: ResourceFlavor | None
    gpu_model: str
    gpus_total: int
    gpus_allocatable: int
    gpus_in_use: int
    other_gpus_in_use: int
    ready: bool
    healthy: bool
    cordoned: bool
    conditions: list[dict[str, Any]]
    problems: list[str]
    taints: list[dict[str, str]]
    runs: list[dict[str, Any]]
    labels: dict[str, str]
    source: str = NodeSource.KUBERNETES
    #: The GPU conditions that are True now, each with its problem sentence (what
    #: auto-cordon acts on and names as its reason).
    gpu_alerts: dict[str, str] = field(default_factory=dict)
    #: When the earliest of its problems began, if a condition says.
    problems_since: datetime | None = None


@dataclass(frozen=True)
class SyncResult:
    """How one sync went: ``error`` is empty when the fleet was read (on the local backend
    it says why there is no GPU, if there is none)."""

    source: str
    ok: bool
    error: str = ""
    node_count: int = 0
    created: int = 0
    updated: int = 0
    deleted: int = 0
    #: Nodes auto-cordon cordoned in this sync.
    cordoned: tuple[str, ...] = ()
    took_ms: int = 0
    #: The sync did not run (another one was still running).
    skipped: bool = False


# --- reading ----------------------------------------------------------------------------------


def read_fleet(
    client: KubeClient,
    *,
    flavors: Sequence[ResourceFlavor] | None = None,
    health_conditions: Iterable[str] | None = None,
    now: datetime | None = None,
) -> list[NodeView]:
    """The GPU nodes of the cluster ``client`` reaches: one list of Nodes, one list of the
    unfinished pods of every namespace. :class:`~kube.KubeError` when Kubernetes cannot
    answer."""
    nodes = client.list("v1", "Node")
    pods = client.list("v1", "Pod", field_selector=UNFINISHED_PODS)
    return node_views(
        nodes,
        pods,
        flavors=list(ResourceFlavor.objects.all()) if flavors is None else flavors,
        health_conditions=(
            settings.TAU_GPU_HEALTH_CONDITIONS if health_conditions is None else health_conditions
        ),
        now=now or timezone.now(),
    )


def node_views(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    flavors: Sequence[ResourceFlavor],
    health_conditions: Iterable[str],
    now: datetime,
) -> list[NodeView]:
    """The nodes with GPU capacity, as :class:`NodeView` s ordered by pool and name. Pure:
    the bodies as the API server gives them, the flavors, the condition types that are GPU
    health conditions, and the time the problem sentences are written at."""
    configured = frozenset(health_conditions)
    gpu_nodes = {
        str(_metadata(node).get("name") or ""): node for node in nodes if _capacity(node) > 0
    }
    held = _gpus_held(pods, gpu_nodes.keys())
    views = [
        _node_view(name, node, held.get(name, _Held()), flavors, configured, now)
        for name, node in gpu_nodes.items()
        if name
    ]
    views.sort(key=lambda view: (view.pool, view.name))
    return views


@dataclass
class _Held:
    """What the pods bound to one node hold."""

    total: int = 0
    others: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)


def _gpus_held(pods: Iterable[Mapping[str, Any]], node_names: Iterable[str]) -> dict[str, _Held]:
    wanted = set(node_names)
    held: dict[str, _Held] = {}
    for pod in pods:
        node_name = str((pod.get("spec") or {}).get("nodeName") or "")
        if node_name not in wanted:
            continue
        if str((pod.get("status") or {}).get("phase") or "") in FINISHED_PHASES:
            continue  # the list asked for unfinished pods; a body given otherwise is checked
        gpus = pod_gpus(pod)
        if gpus <= 0:
            continue
        on_node = held.setdefault(node_name, _Held())
        on_node.total += gpus
        metadata = _metadata(pod)
        pod_labels = metadata.get("labels") or {}
        workspace = str(pod_labels.get(run_labels.WORKSPACE) or "")
        run = str(pod_labels.get(run_labels.RUN) or "")
        if workspace and run:
            on_node.runs.append(
                {
                    "workspace": workspace,
                    "run": run,
                    "namespace": str(metadata.get("namespace") or ""),
                    "pod": str(metadata.get("name") or ""),
                    "gpus": gpus,
                }
            )
        else:
            on_node.others += gpus
    for on_node in held.values():
        on_node.runs.sort(key=lambda entry: (entry["workspace"], entry["run"], entry["pod"]))
    return held


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """The GPUs a pod holds on its node, as the scheduler counts its requests (see the
    module docstring: requests else limits; init containers and sidecars; overhead)."""
    spec = pod.get("spec") or {}
    containers = sum(_container_gpus(c) for c in spec.get("containers") or [])
    sidecars = 0
    init_peak = 0
    for init in spec.get("initContainers") or []:
        if init.get("restartPolicy") == "Always":
            # A sidecar runs from its start to the pod's end, beside what starts after it.
            sidecars += _container_gpus(init)
        else:
            init_peak = max(init_peak, sidecars + _container_gpus(init))
    overhead = _amount((spec.get("overhead") or {}).get(GPU_RESOURCE))
    return max(containers + sidecars, init_peak) + overhead


def _container_gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    requested = (resources.get("requests") or {}).get(GPU_RESOURCE)
    if requested is None:
        requested = (resources.get("limits") or {}).get(GPU_RESOURCE)
    return _amount(requested)


def _amount(value: object) -> int:
    """A GPU count from a quantity ("4"); what the API server would not accept counts 0."""
    if value is None:
        return 0
    try:
        amount = parse_quantity(str(value))
    except QuantityError:
        return 0
    return max(0, int(amount.to_integral_value(rounding=ROUND_CEILING)))


def _capacity(node: Mapping[str, Any], key: str = "capacity") -> int:
    return _amount(((node.get("status") or {}).get(key) or {}).get(GPU_RESOURCE))


def _metadata(body: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = body.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _node_view(
    name: str,
    node: Mapping[str, Any],
    held: _Held,
    flavors: Sequence[ResourceFlavor],
    configured: frozenset[str],
    now: datetime,
) -> NodeView:
    node_labels = {str(k): str(v) for k, v in (_metadata(node).get("labels") or {}).items()}
    flavor = flavor_of(node_labels, flavors)
    pool = node_labels.get(NODE_POOL_LABEL) or (flavor.name if flavor is not None else "")
    gpu_model = node_labels.get(GPU_PRODUCT_LABEL) or (flavor.gpu_model if flavor else "")
    spec = node.get("spec") or {}
    conditions, problems, alerts, since = judge_conditions(
        (node.get("status") or {}).get("conditions") or [], configured, now
    )
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return NodeView(
        name=name,
        pool=pool,
        flavor=flavor,
        gpu_model=gpu_model,
        gpus_total=_capacity(node),
        gpus_allocatable=_capacity(node, "allocatable"),
        gpus_in_use=held.total,
        other_gpus_in_use=held.others,
        ready=ready,
        healthy=ready and not problems,
        cordoned=bool(spec.get("unschedulable")),
        conditions=conditions,
        problems=problems,
        taints=[
            {
                "key": str(taint.get("key") or ""),
                "value": str(taint.get("value") or ""),
                "effect": str(taint.get("effect") or ""),
            }
            for taint in spec.get("taints") or []
        ],
        runs=held.runs,
        labels=node_labels,
        gpu_alerts=alerts,
        problems_since=since,
    )


def flavor_of(
    node_labels: Mapping[str, str], flavors: Sequence[ResourceFlavor]
) -> ResourceFlavor | None:
    """The flavor whose node labels the node carries, all of them (a flavor without node
    labels selects no node in particular, so it names none); the most specific one wins."""
    matching = [
        flavor
        for flavor in flavors
        if isinstance(flavor.node_labels, dict)
        and flavor.node_labels
        and all(node_labels.get(str(k)) == str(v) for k, v in flavor.node_labels.items())
    ]
    matching.sort(key=lambda flavor: (-len(flavor.node_labels), flavor.name))
    return matching[0] if matching else None


def looks_gpu_related(condition_type: str) -> bool:
    """Whether a condition's type names GPUs, their links or their monitors (an NPD plugin's
    ``GPUECCErrors``, ``DcgmHealthProblem``, ``IBLinkFlapping``), by its words: "Oxidation"
    has "xid" in it but is not about XIDs."""
    words = _WORD.findall(condition_type)
    lowered = [word.lower() for word in words]
    if any(word in GPU_WORDS for word in lowered):
        return True
    if any(a + b in GPU_WORDS or a + b == "infiniband" for a, b in itertools.pairwise(lowered)):
        return True
    capitals = [word for word in words if word.isupper() and len(word) > 3]
    return any(acronym in word for word in capitals for acronym in GPU_ACRONYMS)


def judge_conditions(
    raw: Iterable[Mapping[str, Any]], configured: frozenset[str], now: datetime
) -> tuple[list[dict[str, Any]], list[str], dict[str, str], datetime | None]:
    """The conditions as stored (each flagged ``gpu`` and ``problem``), the problem sentences,
    the GPU alerts (type → sentence) and when the earliest problem began."""
    conditions: list[dict[str, Any]] = []
    problems: list[str] = []
    alerts: dict[str, str] = {}
    since: datetime | None = None
    saw_ready = False
    for entry in raw:
        kind = str(entry.get("type") or "")
        if not kind:
            continue
        status = str(entry.get("status") or "Unknown")
        message = str(entry.get("message") or "")
        reason = str(entry.get("reason") or "")
        changed = str(entry.get("lastTransitionTime") or "")
        gpu = kind in configured or looks_gpu_related(kind)
        if kind == "Ready":
            saw_ready = True
            problem = status != "True"
        elif gpu or kind in KUBELET_PRESSURE_CONDITIONS:
            problem = status == "True"
        else:
            problem = False
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "last_transition_time": changed,
                "gpu": gpu,
                "problem": problem,
            }
        )
        if not problem:
            continue
        began = _parse_time(changed)
        if began is not None and (since is None or began < since):
            since = began
        sentence = problem_sentence(
            "NotReady" if kind == "Ready" else kind, message or reason, began, now
        )
        problems.append(sentence)
        if gpu:
            alerts[kind] = sentence
    if not saw_ready:
        problems.insert(0, "NotReady: the node reports no Ready condition")
    return conditions, problems, alerts, since


def problem_sentence(name: str, message: str, began: datetime | None, now: datetime) -> str:
    """``XIDErrors since 12:03 UTC: XID 79 — GPU has fallen off the bus``: the condition, when
    it began (UTC; the date too when not today), and what it says, XIDs explained."""
    text = name
    if began is not None:
        text += f" since {_when(began, now)}"
    said = explain_message(message)
    return f"{text}: {said}" if said else text


def explain_message(message: str) -> str:
    """A condition's message, or, when it names XID codes, each with its meaning."""
    codes = xids_in(message)
    if codes:
        return "; ".join(f"XID {code} — {describe(code).meaning}" for code in codes)
    return " ".join(message.split()).rstrip(".")


def _when(moment: datetime, now: datetime) -> str:
    utc_moment = moment.astimezone(UTC)
    if utc_moment.date() == now.astimezone(UTC).date():
        return f"{utc_moment:%H:%M} UTC"
    return f"{utc_moment:%Y-%m-%d %H:%M} UTC"


def _parse_time(text: str) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# --- the embedded default: this machine -------------------------------------------------------


def local_fleet() -> tuple[list[NodeView], str]:
    """This machine as a node, with the GPUs NVML finds and the local runs holding them; no
    node and the reason when there is no GPU here."""
    host = socket.gethostname()
    probe = probe_local_gpus(host)
    if not probe.gpus:
        return [], probe.reason
    flavor = ResourceFlavor.objects.filter(name=settings.TAU_LOCAL_FLAVOR).first()
    runs = _local_runs()
    in_use = sum(int(entry["gpus"]) for entry in runs)
    models = [gpu.model for gpu in probe.gpus if gpu.model]
    view = NodeView(
        name=host,
        source=NodeSource.LOCAL,
        pool=flavor.name if flavor is not None else "",
        flavor=flavor,
        gpu_model=models[0] if models else "",
        gpus_total=len(probe.gpus),
        gpus_allocatable=len(probe.gpus),
        gpus_in_use=min(in_use, len(probe.gpus)),
        other_gpus_in_use=0,
        ready=True,
        healthy=True,
        cordoned=False,
        conditions=[],
        problems=[],
        taints=[],
        runs=runs,
        labels={},
    )
    return [view], ""


def _local_runs() -> list[dict[str, Any]]:
    """The local runs holding GPUs: those the local agent admitted and has not finished
    (``pod`` is empty: a local run is processes on this machine)."""
    entries: list[dict[str, Any]] = []
    running = (
        Run.objects.unscoped()
        .filter(backend=Backend.LOCAL, state__in=RUNNING_STATES)
        .select_related("workspace")
        .only("name", "spec", "workspace__slug")
        .order_by("workspace__slug", "name")
    )
    for run in running:
        try:
            gpus = int(requested_totals(spec_from_dict(run.spec)).get(GPU_RESOURCE, Decimal(0)))
        except (SpecError, ValueError, TypeError, KeyError):
            continue  # a spec this version cannot read holds nothing it can count
        if gpus > 0:
            entries.append(
                {
                    "workspace": run.workspace.slug,
                    "run": run.name,
                    "namespace": "",
                    "pod": "",
                    "gpus": gpus,
                }
            )
    return entries


# --- syncing ----------------------------------------------------------------------------------


def sync_fleet(*, client: KubeClient | None = None, now: datetime | None = None) -> SyncResult:
    """Read the fleet and write it into the GpuNode rows and the FleetSync row; never raises
    (a failure is in the result and in ``FleetSync.last_error``)."""
    started = time.monotonic()
    now = now or timezone.now()
    source = NodeSource.LOCAL if settings.TAU_BACKEND == "local" else NodeSource.KUBERNETES
    try:
        if source == NodeSource.LOCAL:
            views, reason = local_fleet()
            return _write(views, source=source, now=now, started=started, notice=reason)
        if client is None:
            client = kube.client()
        views = read_fleet(client, now=now)
        views, cordons, cordon_errors = _auto_cordon(views, client=client)
        return _write(
            views,
            source=source,
            now=now,
            started=started,
            cordons=cordons,
            notice="; ".join(cordon_errors),
        )
    except KubeError as error:
        message = f"cannot read the fleet from Kubernetes: {error.message}"
        logger.warning("%s", message)
        return _failed(source, message, now=now, started=started)
    except Exception as error:  # a sync must never take the beat's worker down
        logger.exception("the fleet sync failed")
        message = f"the fleet sync failed: {type(error).__name__}: {error}"
        return _failed(source, message, now=now, started=started)


@dataclass(frozen=True)
class _AutoCordon:
    """A cordon auto-cordon made, to be recorded with the rows."""

    node: str
    reason: str
    conditions: tuple[str, ...]


def _auto_cordon(
    views: list[NodeView], *, client: KubeClient
) -> tuple[list[NodeView], list[_AutoCordon], list[str]]:
    """Cordon the nodes whose GPU conditions turned True (see the module docstring): the
    views with what changed, the cordons made, and the cordons that failed."""
    if not settings.TAU_GPU_AUTO_CORDON:
        return views, [], []
    alerted = [view.name for view in views if view.gpu_alerts]
    seen = dict(GpuNode.objects.filter(name__in=alerted).values_list("name", "auto_cordon_seen"))
    result: list[NodeView] = []
    cordons: list[_AutoCordon] = []
    errors: list[str] = []
    for view in views:
        answered = set(seen.get(view.name) or ()) & view.gpu_alerts.keys()
        pending = [kind for kind in view.gpu_alerts if kind not in answered]
        if not pending or view.cordoned:
            result.append(view)
            continue
        reason = "auto-cordon: " + "; ".join(
            _true_since(view.gpu_alerts[kind], kind) for kind in pending
        )
        try:
            actions.cordon_in_cluster(view.name, client=client)
        except actions.NodeActionFailed as error:
            logger.warning("auto-cordon of %s failed: %s", view.name, error)
            errors.append(f"auto-cordon of {view.name} failed: {error}")
            result.append(view)
            continue
        cordons.append(_AutoCordon(view.name, reason, tuple(pending)))
        result.append(replace(view, cordoned=True))
    return result, cordons, errors


def _true_since(sentence: str, kind: str) -> str:
    """The problem sentence with the condition's status: ``XIDErrors True since 12:03 UTC:
    XID 79 — …`` (auto-cordon's reason)."""
    return kind + " True" + sentence[len(kind) :] if sentence.startswith(kind) else sentence


def _write(
    views: list[NodeView],
    *,
    source: str,
    now: datetime,
    started: float,
    cordons: Sequence[_AutoCordon] = (),
    notice: str = "",
) -> SyncResult:
    """Write the rows (only what changed), the audit events of auto-cordon's cordons and the
    FleetSync row, in one transaction."""
    with transaction.atomic():
        existing = {node.name: node for node in GpuNode.objects.all()}
        created: list[GpuNode] = []
        changed: list[GpuNode] = []
        changed_fields: set[str] = set()
        for view in views:
            row = existing.get(view.name)
            if row is None:
                created.append(_new_row(view, now))
                continue
            fields = _update_row(row, view, now)
            if fields:
                changed.append(row)
                changed_fields |= fields
        if created:
            GpuNode.objects.bulk_create(created)
        if changed:
            GpuNode.objects.bulk_update(changed, sorted(changed_fields | {"updated_at"}))
        listed = {view.name for view in views}
        gone = [name for name in existing if name not in listed]
        if gone:
            GpuNode.objects.filter(name__in=gone).delete()
        rows = {**existing, **{row.name: row for row in created}}
        for cordon in cordons:
            actions.record_node_action(
                rows[cordon.node],
                action=actions.AUTO_CORDON_ACTION,
                actor=None,
                reason=cordon.reason,
                cordoned=True,
                conditions=cordon.conditions,
            )
        took_ms = int((time.monotonic() - started) * 1000)
        _record_sync(
            source=source,
            last_attempt_at=now,
            last_success_at=now,
            last_error=notice,
            node_count=len(views),
            took_ms=took_ms,
        )
    return SyncResult(
        source=source,
        ok=True,
        error=notice,
        node_count=len(views),
        created=len(created),
        updated=len(changed),
        deleted=len(gone),
        cordoned=tuple(cordon.node for cordon in cordons),
        took_ms=took_ms,
    )


def _failed(source: str, message: str, *, now: datetime, started: float) -> SyncResult:
    """Record a sync that could not read the fleet; the rows stay as they were."""
    took_ms = int((time.monotonic() - started) * 1000)
    try:
        _record_sync(source=source, last_attempt_at=now, last_error=message, took_ms=took_ms)
    except Exception:  # the database is down too: the log is all there is
        logger.exception("could not record the failed fleet sync")
    return SyncResult(source=source, ok=False, error=message, took_ms=took_ms)


def _record_sync(**values: Any) -> None:
    """Update the one FleetSync row (one query), created by the first sync."""
    if not FleetSync.objects.filter(pk=1).update(**values):
        FleetSync.objects.create(pk=1, **values)


def _values(view: NodeView) -> dict[str, Any]:
    values = {name: getattr(view, name) for name in FIELDS_SYNCED if name != "flavor"}
    values["flavor_id"] = view.flavor.pk if view.flavor is not None else None
    return values


def _new_row(view: NodeView, now: datetime) -> GpuNode:
    row = GpuNode(
        name=view.name,
        first_seen_at=now,
        updated_at=now,
        unhealthy_since=None if view.healthy else (view.problems_since or now),
        auto_cordon_seen=_seen_after(view, []),
        **_values(view),
    )
    return row


def _update_row(row: GpuNode, view: NodeView, now: datetime) -> set[str]:
    """Set on ``row`` what differs from ``view``; the names of the fields that changed."""
    changed: set[str] = set()
    for attribute, value in _values(view).items():
        if getattr(row, attribute) != value:
            setattr(row, attribute, value)
            changed.add("flavor" if attribute == "flavor_id" else attribute)
    if view.healthy and row.unhealthy_since is not None:
        row.unhealthy_since = None
        changed.add("unhealthy_since")
    elif not view.healthy and row.unhealthy_since is None:
        row.unhealthy_since = now
        changed.add("unhealthy_since")
    seen = _seen_after(view, row.auto_cordon_seen)
    if seen != row.auto_cordon_seen:
        row.auto_cordon_seen = seen
        changed.add("auto_cordon_seen")
    if changed:
        row.updated_at = now
    return changed


def _seen_after(view: NodeView, before: object) -> list[str]:
    """The True GPU conditions auto-cordon has answered once this sync is written: the ones
    answered before that are still True, plus, when the node is cordoned (by auto-cordon just
    now, or already by someone), every True one; with the policy off, every True one (turning
    it on later acts on conditions that turn True after, not on old ones)."""
    answered = before if isinstance(before, list) else []
    still = [kind for kind in answered if kind in view.gpu_alerts]
    if view.cordoned or not settings.TAU_GPU_AUTO_CORDON:
        still += [kind for kind in view.gpu_alerts if kind not in still]
    return sorted(still)
