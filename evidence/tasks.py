"""Celery tasks for evidence. They only call services; they are safe to run twice."""

from __future__ import annotations

from celery import shared_task

from evidence import sealing, verification


@shared_task(name=sealing.SEAL_TASK, ignore_result=True, acks_late=True)
def seal(request_id: int) -> bool:
    return sealing.seal(request_id)


@shared_task(name=verification.VERIFY_TASK, ignore_result=True, acks_late=True)
def verify(record_id: int) -> bool:
    return verification.verify(record_id) == []


@shared_task(ignore_result=True)
def reconcile_seals() -> int:
    """Seal what a lost task, a broker outage or a crash while sealing left unsealed, and
    check the records whose check was lost."""
    sealed = 0
    for request_id in sealing.due_seals():
        sealed += sealing.seal(request_id)
    for record_id in verification.due_checks():
        verification.verify(record_id)
    return sealed
