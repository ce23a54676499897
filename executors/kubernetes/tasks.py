"""Celery tasks that keep Kueue in step with the workspaces (``executors.kubernetes.kueue_sync``).
They only call the outbox's functions and are safe to run twice; on the local backend they do
nothing."""

from __future__ import annotations

from celery import shared_task

from executors.kubernetes import kueue_sync


@shared_task(name=kueue_sync.SYNC_TASK, ignore_result=True, acks_late=True)
def sync_kueue(sync_id: int) -> bool:
    return kueue_sync.run_sync(sync_id)


@shared_task(ignore_result=True)
def reconcile_kueue_syncs() -> int:
    """Run the syncs a lost task, a broker outage or a killed worker left behind, and retry
    the waiting and failed-for-now ones that are due."""
    return kueue_sync.reconcile()


@shared_task(ignore_result=True)
def check_kueue_drift() -> int:
    """Put back Kueue objects someone changed by hand (audited as ``kueue.repaired``)."""
    return kueue_sync.check_drift()
