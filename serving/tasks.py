"""Celery tasks for endpoints. They only call services; they are safe to run twice."""

from __future__ import annotations

from celery import shared_task

from serving import delivery


@shared_task(name=delivery.DELIVER_TASK, ignore_result=True, acks_late=True)
def deliver(delivery_id: int) -> bool:
    return delivery.deliver(delivery_id)


@shared_task(ignore_result=True)
def reconcile_deliveries() -> int:
    """Deliver what a lost task or a broker outage left in the endpoints' outbox."""
    delivered = 0
    for delivery_id in delivery.due_deliveries():
        delivered += delivery.deliver(delivery_id)
    return delivered
