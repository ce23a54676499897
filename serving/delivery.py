"""The endpoints' outbox: every instruction a backend must act on reaches it through an
:class:`EndpointDelivery`, as a run's does (``runs.delivery``), on the claims, leases and
back-off every outbox shares (``portal.outbox``).

A change that needs the backend (a deployment, an update or a scale: ``deploy`` with the
endpoint's new generation; a stop or a delete: ``stop``) writes a delivery row in its own
transaction (``write_delivery``); after commit a Celery task is published to deliver it at
once, and the reconciler (Celery beat) delivers whatever a lost task or a down broker left
(``due_deliveries``). Backend calls are idempotent and generation-aware, so a delivery made
twice has the effect of one.

Delivering is three steps, so that no database lock or transaction is held while the backend
works: *claim* the row (a short transaction locking that row only), call the backend outside
any transaction holding the claim as a lease, and record the outcome. After
``TAU_DELIVERY_MAX_TRIES`` failed tries it gives up: an endpoint still being deployed fails,
with the backend's own message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial

from celery import current_app
from django.db import transaction
from django.utils import timezone

from portal.outbox import (
    Lease,
    Skip,
    Skipped,
    claim,
    due,
    once_on_commit,
    record_failure,
)
from runs.delivery import retries
from serving.backends import EndpointBackend, backend_for_endpoint
from serving.models import TRANSITIONS, Endpoint, EndpointDelivery, EndpointState
from serving.state import lock_endpoint, transition

logger = logging.getLogger(__name__)

#: The Celery task that delivers one row (``serving.tasks``), published by name.
DELIVER_TASK = "serving.tasks.deliver"


def write_delivery(*, endpoint: Endpoint, action: EndpointDelivery.Action) -> EndpointDelivery:
    """Record that the backend must be told, in the transaction of the change that needs it
    (the endpoint's row lock held, its new generation set); publish the task that tells it
    once that transaction has committed."""
    delivery = EndpointDelivery.objects.create(
        endpoint=endpoint, action=action, generation=endpoint.generation
    )
    once_on_commit(DELIVER_TASK, delivery.pk, publish)
    return delivery


def publish(delivery_id: int) -> None:
    """Ask a worker to deliver now. Failing is fine: the reconciler will deliver it."""
    try:
        current_app.send_task(DELIVER_TASK, args=(delivery_id,), retry=False)
    except Exception as exc:  # the broker is down: the outbox row is the durable record
        logger.warning(
            "could not enqueue endpoint delivery %s (%s); the reconciler will", delivery_id, exc
        )


def due_deliveries(*, grace_seconds: int = 5, limit: int = 200) -> list[int]:
    """Deliveries the reconciler should make now: not delivered, not given up, due, not
    claimed by a live worker, and older than a short grace period (so a task published right
    after commit gets its chance first)."""
    return due(
        EndpointDelivery.objects.unscoped().filter(
            delivered_at__isnull=True, given_up_at__isnull=True
        ),
        grace_seconds=grace_seconds,
        limit=limit,
    )


def deliver(
    delivery_id: int,
    *,
    backend_for: Callable[[Endpoint], EndpointBackend] = backend_for_endpoint,
) -> bool:
    """Hand one outbox row to the endpoint's backend. True if this call delivered it."""
    claimed = claim(EndpointDelivery.objects.unscoped(), delivery_id, settled=_settled)
    if isinstance(claimed, Skipped):
        word = claimed.detail if claimed.reason is Skip.SETTLED else claimed.reason.value
        logger.info("endpoint delivery %s skipped: %s", delivery_id, word)
        return False
    delivery = claimed
    assert delivery.claimed_at is not None
    rows = EndpointDelivery.objects.unscoped()
    with Lease(
        rows, delivery.pk, delivery.claimed_at, what=f"endpoint delivery {delivery.pk}"
    ) as lease:
        return _deliver_claimed(delivery, lease, backend_for)


def _settled(delivery: EndpointDelivery) -> str | None:
    if delivery.delivered_at is not None:
        return "delivered"
    if delivery.given_up_at is not None:
        return "given-up"
    return None


def _deliver_claimed(
    delivery: EndpointDelivery,
    lease: Lease,
    backend_for: Callable[[Endpoint], EndpointBackend],
) -> bool:
    endpoint = Endpoint.objects.unscoped().select_related("workspace").get(pk=delivery.endpoint_id)
    if delivery.action == EndpointDelivery.Action.DEPLOY and _superseded(endpoint, delivery):
        # A newer generation's deployment, or a stop, says what the backend must do now.
        logger.info(
            "endpoint delivery %s (deploy of %s generation %s) is not needed any more: the "
            "endpoint is %s at generation %s",
            delivery.pk,
            endpoint.name,
            delivery.generation,
            endpoint.state,
            endpoint.generation,
        )
        lease.release(delivered_at=timezone.now(), last_error="")
        return False
    try:
        backend = backend_for(endpoint)
        if delivery.action == EndpointDelivery.Action.DEPLOY:
            backend.deploy(endpoint)
        else:
            backend.stop(endpoint)
    except Exception as exc:
        _failed(delivery, lease, endpoint, exc)
        return False
    return lease.release(delivered_at=timezone.now(), last_error="")


def _superseded(endpoint: Endpoint, delivery: EndpointDelivery) -> bool:
    return (
        endpoint.generation > delivery.generation
        or endpoint.state == EndpointState.STOPPED
        or endpoint.deleted_at is not None
    )


def _failed(delivery: EndpointDelivery, lease: Lease, endpoint: Endpoint, exc: Exception) -> None:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    record_failure(
        lease,
        policy=retries(),
        tries=delivery.tries,
        error=error,
        what=f"endpoint delivery {delivery.pk} ({delivery.action} of {endpoint.name})",
        giving_up=partial(
            _give_up, delivery, lease, endpoint, message=str(exc) or type(exc).__name__, error=error
        ),
        exc_info=exc,
    )


@transaction.atomic
def _give_up(
    delivery: EndpointDelivery,
    lease: Lease,
    endpoint: Endpoint,
    now: datetime,
    *,
    message: str,
    error: str,
) -> None:
    """Never try this delivery again; an endpoint still waiting for that generation fails,
    saying what the backend said (in one transaction with closing the claim)."""
    given_up = lease.held().update(claimed_at=None, last_error=error, given_up_at=now)
    if not given_up:
        return
    locked = lock_endpoint(endpoint.pk)
    what = "deployed on" if delivery.action == EndpointDelivery.Action.DEPLOY else "stopped by"
    reason = (
        f"It could not be {what} the {locked.backend} backend ({delivery.tries} tries): {message}"
    )
    data = {
        "delivery": delivery.pk,
        "action": delivery.action,
        "generation": delivery.generation,
        "tries": delivery.tries,
    }
    current = EndpointState(locked.state)
    if locked.generation == delivery.generation and EndpointState.FAILED in TRANSITIONS[current]:
        transition(locked, EndpointState.FAILED, reason=reason, data=data)
    else:
        logger.error("%s (endpoint %s is %s)", reason, locked.name, locked.state)
