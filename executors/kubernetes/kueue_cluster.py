"""One sync against the cluster: bring Kueue's objects for one workspace, or the cluster-wide
ones, in step with the database (the outbox in ``executors.kubernetes.kueue_sync`` calls this).

It reads the rows first (plain queries, no transaction held) and then talks to Kubernetes
through :mod:`kube` only; it writes nothing to the database: what happened comes back as an
:class:`Outcome` (applied, removed, repaired), or a :class:`SyncProblem` with Kubernetes' own
message. The caller records it.

Rules, in the order they are applied
====================================

1. **Look before touching.** Every object the sync would write is read first. A ClusterQueue
   or LocalQueue of the same name without TauGrid's managed-by label is someone else's: the
   sync stops with a :class:`SyncProblem` naming it and changes nothing. Cluster-wide objects
   (flavors, cohorts, priority classes) that exist without the label are *used as they are*:
   the ClusterQueue refers to them by name, and they are never changed or deleted. A namespace
   that exists without TauGrid's created-by annotation is used and only labelled.
2. **Kueue judges first.** The ClusterQueue is sent as a server-side dry run before anything
   is written: Kueue's webhooks run on a dry run too, so a refusal (say, a lending limit above
   the nominal quota written by a script past the model's checks) leaves every object exactly
   as it was, and the refusal, in Kueue's words, is the sync's error.
3. **Then apply**, with server-side apply (field manager ``taugrid``): the flavors, cohort
   chain and priority classes the workspace uses, the ClusterQueue, the namespace, the
   LocalQueue. An apply that changes nothing is not written, so a second sync changes nothing
   (no ``resourceVersion`` moves).
4. **Remove what is stale, and only TauGrid's**: ClusterQueues and LocalQueues labelled for the
   workspace that it no longer renders (a renamed queue, a deleted workspace), and
   cluster-wide objects labelled managed-by taugrid that no row renders any more and nothing
   uses (a flavor still named by any ClusterQueue, a cohort still joined or parented, stays).
   A queue with workloads in it is never removed: see *Archiving*.

Repair mode (the drift check) reads every object, compares it with what TauGrid renders
(:func:`executors.kubernetes.kueue.differences`) and applies only those that differ, reporting each
as a :class:`Repair` naming the fields someone changed.

Archiving
=========

An inactive workspace accepts no new runs; its LocalQueue and ClusterQueue are removed once no
run is live. "Live" is asked twice: Kueue's own queue status (``pendingWorkloads`` plus
``reservingWorkloads`` of the ClusterQueue and the LocalQueue), and every check registered
with :func:`register_live_work_check` — a higher app (the run core) registers one in its
``AppConfig.ready`` that counts the workspace's runs that are not finished, since a run that
Kueue has not seen yet (just submitted) or no longer sees (being cleaned up) is still live to
TauGrid. Until both say none, the queues stay as they are and the sync says "waiting for N
live runs" (:attr:`Outcome.waiting_for`); the outbox tries again later. The namespace stays
(it holds the runs' records); a namespace TauGrid created is deleted only with the workspace
itself, and one it did not create never is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from executors.kubernetes.kueue import (
    CREATED_BY_ANNOTATION,
    KUEUE_API,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    WORKSPACE_LABEL,
    Body,
    Difference,
    cluster_objects,
    cohort_object,
    created_by_taugrid,
    describe,
    differences,
    is_another_installations,
    is_managed,
    not_ours,
    resource_flavor_object,
    workload_priority_class_object,
    workspace_objects,
)
from kube import (
    Conflict,
    KubeClient,
    KubeError,
    NotFound,
    Unavailable,
    UnknownKind,
)
from kube import client as shared_client
from workspaces.models import (
    Cohort,
    PriorityClass,
    ResourceFlavor,
    Workspace,
    WorkspaceQuota,
    cluster_queue_name,
)

logger = logging.getLogger(__name__)

MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

#: Counts a workspace's live runs (not finished) as the app that owns runs sees them.
LiveWorkCheck = Callable[[Workspace], int]
_live_work_checks: list[LiveWorkCheck] = []


def register_live_work_check(check: LiveWorkCheck) -> None:
    """Let a higher app say how many of a workspace's runs are live, so that archiving waits
    for them (call it from ``AppConfig.ready``; registering the same function twice counts
    it once). The workspaces app cannot ask the run core itself: it sits below it."""
    if check not in _live_work_checks:
        _live_work_checks.append(check)


def unregister_live_work_check(check: LiveWorkCheck) -> None:
    if check in _live_work_checks:
        _live_work_checks.remove(check)


def live_runs(workspace: Workspace) -> int:
    """Live runs of ``workspace`` by every registered check (the largest count)."""
    return max((int(check(workspace)) for check in _live_work_checks), default=0)


class SyncProblem(Exception):
    """The sync could not finish; ``message`` says why for people (Kubernetes' own words where
    it answered); ``retry``: whether trying again later may help without anyone acting."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retry = retry

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Repair:
    """An object the drift check found changed (or missing) and put back."""

    api_version: str
    kind: str
    name: str
    namespace: str | None
    workspace_slug: str | None
    differences: tuple[Difference, ...]

    @property
    def ref(self) -> str:
        return (
            f"{self.kind} {self.namespace}/{self.name}"
            if self.namespace
            else (f"{self.kind} {self.name}")
        )

    @property
    def fields(self) -> list[str]:
        return [difference.path for difference in self.differences]


@dataclass
class Outcome:
    """What one sync did. ``waiting_for`` > 0: an archived workspace's queues wait for that
    many live runs."""

    applied: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    waiting_for: int = 0

    @property
    def detail(self) -> str:
        parts = []
        if self.waiting_for:
            parts.append(
                f"Waiting for {self.waiting_for} live run{'s' if self.waiting_for != 1 else ''} "
                "before the queues are removed."
            )
        if self.applied:
            parts.append(f"Changed: {', '.join(self.applied)}.")
        if self.removed:
            parts.append(f"Removed: {', '.join(self.removed)}.")
        if self.repairs:
            parts.append(
                "Put back after a change by hand: "
                + "; ".join(f"{r.ref} ({', '.join(r.fields)})" for r in self.repairs)
                + "."
            )
        parts.extend(self.notes)
        if not parts:
            parts.append("Nothing to change.")
        return " ".join(parts)


# -- talking to the cluster --------------------------------------------------------------------


def _problem(what: str, exc: KubeError) -> SyncProblem:
    # Worth retrying unattended: no answer, a race, a kind not served yet (Kueue starting).
    # Not: a refusal of the object (Invalid, a webhook), RBAC, no configuration.
    retry = isinstance(exc, Unavailable | Conflict | NotFound | UnknownKind)
    return SyncProblem(f"{what}: {exc.message}", retry=retry)


class _Cluster:
    """The calls a sync makes, each failure named after the object it was about."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Body | None:
        what = f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"
        try:
            return self.client.get(api_version, kind, name, namespace)
        except NotFound:
            return None
        except KubeError as exc:
            raise _problem(f"reading {what}", exc) from exc

    def list(self, api_version: str, kind: str, *, label_selector: str) -> list[Body]:
        try:
            return self.client.list(api_version, kind, label_selector=label_selector)
        except KubeError as exc:
            raise _problem(f"listing {kind}s", exc) from exc

    def apply(self, body: Mapping[str, Any], *, dry_run: bool = False) -> Body:
        try:
            return self.client.apply(body, dry_run=dry_run)
        except KubeError as exc:
            raise _problem(describe(body), exc) from exc

    def delete(self, live: Mapping[str, Any]) -> None:
        metadata = live.get("metadata") or {}
        try:
            self.client.delete(
                str(live["apiVersion"]),
                str(live["kind"]),
                str(metadata["name"]),
                metadata.get("namespace"),
                missing_ok=True,
            )
        except KubeError as exc:
            raise _problem(f"deleting {describe(live)}", exc) from exc


def _get_like(cluster: _Cluster, body: Mapping[str, Any]) -> Body | None:
    metadata = body["metadata"]
    return cluster.get(
        body["apiVersion"], body["kind"], metadata["name"], metadata.get("namespace")
    )


def _resource_version(obj: Mapping[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def _being_deleted(obj: Mapping[str, Any]) -> bool:
    """Asked to go already (a ClusterQueue waits for Kueue's finalizer): not again."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _workloads_in(queue: Mapping[str, Any] | None) -> int:
    """Workloads a ClusterQueue or LocalQueue holds, by its status: waiting or holding quota."""
    status = (queue or {}).get("status") or {}
    return int(status.get("pendingWorkloads") or 0) + int(status.get("reservingWorkloads") or 0)


def _put(
    cluster: _Cluster,
    outcome: Outcome,
    desired: Body,
    live: Body | None,
    *,
    repair: bool,
    workspace_slug: str | None,
) -> None:
    """Apply ``desired`` over ``live``: always in a normal sync (a no-op apply writes nothing,
    and it also drops fields TauGrid stopped rendering), only when it differs in repair mode."""
    found = differences(desired, live)
    if repair and not found:
        outcome.unchanged += 1
        return
    stored = cluster.apply(desired)
    if repair:
        metadata = desired["metadata"]
        outcome.repairs.append(
            Repair(
                api_version=desired["apiVersion"],
                kind=desired["kind"],
                name=metadata["name"],
                namespace=metadata.get("namespace"),
                workspace_slug=workspace_slug,
                differences=tuple(found),
            )
        )
    elif live is None or _resource_version(stored) != _resource_version(live):
        outcome.applied.append(describe(desired))
    else:
        outcome.unchanged += 1


# -- one workspace -----------------------------------------------------------------------------


@dataclass
class _WorkspaceRows:
    workspace: Workspace
    quotas: list[WorkspaceQuota]
    dependencies: list[Body]


def _load_workspace(slug: str) -> _WorkspaceRows | None:
    workspace = (
        Workspace.unscoped_objects.select_related("cohort", "cohort__parent")
        .filter(slug=slug)
        .first()
    )
    if workspace is None:
        return None
    quotas = list(
        WorkspaceQuota.objects.for_workspace(workspace)
        .select_related("flavor")
        .order_by("flavor__name", "resource")
    )
    flavors = {quota.flavor.name: quota.flavor for quota in quotas}
    dependencies = [resource_flavor_object(flavor) for _, flavor in sorted(flavors.items())]
    chain: list[Cohort] = []
    cohort = workspace.cohort
    while cohort is not None and cohort not in chain:
        chain.append(cohort)
        cohort = (
            Cohort.objects.select_related("parent").filter(pk=cohort.parent_id).first()
            if cohort.parent_id is not None
            else None
        )
    dependencies += [cohort_object(cohort) for cohort in reversed(chain)]
    allowed = [name for name in workspace.allowed_priorities or [] if isinstance(name, str)]
    dependencies += [
        workload_priority_class_object(priority_class)
        for priority_class in PriorityClass.objects.filter(name__in=allowed).order_by("name")
    ]
    return _WorkspaceRows(workspace, quotas, dependencies)


def sync_workspace(slug: str, *, repair: bool = False, client: KubeClient | None = None) -> Outcome:
    """Bring the Kueue objects of workspace ``slug`` in step with its rows (or remove them if
    the workspace is gone). ``repair``: the drift check (see the module docstring)."""
    cluster = _Cluster(client or shared_client())
    rows = _load_workspace(slug)
    if rows is None:
        return _remove_workspace(cluster, slug)
    workspace = rows.workspace
    outcome = Outcome()

    namespace_live = cluster.get("v1", "Namespace", workspace.namespace)
    cq_desired, namespace_desired, lq_desired = workspace_objects(
        workspace,
        rows.quotas,
        namespace_created_by_taugrid=namespace_live is None or created_by_taugrid(namespace_live),
    )
    cq_live = _get_like(cluster, cq_desired)
    lq_live = _get_like(cluster, lq_desired) if namespace_live is not None else None
    if is_another_installations(namespace_live):
        assert namespace_live is not None
        raise SyncProblem(
            f"{describe(namespace_desired)} is another TauGrid installation's "
            f"({not_ours(namespace_live)}), so this one leaves it alone: give the workspace "
            "a namespace of its own.",
            retry=False,
        )
    for desired, live in ((cq_desired, cq_live), (lq_desired, lq_live)):
        if live is not None and not is_managed(live):
            raise SyncProblem(
                f"{describe(desired)} exists and is not this installation's ({not_ours(live)}), "
                "so TauGrid leaves it alone: remove it, give the workspace another name for "
                "it, or label it to hand it over.",
                retry=False,
            )

    if not workspace.active:
        waiting = max(_workloads_in(cq_live), _workloads_in(lq_live), live_runs(workspace))
        if not waiting:
            for live in (lq_live, cq_live):
                if live is not None and not _being_deleted(live):
                    cluster.delete(live)
                    outcome.removed.append(describe(live))
            _remove_stale_queues(cluster, outcome, slug, keep=set())
            outcome.notes.append("The workspace is archived: it has no queues.")
            return outcome
        outcome.waiting_for = waiting

    if not repair or differences(cq_desired, cq_live):
        cluster.apply(cq_desired, dry_run=True)  # Kueue's webhook judges it before any write

    for dependency in rows.dependencies:
        live = _get_like(cluster, dependency)
        if live is not None and not is_managed(live):
            continue  # someone else's: used as it is
        _put(cluster, outcome, dependency, live, repair=repair, workspace_slug=None)
    _put(cluster, outcome, cq_desired, cq_live, repair=repair, workspace_slug=slug)
    _put(cluster, outcome, namespace_desired, namespace_live, repair=repair, workspace_slug=slug)
    _put(cluster, outcome, lq_desired, lq_live, repair=repair, workspace_slug=slug)
    _remove_stale_queues(
        cluster,
        outcome,
        slug,
        keep={describe(cq_desired), describe(lq_desired)},
    )
    return outcome


def _remove_stale_queues(cluster: _Cluster, outcome: Outcome, slug: str, *, keep: set[str]) -> int:
    """Remove TauGrid's queues labelled for ``slug`` other than ``keep``, unless workloads are
    in them. Returns how many workloads hold up the ones that stay."""
    selector = f"{MANAGED_SELECTOR},{WORKSPACE_LABEL}={slug}"
    held = 0
    # LocalQueues before their ClusterQueues: the ClusterQueue is the last to go.
    for kind in ("LocalQueue", "ClusterQueue"):
        for live in cluster.list(KUEUE_API, kind, label_selector=selector):
            if not is_managed(live) or describe(live) in keep or _being_deleted(live):
                continue  # another installation's, kept, or going already
            workloads = _workloads_in(live)
            if workloads:
                held += workloads
                outcome.notes.append(
                    f"{describe(live)} is no longer used but holds {workloads} workload(s); "
                    "it is removed once they are done."
                )
                continue
            cluster.delete(live)
            outcome.removed.append(describe(live))
    return held


def _remove_workspace(cluster: _Cluster, slug: str) -> Outcome:
    """The workspace row is gone: remove its queues (once empty) and the namespace TauGrid
    created for it; a namespace it did not create loses TauGrid's label only."""
    outcome = Outcome()
    held = _remove_stale_queues(cluster, outcome, slug, keep=set())
    if held:
        outcome.waiting_for = held
        return outcome
    in_use = set(Workspace.unscoped_objects.values_list("namespace", flat=True))
    for namespace in cluster.list("v1", "Namespace", label_selector=f"{WORKSPACE_LABEL}={slug}"):
        name = namespace["metadata"]["name"]
        if is_another_installations(namespace):
            continue  # another installation's workspace of the same name
        if name in in_use:
            continue  # another workspace (this one renamed) uses it: its sync labels it
        if _being_deleted(namespace):
            continue
        if is_managed(namespace) and created_by_taugrid(namespace):
            cluster.delete(namespace)
            outcome.removed.append(describe(namespace))
        else:
            # Apply nothing as "taugrid": Kubernetes drops the label TauGrid owned.
            cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            outcome.applied.append(f"Namespace {name} (TauGrid's label removed)")
    return outcome


# -- cluster-wide ------------------------------------------------------------------------------


#: Cluster-wide kinds TauGrid renders, in the order stale ones are removed.
CLUSTER_KINDS = ("WorkloadPriorityClass", "Cohort", "ResourceFlavor")


def sync_cluster(*, repair: bool = False, client: KubeClient | None = None) -> Outcome:
    """Bring the cluster-wide objects (flavors, cohorts, priority classes) in step with their
    rows, and remove TauGrid's that no row renders any more once nothing uses them."""
    cluster = _Cluster(client or shared_client())
    desired = cluster_objects(
        ResourceFlavor.objects.all(),
        Cohort.objects.select_related("parent"),
        PriorityClass.objects.all(),
    )
    outcome = Outcome()
    foreign = []
    for body in desired:
        live = _get_like(cluster, body)
        if live is not None and not is_managed(live):
            foreign.append(describe(body))
            continue
        _put(cluster, outcome, body, live, repair=repair, workspace_slug=None)
    if foreign:
        outcome.notes.append(
            f"Used as they are (not this installation's, never changed): {', '.join(foreign)}."
        )

    rendered = {(body["kind"], body["metadata"]["name"]) for body in desired}
    stale = {
        kind: [
            live
            for live in cluster.list(KUEUE_API, kind, label_selector=MANAGED_SELECTOR)
            if is_managed(live) and (kind, live["metadata"]["name"]) not in rendered
        ]
        for kind in CLUSTER_KINDS
    }
    if not any(stale.values()):
        return outcome
    users = _users_of_cluster_objects(cluster)
    for kind in CLUSTER_KINDS:
        for live in stale[kind]:
            name = live["metadata"]["name"]
            if _being_deleted(live):
                continue
            using = sorted(users.get((kind, name), ()))
            if using:
                outcome.notes.append(
                    f"{kind} {name} has no row any more but {', '.join(using)} still use(s) "
                    "it; it is removed once nothing does."
                )
                continue
            cluster.delete(live)
            outcome.removed.append(f"{kind} {name}")
    return outcome


def _users_of_cluster_objects(cluster: _Cluster) -> dict[tuple[str, str], set[str]]:
    """Which ClusterQueues and Cohorts (anyone's) name each flavor and cohort."""
    users: dict[tuple[str, str], set[str]] = {}

    def used(kind: str, name: str, by: str) -> None:
        users.setdefault((kind, name), set()).add(by)

    for queue in _all(cluster, "ClusterQueue"):
        spec = queue.get("spec") or {}
        by = describe(queue)
        for group in spec.get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                used("ResourceFlavor", str(flavor.get("name")), by)
        if spec.get("cohortName"):
            used("Cohort", str(spec["cohortName"]), by)
    for cohort in _all(cluster, "Cohort"):
        parent = (cohort.get("spec") or {}).get("parentName")
        if parent:
            used("Cohort", str(parent), describe(cohort))
    return users


def _all(cluster: _Cluster, kind: str) -> Iterable[Body]:
    try:
        return cluster.client.list(KUEUE_API, kind)
    except KubeError as exc:
        raise _problem(f"listing {kind}s", exc) from exc


def managed_workspace_slugs(client: KubeClient | None = None) -> set[str]:
    """Slugs named by TauGrid's ClusterQueues in the cluster (the drift check looks for
    workspaces that are gone but whose queues are not)."""
    cluster = _Cluster(client or shared_client())
    return {
        str((queue["metadata"].get("labels") or {}).get(WORKSPACE_LABEL))
        for queue in cluster.list(
            KUEUE_API, "ClusterQueue", label_selector=f"{MANAGED_SELECTOR},{WORKSPACE_LABEL}"
        )
        if is_managed(queue)
    }


__all__ = [
    "CREATED_BY_ANNOTATION",
    "LiveWorkCheck",
    "Outcome",
    "Repair",
    "SyncProblem",
    "cluster_queue_name",
    "live_runs",
    "managed_workspace_slugs",
    "register_live_work_check",
    "sync_cluster",
    "sync_workspace",
    "unregister_live_work_check",
]
