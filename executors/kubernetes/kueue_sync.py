"""The Kueue outbox: every change the cluster's Kueue objects must follow reaches it through a
:class:`~workspaces.models.KueueSync` row (only with ``TAU_BACKEND=kubernetes``; on the local
backend none of this runs and nothing is written).

Triggered durably
=================

A save or delete of a workspace, a quota row, a flavor, a cohort or a priority class — from
the admin, the API, a command or a script: the hook is on the models (``post_save`` /
``post_delete``, connected in ``KubernetesExecutorConfig.ready``) — calls :func:`request_sync` in
the transaction of the change. It writes a pending row for the workspace (by slug) or for the
cluster-wide objects, or reuses a pending row of the same target that no worker has claimed
(an admin save of a workspace with five quota rows is one sync, not six), and publishes the
Celery task ``executors.kubernetes.tasks.sync_kueue`` once that transaction has committed. Nothing
is lost when the broker is down or the task is: the reconciler (Celery beat,
``executors.kubernetes.tasks.reconcile_kueue_syncs`` every ``TAU_RECONCILE_SECONDS``) runs what is
due.

Running one (:func:`run_sync`) is three steps, as for run deliveries (``runs.delivery``):

1. *claim* the row in a short transaction that locks that row only (``SKIP LOCKED``);
2. sync against the cluster (``executors.kubernetes.kueue_cluster``), outside any transaction:
   Kubernetes is never called inside ``transaction.atomic``. The claim is a lease renewed while the
   sync runs (``portal.outbox.Lease``): if its worker dies (kill -9), it lapses within
   ``TAU_CLAIM_LEASE_SECONDS`` and the next reconcile takes the row over;
3. record the outcome in another short transaction, only if the claim is still this call's:
   ``synced`` (in step), ``waiting`` (an archived workspace's queues wait for live runs; tried
   again after ``TAU_KUEUE_SYNC_RETRY_SECONDS``), or the error in Kubernetes' own words —
   tried again with backoff (``TAU_KUEUE_SYNC_RETRY_SECONDS`` doubling up to
   ``TAU_KUEUE_SYNC_RETRY_MAX_SECONDS``, at most ``TAU_KUEUE_SYNC_MAX_TRIES`` tries) when
   retrying can help (no answer, a race), ``failed`` at once when it cannot (Kueue's webhook
   refused the object, RBAC said no, an object of that name is not TauGrid's).

A sync is idempotent (server-side apply; an apply that changes nothing is not written), so a
sync run twice — a re-delivered task, a claim taken over from a killed worker — has the
effect of one.

Drift
=====

Every ``TAU_KUEUE_DRIFT_SECONDS`` (Celery beat, ``executors.kubernetes.tasks.check_kueue_drift``)
:func:`check_drift` compares every workspace's objects and the cluster-wide ones with what
TauGrid renders, puts back what someone changed by hand (a ``kubectl edit`` of a quota, a
deleted LocalQueue), and writes one ``kueue.repaired`` audit event per object naming the
fields that differed (before: the live values, after: TauGrid's). Targets with a sync row not
finished yet are left to it. Queues of workspaces that no longer exist get a sync that
removes them.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model
from django.db.models.signals import post_delete, post_save, pre_save
from django.utils import timezone

from executors.kubernetes.kueue_cluster import (
    Outcome,
    Repair,
    SyncProblem,
    managed_workspace_slugs,
    sync_cluster,
    sync_workspace,
)
from kube import KubeClient
from portal import audit
from portal.outbox import (
    Lease,
    Retries,
    Skip,
    Skipped,
    claim,
    due,
    once_on_commit,
    record_failure,
)
from workspaces import kueue_coverage
from workspaces.models import (
    Cohort,
    KueueSync,
    PriorityClass,
    ResourceFlavor,
    Workspace,
    WorkspaceQuota,
)

logger = logging.getLogger(__name__)

#: The Celery task that runs one row (defined in ``executors.kubernetes.tasks``), published by name.
SYNC_TASK = "executors.kubernetes.tasks.sync_kueue"

Scope = KueueSync.Scope
State = KueueSync.State


def enabled() -> bool:
    """Kueue objects are TauGrid's business only on the Kubernetes backend."""
    return kueue_coverage.kueue_in_use()


# -- requesting a sync -------------------------------------------------------------------------


def request_sync(*, scope: str, workspace_slug: str = "", reason: str) -> KueueSync:
    """Record that ``scope`` (a workspace's objects, or the cluster-wide ones) must be brought
    in step, in the current transaction; publish the task once it has committed.

    A pending row of the same target that no worker has claimed yet is reused (and made due
    now); a claimed one is not, since its worker may have read the rows before this change.
    """
    slug = workspace_slug if scope == Scope.WORKSPACE else ""
    now = timezone.now()
    candidate = (
        KueueSync.objects.filter(
            scope=scope,
            workspace_slug=slug,
            state__in=[State.PENDING, State.WAITING],
            claimed_at__isnull=True,
        )
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )
    sync: KueueSync | None = None
    if candidate is not None:
        # The filter is evaluated again under the row lock: a claim that won the race since
        # the read above leaves this update with nothing to do, and a new row is written.
        reused = KueueSync.objects.filter(pk=candidate, claimed_at__isnull=True).update(
            state=State.PENDING, next_try_at=now, attempts=0, reason=reason[:200]
        )
        if reused:
            sync = KueueSync.objects.get(pk=candidate)
    if sync is None:
        sync = KueueSync.objects.create(
            scope=scope, workspace_slug=slug, reason=reason[:200], next_try_at=now
        )
    _publish_on_commit(sync.pk)
    return sync


def _publish_on_commit(sync_id: int) -> None:
    # Looked up when the transaction commits: tests replace ``publish``.
    once_on_commit(SYNC_TASK, sync_id, lambda pk: publish(pk))


def publish(sync_id: int) -> None:
    """Ask a worker to run the sync now. Failing is fine: the reconciler will."""
    try:
        current_app.send_task(SYNC_TASK, args=(sync_id,), retry=False)
    except Exception as exc:  # the broker is down: the row is the durable record
        logger.warning("could not enqueue Kueue sync %s (%s); the reconciler will", sync_id, exc)


def request_sync_now(*, workspace: Workspace, by: Any, **_signal: Any) -> KueueSync:
    """The admin's "Sync now" (``workspaces.signals.kueue_sync_requested``): a sync of the
    workspace and the cluster-wide objects it uses, audited."""
    with transaction.atomic():
        sync = request_sync(
            scope=Scope.WORKSPACE, workspace_slug=workspace.slug, reason="sync now (admin)"
        )
        request_sync(scope=Scope.CLUSTER, reason="sync now (admin)")
        audit.record(
            action="kueue.sync_requested",
            workspace=workspace,
            object_type="workspaces.workspace",
            object_id=str(workspace.pk),
            object_repr=str(workspace),
            actor=by,
        )
    return sync


def sync_missing(*, reason: str, client: KubeClient | None = None) -> list[str]:
    """Request a sync of every active workspace whose ClusterQueue this cluster does not have
    and that has no sync waiting to run, and of the cluster-wide objects with them; the slugs.
    Called when the watcher becomes the active one (``executors.kubernetes.watcher.serve``):
    workspaces made while the portal ran the local backend, or before it was pointed at this
    cluster, have never been synced to it, and would otherwise wait for the drift check. Nothing
    when the cluster does not answer (logged; the drift check puts them there later)."""
    if not enabled():
        return []
    try:
        present = managed_workspace_slugs(client)
    except SyncProblem as problem:
        logger.warning("workspaces not synced at start: %s", problem)
        return []
    waiting = set(
        KueueSync.objects.filter(
            scope=Scope.WORKSPACE, state__in=[State.PENDING, State.WAITING]
        ).values_list("workspace_slug", flat=True)
    )
    active = Workspace.unscoped_objects.filter(active=True).values_list("slug", flat=True)
    missing = sorted(set(active) - present - waiting)
    if missing:
        with transaction.atomic():
            request_sync(scope=Scope.CLUSTER, reason=reason)
            for slug in missing:
                request_sync(scope=Scope.WORKSPACE, workspace_slug=slug, reason=reason)
        logger.info("Kueue sync requested for %s: %s", ", ".join(missing), reason)
    return missing


# -- the model hooks ---------------------------------------------------------------------------


def _remember_name(sender: type[Model], instance: Model, **kwargs: Any) -> None:
    # The audit hook keeps the row as it was loaded, and replaces it once the save is
    # recorded: take the slug or name it had before this save now.
    loaded = getattr(instance, "_audit_loaded", None) or {}
    key = "slug" if isinstance(instance, Workspace) else "name"
    instance._kueue_previous_name = loaded.get(key)  # type: ignore[attr-defined]


def _renamed_from(instance: Model, current: str) -> str | None:
    previous = getattr(instance, "_kueue_previous_name", None)
    return previous if previous and previous != current else None


def _on_workspace_change(sender: type[Model], instance: Workspace, **kwargs: Any) -> None:
    if kwargs.get("raw") or not enabled():
        return
    deleted = "created" not in kwargs
    reason = "workspace deleted" if deleted else "workspace saved"
    request_sync(scope=Scope.WORKSPACE, workspace_slug=instance.slug, reason=reason)
    previous = _renamed_from(instance, instance.slug)
    if previous and not deleted:
        request_sync(scope=Scope.WORKSPACE, workspace_slug=previous, reason="workspace renamed")


def _on_quota_change(sender: type[Model], instance: WorkspaceQuota, **kwargs: Any) -> None:
    if kwargs.get("raw") or not enabled():
        return
    # Looked up by id: during a workspace's cascade delete its row is still there, and the
    # workspace's own delete asks for the sync that removes everything.
    slug = (
        Workspace.unscoped_objects.filter(pk=instance.workspace_id)
        .values_list("slug", flat=True)
        .first()
    )
    if slug:
        request_sync(scope=Scope.WORKSPACE, workspace_slug=slug, reason="quota changed")


def _on_platform_object_change(sender: type[Model], instance: Model, **kwargs: Any) -> None:
    if kwargs.get("raw") or not enabled():
        return
    what = sender._meta.verbose_name
    request_sync(scope=Scope.CLUSTER, reason=f"{what} changed")
    # A flavor or cohort is named in ClusterQueues: a renamed one changes those too.
    if isinstance(instance, ResourceFlavor | Cohort) and _renamed_from(instance, instance.name):
        if isinstance(instance, ResourceFlavor):
            users = Workspace.unscoped_objects.filter(quotas__flavor=instance)
        else:
            users = Workspace.unscoped_objects.filter(cohort=instance)
        for slug in users.values_list("slug", flat=True).distinct():
            request_sync(scope=Scope.WORKSPACE, workspace_slug=slug, reason=f"{what} renamed")


def connect_triggers() -> None:
    """Connect the model hooks (``WorkspacesConfig.ready``)."""
    renamable: tuple[type[Model], ...] = (Workspace, ResourceFlavor, Cohort)
    for model in renamable:
        pre_save.connect(_remember_name, sender=model, dispatch_uid=f"kueue-{model.__name__}-pre")
    for signal, suffix in ((post_save, "save"), (post_delete, "delete")):
        signal.connect(_on_workspace_change, sender=Workspace, dispatch_uid=f"kueue-ws-{suffix}")
        signal.connect(
            _on_quota_change, sender=WorkspaceQuota, dispatch_uid=f"kueue-quota-{suffix}"
        )
        platform: tuple[type[Model], ...] = (ResourceFlavor, Cohort, PriorityClass)
        for platform_model in platform:
            signal.connect(
                _on_platform_object_change,
                sender=platform_model,
                dispatch_uid=f"kueue-{platform_model.__name__}-{suffix}",
            )


# -- running one -------------------------------------------------------------------------------


def retries() -> Retries:
    """Doubling from TAU_KUEUE_SYNC_RETRY_SECONDS, at most TAU_KUEUE_SYNC_RETRY_MAX_SECONDS,
    and TAU_KUEUE_SYNC_MAX_TRIES tries (then the sync is failed, on the admin's page)."""
    return Retries(
        first_seconds=int(settings.TAU_KUEUE_SYNC_RETRY_SECONDS),
        max_seconds=int(settings.TAU_KUEUE_SYNC_RETRY_MAX_SECONDS),
        max_tries=int(settings.TAU_KUEUE_SYNC_MAX_TRIES),
    )


def retry_delay(tries: int) -> timedelta:
    """The wait after the ``tries``-th failed try."""
    return retries().delay(tries)


def due_syncs(*, grace_seconds: int = 5, limit: int = 200) -> list[int]:
    """Rows the reconciler should run now: pending or waiting, due, not claimed by a live
    worker, and older than a short grace (the task published at commit gets its chance)."""
    return due(
        KueueSync.objects.filter(state__in=[State.PENDING, State.WAITING]),
        grace_seconds=grace_seconds,
        limit=limit,
    )


def run_sync(sync_id: int) -> bool:
    """Run one row. True if this call brought its target in step (or waiting, as it should)."""
    if not enabled():
        return False
    if connection.in_atomic_block:
        # The rule the outbox exists for: no Kubernetes call while a transaction holds locks.
        raise RuntimeError("a Kueue sync calls Kubernetes: run it outside any transaction")
    claimed = _claim(sync_id)
    if isinstance(claimed, str):
        logger.info("Kueue sync %s skipped: %s", sync_id, claimed)
        return False
    sync = claimed
    assert sync.claimed_at is not None
    rows = KueueSync.objects.all()
    with Lease(rows, sync.pk, sync.claimed_at, what=f"Kueue sync {sync.pk}") as lease:
        try:
            outcome = _sync_target(sync.scope, sync.workspace_slug)
        except SyncProblem as problem:
            _failed(sync, lease, problem)
            return False
        except Exception as exc:  # a bug must not leave the row claimed until the claim lapses
            _failed(sync, lease, SyncProblem(f"{type(exc).__name__}: {exc}", retry=True), exc)
            return False
        return _succeeded(sync, lease, outcome)


def _sync_target(scope: str, slug: str, *, repair: bool = False) -> Outcome:
    if scope == Scope.CLUSTER:
        return sync_cluster(repair=repair)
    return sync_workspace(slug, repair=repair)


def _claim(sync_id: int) -> KueueSync | str:
    """The row, claimed for this call (its try counted), or why it cannot be."""
    claimed = claim(KueueSync.objects.all(), sync_id, settled=_settled, tries="attempts")
    if isinstance(claimed, Skipped):
        return claimed.detail or _SKIP_WORDS[claimed.reason]
    return claimed


_SKIP_WORDS = {
    Skip.LOCKED: "another worker is claiming it",
    Skip.MISSING: "there is no such sync",
    Skip.IN_PROGRESS: "another worker is running it",
    Skip.NOT_DUE: "it waits to be tried again",
}


def _settled(sync: KueueSync) -> str | None:
    return None if sync.unfinished else f"it is {sync.get_state_display().lower()} already"


def _close(lease: Lease, **fields: Any) -> bool:
    """Record this call's outcome, if the claim is still its own (False: it lapsed and another
    worker took the row over; that worker records the outcome)."""
    return lease.release(**fields)


def _succeeded(sync: KueueSync, lease: Lease, outcome: Outcome) -> bool:
    now = timezone.now()
    lease.stop()  # before the transaction: no renewal moves the claim under it
    with transaction.atomic():
        if outcome.waiting_for:
            return _close(
                lease,
                state=State.WAITING,
                attempts=0,
                next_try_at=now + retry_delay(1),
                last_error="",
                detail=outcome.detail,
            )
        closed = _close(
            lease, state=State.SYNCED, synced_at=now, last_error="", detail=outcome.detail
        )
        if closed:
            _audit_removals(sync, outcome)
        return closed


def _failed(
    sync: KueueSync, lease: Lease, problem: SyncProblem, exc: Exception | None = None
) -> None:
    record_failure(
        lease,
        policy=retries(),
        tries=sync.attempts,
        error=problem.message[:4000],
        what=f"Kueue sync {sync.pk} ({sync})",
        retry=problem.retry,
        retrying={"state": State.PENDING},
        giving_up={"state": State.FAILED},
        exc_info=exc,
    )


def _workspace(slug: str) -> Workspace | None:
    return Workspace.unscoped_objects.filter(slug=slug).first() if slug else None


def _audit_removals(sync: KueueSync, outcome: Outcome) -> None:
    if not outcome.removed:
        return
    workspace = _workspace(sync.workspace_slug)
    for removed in outcome.removed:
        audit.record(
            action="kueue.removed",
            workspace=workspace,
            object_type="kueue",
            object_id=removed[:64],
            object_repr=removed,
            before={"object": removed},
            after=None,
        )


# -- reconciling and drift ---------------------------------------------------------------------


def reconcile() -> int:
    """Run every due row (a lost task, a broker outage, a killed worker, a waiting archive)."""
    if not enabled():
        return 0
    return sum(run_sync(sync_id) for sync_id in due_syncs())


def check_drift() -> int:
    """Compare every target's live objects with what TauGrid renders and put back what was
    changed by hand (audited). Returns how many objects were repaired."""
    if not enabled():
        return 0
    if connection.in_atomic_block:
        raise RuntimeError("the drift check calls Kubernetes: run it outside any transaction")
    targets: list[tuple[str, str]] = [(Scope.CLUSTER, "")]
    slugs = set(Workspace.unscoped_objects.values_list("slug", flat=True))
    targets += [(Scope.WORKSPACE, slug) for slug in sorted(slugs)]
    repaired = 0
    for scope, slug in targets:
        repaired += _check_one(scope, slug)
    # Queues of workspaces that are gone (deleted while the cluster was unreachable, say).
    try:
        orphans = managed_workspace_slugs() - slugs
    except SyncProblem as problem:
        logger.warning("drift check: %s", problem)
        orphans = set()
    for slug in sorted(orphans):
        if not KueueSync.objects.filter(
            scope=Scope.WORKSPACE, workspace_slug=slug, state__in=[State.PENDING, State.WAITING]
        ).exists():
            with transaction.atomic():
                request_sync(
                    scope=Scope.WORKSPACE, workspace_slug=slug, reason="queues of a gone workspace"
                )
    return repaired


def _check_one(scope: str, slug: str) -> int:
    latest = KueueSync.latest(scope, slug)
    if latest is not None and latest.unfinished:
        return 0  # a sync is on its way; it will bring the target in step
    try:
        outcome = _sync_target(scope, slug, repair=True)
    except SyncProblem as problem:
        if latest is None or latest.state == State.SYNCED:
            # It was in step and is not any more: say so where the admin looks, and let the
            # outbox try again with backoff (or not, when trying cannot help).
            KueueSync.objects.create(
                scope=scope,
                workspace_slug=slug,
                reason="drift check",
                state=State.PENDING if problem.retry else State.FAILED,
                attempts=1,
                next_try_at=timezone.now() + retry_delay(1),
                last_error=problem.message[:4000],
            )
        logger.warning("drift check of %s %s: %s", scope, slug or "-", problem)
        return 0
    with transaction.atomic():
        _audit_repairs(outcome.repairs, slug)
        if latest is None or latest.state != State.SYNCED or outcome.waiting_for:
            now = timezone.now()
            KueueSync.objects.create(
                scope=scope,
                workspace_slug=slug,
                reason="drift check",
                state=State.WAITING if outcome.waiting_for else State.SYNCED,
                attempts=1,
                next_try_at=now + retry_delay(1),
                synced_at=None if outcome.waiting_for else now,
                detail=outcome.detail,
            )
        elif outcome.repairs:
            KueueSync.objects.filter(pk=latest.pk).update(detail=outcome.detail)
    return len(outcome.repairs)


def _audit_repairs(repairs: list[Repair], slug: str) -> None:
    workspace = _workspace(slug)
    for repair in repairs:
        audit.record(
            action="kueue.repaired",
            workspace=workspace if repair.workspace_slug else None,
            object_type=f"kueue.{repair.kind}",
            object_id=repair.name[:64],
            object_repr=repair.ref,
            before={difference.path: difference.live for difference in repair.differences},
            after={difference.path: difference.desired for difference in repair.differences},
        )
