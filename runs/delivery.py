"""The outbox: every change a backend must act on reaches it through a :class:`Delivery`.

A change that needs the backend (a submission, a retry, a resume: ``submit`` with the new
attempt; a cancel: ``cancel``) writes a delivery row in its own transaction
(``write_delivery``); after commit a Celery task is published to deliver it at once, and the
reconciler (Celery beat) delivers whatever a lost task or a down broker left behind
(``due_deliveries``). Backend calls are idempotent, so a delivery made twice has the effect
of one.

Delivering is three steps, so that no database lock or transaction is held while the backend
works (a slow or hanging cluster must not hold up the portal):

1. *claim* the row in a short transaction that locks that row only (``FOR UPDATE SKIP
   LOCKED OF`` the delivery, never the run or the workspace): one worker at a time calls
   the backend for it;
2. call the backend, outside any transaction, holding the claim as a lease
   (``portal.outbox.Lease``) renewed while the call runs: a worker killed meanwhile leaves a
   claim that lapses within ``TAU_CLAIM_LEASE_SECONDS``, and the reconciler delivers the row
   at its next pass (a submission waits about half a minute, not the task time limit);
3. record the outcome, only if the claim is still this call's: delivered, or the error and
   when to try again (exponential backoff, ``TAU_DELIVERY_RETRY_SECONDS`` doubling up to
   ``TAU_DELIVERY_RETRY_MAX_SECONDS``). After ``TAU_DELIVERY_MAX_TRIES`` failed tries it gives
   up: the run fails with class ``infrastructure`` and the backend's own message, and the
   delivery is never tried again.

A call that delivers nothing says why, in the log and in a counter per reason
(``skipped_counts``): a delivery never waits for the reconciler silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial

from celery import current_app
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from portal.outbox import (
    Lease,
    Retries,
    Skip,
    Skipped,
    claim,
    due,
    record_failure,
)
from runs.backends import RunBackend
from runs.backends.registry import backend_for_run
from runs.events import append_event
from runs.models import (
    LIVE_STATES,
    TERMINAL_STATES,
    Delivery,
    EventKind,
    FailureClass,
    Run,
    RunAttempt,
    RunState,
)
from runs.state import lock_run, transition

logger = logging.getLogger(__name__)

#: The Celery task that delivers one row (defined in ``runs.tasks``); published by name, so
#: the core does not import the task module that calls it.
DELIVER_TASK = "runs.tasks.deliver"
SKIPPED_COUNTER = "runs:deliveries-skipped:"
SKIP_REASONS = ("locked", "in-progress", "not-due", "delivered", "given-up", "missing")


def write_delivery(
    *, run: Run, action: Delivery.Action, attempt: RunAttempt | None = None
) -> Delivery:
    """Record that the backend must be told, in the transaction of the change that needs it;
    publish the task that tells it once that transaction has committed. A retry that waits
    out its backoff (``run.not_before``) is not due before then: the task published now
    finds it not due, and the reconciler hands it over once it is (within
    TAU_RECONCILE_SECONDS of the end of the backoff)."""
    now = timezone.now()
    due = now
    if action == Delivery.Action.SUBMIT and run.not_before is not None and run.not_before > now:
        due = run.not_before
    delivery = Delivery.objects.create(run=run, action=action, attempt=attempt, next_try_at=due)
    transaction.on_commit(lambda: publish(delivery.pk))
    return delivery


def publish(delivery_id: int) -> None:
    """Ask a worker to deliver now. Failing is fine: the reconciler will deliver it."""
    try:
        current_app.send_task(DELIVER_TASK, args=(delivery_id,), retry=False)
    except Exception as exc:  # the broker is down: the outbox row is the durable record
        logger.warning("could not enqueue delivery %s (%s); the reconciler will", delivery_id, exc)


def retries() -> Retries:
    """Doubling from TAU_DELIVERY_RETRY_SECONDS, at most TAU_DELIVERY_RETRY_MAX_SECONDS, and
    TAU_DELIVERY_MAX_TRIES tries (then the run fails, class ``infrastructure``)."""
    return Retries(
        first_seconds=int(settings.TAU_DELIVERY_RETRY_SECONDS),
        max_seconds=int(settings.TAU_DELIVERY_RETRY_MAX_SECONDS),
        max_tries=int(settings.TAU_DELIVERY_MAX_TRIES),
    )


def retry_delay(tries: int) -> timedelta:
    """How long to wait after the ``tries``-th failed try."""
    return retries().delay(tries)


def due_deliveries(*, grace_seconds: int = 5, limit: int = 200) -> list[int]:
    """Deliveries the reconciler should make now: not delivered, not given up, due, not
    claimed by a live worker, and older than a short grace period (so a task published right
    after commit gets its chance first)."""
    return due(
        Delivery.objects.unscoped().filter(delivered_at__isnull=True, given_up_at__isnull=True),
        grace_seconds=grace_seconds,
        limit=limit,
    )


def deliver(
    delivery_id: int, *, backend_for: Callable[[Run], RunBackend] = backend_for_run
) -> bool:
    """Hand one outbox row to the run's backend. True if this call delivered it."""
    claimed = _claim(delivery_id)
    if isinstance(claimed, str):
        _skipped(delivery_id, claimed)
        return False
    delivery = claimed
    assert delivery.claimed_at is not None
    rows = Delivery.objects.unscoped()
    with Lease(rows, delivery.pk, delivery.claimed_at, what=f"delivery {delivery.pk}") as lease:
        return _deliver_claimed(delivery, lease, backend_for)


def _deliver_claimed(
    delivery: Delivery, lease: Lease, backend_for: Callable[[Run], RunBackend]
) -> bool:
    run = Run.objects.unscoped().select_related("workspace").get(pk=delivery.run_id)
    attempt = (
        RunAttempt.objects.unscoped().get(pk=delivery.attempt_id)
        if delivery.attempt_id is not None
        else None
    )
    if delivery.action == Delivery.Action.SUBMIT and _superseded(run, attempt):
        # The run moved on (it ended, or this attempt is over) before it was handed over.
        logger.info(
            "delivery %s (submit of %s attempt %s) is not needed any more: the run is %s",
            delivery.pk,
            run.name,
            attempt.number if attempt is not None else "?",
            run.state,
        )
        _close(lease, delivered=True)
        return False
    try:
        backend = backend_for(run)
        if delivery.action == Delivery.Action.SUBMIT:
            if attempt is None:
                raise RuntimeError("a submit delivery names no attempt")
            backend.submit(run, attempt)
        else:
            backend.cancel(run)
    except Exception as exc:
        _failed(delivery, lease, run, exc)
        return False
    return _close(lease, delivered=True)


def _claim(delivery_id: int) -> Delivery | str:
    """The delivery, claimed for this call (its try counted), or why it cannot be (a word of
    ``SKIP_REASONS``). Only the delivery row is locked: no join, so no run or workspace row
    with it."""
    claimed = claim(Delivery.objects.unscoped(), delivery_id, settled=_settled)
    if isinstance(claimed, Skipped):
        return claimed.detail if claimed.reason is Skip.SETTLED else claimed.reason.value
    return claimed


def _settled(delivery: Delivery) -> str | None:
    if delivery.delivered_at is not None:
        return "delivered"
    if delivery.given_up_at is not None:
        return "given-up"
    return None


_SKIP_WORDS = {
    "locked": "another worker is claiming it right now",
    "in-progress": "another worker is delivering it",
    "not-due": "it waits to be tried again after a failure",
    "delivered": "it was delivered already",
    "given-up": "it was given up after its last try",
    "missing": "there is no such delivery",
}


def _skipped(delivery_id: int, reason: str) -> None:
    logger.info("delivery %s skipped: %s (%s)", delivery_id, _SKIP_WORDS[reason], reason)
    name = f"{SKIPPED_COUNTER}{reason}"
    try:
        cache.add(name, 0, timeout=None)
        cache.incr(name)
    except Exception:  # a counter is not worth failing a delivery for
        logger.warning("could not count a skipped delivery", exc_info=True)


def skipped_counts() -> dict[str, int]:
    """How many delivery calls delivered nothing, by reason, since the cache was last
    emptied (shared by every process that uses the cache)."""
    try:
        found = cache.get_many([f"{SKIPPED_COUNTER}{reason}" for reason in SKIP_REASONS])
    except Exception:
        logger.warning("could not read the skipped-delivery counters", exc_info=True)
        return {}
    return {reason: int(found.get(f"{SKIPPED_COUNTER}{reason}", 0) or 0) for reason in SKIP_REASONS}


def _superseded(run: Run, attempt: RunAttempt | None) -> bool:
    if run.state in TERMINAL_STATES:
        return True
    return attempt is not None and attempt.state in {
        RunAttempt.State.SUCCEEDED,
        RunAttempt.State.FAILED,
        RunAttempt.State.CANCELLED,
    }


def _close(
    lease: Lease, *, delivered: bool, error: str = "", retry_at: datetime | None = None
) -> bool:
    """Record the outcome of this call's claim. False when the claim had lapsed and another
    worker took the delivery over (its outcome is recorded by that worker)."""
    fields: dict[str, object] = {"last_error": error}
    if delivered:
        fields["delivered_at"] = timezone.now()
    if retry_at is not None:
        fields["next_try_at"] = retry_at
    return lease.release(**fields)


def _failed(delivery: Delivery, lease: Lease, run: Run, exc: Exception) -> None:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    record_failure(
        lease,
        policy=retries(),
        tries=delivery.tries,
        error=error,
        what=f"delivery {delivery.pk} ({delivery.action} of {run.name})",
        giving_up=partial(
            _give_up, delivery, lease, run, message=str(exc) or type(exc).__name__, error=error
        ),
        exc_info=exc,
    )


@transaction.atomic
def _give_up(
    delivery: Delivery, lease: Lease, run: Run, now: datetime, *, message: str, error: str
) -> None:
    """Never try this delivery again, and fail the run, saying what the backend said (in
    one transaction with closing the claim, which ``lease`` no longer renews)."""
    given_up = lease.held().update(claimed_at=None, last_error=error, given_up_at=now)
    if not given_up:
        return
    locked = lock_run(run.pk)
    what = "handed to" if delivery.action == Delivery.Action.SUBMIT else "stopped by"
    reason = (
        f"It could not be {what} the {locked.backend} backend ({delivery.tries} tries): {message}"
    )
    data = {"delivery": delivery.pk, "action": delivery.action, "tries": delivery.tries}
    if locked.state in LIVE_STATES:
        transition(
            locked,
            RunState.FAILED,
            reason=reason,
            kind=EventKind.DELIVERY_FAILED,
            data=data,
            failure_class=FailureClass.INFRASTRUCTURE,
        )
    else:
        append_event(locked, EventKind.DELIVERY_FAILED, message=reason, data=data)
