"""Celery tasks for notifications. They only call the outbox and the waiting check; each is
safe to run twice. All of them go to the ``notifications`` queue (``CELERY_TASK_ROUTES``),
which a worker of its own consumes: nothing here ever waits in front of a run's hand-off."""

from __future__ import annotations

from celery import shared_task

from notifications import delivery, waiting

#: A send takes at most TAU_WEBHOOK_TIMEOUT_SECONDS (an e-mail, the SMTP timeout per step);
#: Celery's limits are only the last resort against a bug.
SEND_SOFT_TIME_LIMIT = 120
SEND_TIME_LIMIT = 150


@shared_task(
    name=delivery.SEND_TASK,
    ignore_result=True,
    acks_late=True,
    soft_time_limit=SEND_SOFT_TIME_LIMIT,
    time_limit=SEND_TIME_LIMIT,
)
def send_notification(delivery_id: int) -> bool:
    return delivery.deliver(delivery_id)


@shared_task(ignore_result=True)
def reconcile_notifications() -> int:
    """Publish what a lost task, a broker outage or a retry's backoff left in the outbox (one
    row per endpoint, within each workspace's share): the notifier's slots send them."""
    return delivery.publish_due()


@shared_task(ignore_result=True)
def notify_waiting() -> int:
    """``run.waiting`` for runs waiting longer than TAU_NOTIFY_WAITING_MINUTES."""
    return waiting.notify_waiting_runs()
