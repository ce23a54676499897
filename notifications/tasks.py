"""Celery tasks for notifications. They only call the outbox and the waiting check; each is
safe to run twice."""

from __future__ import annotations

from celery import shared_task

from notifications import delivery, waiting


@shared_task(name=delivery.SEND_TASK, ignore_result=True, acks_late=True)
def send_notification(delivery_id: int) -> bool:
    return delivery.deliver(delivery_id)


@shared_task(ignore_result=True)
def reconcile_notifications() -> int:
    """Send what a lost task, a broker outage or a retry's backoff left in the outbox."""
    sent = 0
    for delivery_id in delivery.due_deliveries():
        sent += delivery.deliver(delivery_id)
    return sent


@shared_task(ignore_result=True)
def notify_waiting() -> int:
    """``run.waiting`` for runs waiting longer than TAU_NOTIFY_WAITING_MINUTES."""
    return waiting.notify_waiting_runs()
