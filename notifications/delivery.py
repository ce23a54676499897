"""The notifications outbox: sending what :func:`notifications.services.notify` wrote.

The same three steps as run deliveries (``runs.delivery``), so that no transaction or lock
is held while an endpoint or an SMTP server takes its time:

1. *claim* the row in a short transaction that locks that row (``SKIP LOCKED``) and, for a
   webhook, its workspace's webhook rows (so that two claims in one workspace are counted one
   after the other); its try is counted;
2. send it (``notifications.sending``), outside any transaction, holding the claim as a lease
   (``portal.outbox.Lease``) renewed while it sends: a notifier killed meanwhile leaves a
   claim that lapses within ``TAU_CLAIM_LEASE_SECONDS``;
3. record the outcome, only if the claim is still this call's: delivered, or the error and
   when to try again (``TAU_NOTIFY_RETRY_SECONDS`` doubling up to
   ``TAU_NOTIFY_RETRY_MAX_SECONDS``); after ``TAU_NOTIFY_MAX_TRIES`` tries it is given up,
   and the log says so with the last error.

Why a slow or failing endpoint cannot starve anything else
==========================================================

A workspace admin chooses where webhooks point, so an endpoint may be slow on purpose (a
receiver trickling a byte every few seconds) or down. What one can hold is bounded at each
level:

* **Its own queue and worker.** Notification tasks go to the Celery queue ``notifications``
  (``CELERY_TASK_ROUTES``), consumed by a worker of their own (the *notifier*); run hand-off,
  cancels and evidence sealing are on the default queue of the main worker, and never wait
  behind a notification.
* **A deadline per delivery.** A POST, from resolving the name to the last byte of the
  answer, takes at most ``TAU_WEBHOOK_TIMEOUT_SECONDS`` (``notifications.sending``).
* **One delivery per endpoint at a time.** A webhook's deliveries are sent one after the
  other, oldest first; when one ends, the next due one of its workspace is published at once
  (:func:`publish_next`), so a healthy endpoint gets a burst quickly and in order.
* **A pause per failing endpoint.** Each failure in a row pauses the endpoint
  (``Webhook.resume_at``): ``TAU_NOTIFY_RETRY_SECONDS`` after the first, doubling up to
  ``TAU_NOTIFY_RETRY_MAX_SECONDS``. While paused none of its deliveries is tried (and none
  uses up a try); after the pause one delivery probes it, and the first that works ends the
  pause. A down endpoint with a thousand waiting deliveries costs one try per pause.
* **A share per workspace.** At most ``TAU_NOTIFY_WORKSPACE_CONCURRENCY`` deliveries to one
  workspace's webhooks are sent at once, so twenty slow endpoints of one workspace hold at
  most that many of the notifier's slots (``--concurrency``, larger) and the rest stay free
  for every other workspace. A workspace has at most ``TAU_WEBHOOKS_PER_WORKSPACE`` webhooks.

A task that finds its row's endpoint busy, paused or its workspace at its share does nothing
(it does not wait): the row is published again when a slot of its workspace frees up, or by
the reconciler. E-mails go to the installation's own SMTP server and are not limited this way.

A task is published for each row once the transaction that wrote it commits; the
reconciler (Celery beat, ``notifications.tasks.reconcile_notifications`` every
``TAU_RECONCILE_SECONDS``) publishes what a lost task, a down broker or a retry's backoff
left, one row per endpoint and within each workspace's share, and never a row whose task
is still waiting in the queue (``published_at``), so the queue cannot fill with repeats.
Logs name deliveries and webhooks by id and host: never a secret, never a whole URL (chat
webhook URLs are credentials themselves).
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Min, Q
from django.urls import reverse
from django.utils import timezone

from notifications import sending
from notifications.models import NotificationDelivery, Webhook
from notifications.preferences import email_events_for
from portal.outbox import (
    Lease,
    Retries,
    Skip,
    Skipped,
    claim,
    once_on_commit,
    record_failure,
    unclaimed_or_lapsed,
)

logger = logging.getLogger(__name__)

#: The Celery task that sends one row (``notifications.tasks``), published by name.
SEND_TASK = "notifications.tasks.send_notification"

#: A row whose task was published this long ago and never taken (a task lost with its worker
#: or its broker) is published again by the reconciler.
REPUBLISH_SECONDS = 60

Channel = NotificationDelivery.Channel


def publish_on_commit(delivery_id: int) -> None:
    """Publish the row once its transaction commits (once, however often it is folded into)."""
    once_on_commit(SEND_TASK, delivery_id, _publish_at_commit)


def _publish_at_commit(delivery_id: int) -> None:
    publish(delivery_id)


def publish(delivery_id: int) -> bool:
    """Ask a worker to send it now. Failing is fine: the reconciler will (the row is marked
    as not waiting in the queue, so it does not wait for ``REPUBLISH_SECONDS``)."""
    try:
        current_app.send_task(SEND_TASK, args=(delivery_id,), retry=False)
    except Exception as exc:  # the broker is down: the row is the durable record
        logger.warning(
            "could not enqueue notification %s (%s); the reconciler will", delivery_id, exc
        )
        NotificationDelivery.objects.unscoped().filter(pk=delivery_id).update(published_at=None)
        return False
    return True


def retries() -> Retries:
    """Doubling from TAU_NOTIFY_RETRY_SECONDS, at most TAU_NOTIFY_RETRY_MAX_SECONDS, and
    TAU_NOTIFY_MAX_TRIES tries; an endpoint's pause after failures in a row doubles alike."""
    return Retries(
        first_seconds=int(settings.TAU_NOTIFY_RETRY_SECONDS),
        max_seconds=int(settings.TAU_NOTIFY_RETRY_MAX_SECONDS),
        max_tries=int(settings.TAU_NOTIFY_MAX_TRIES),
    )


def retry_delay(tries: int) -> timedelta:
    return retries().delay(tries)


def workspace_share() -> int:
    """Deliveries to one workspace's webhooks sent at once, at most."""
    return int(getattr(settings, "TAU_NOTIFY_WORKSPACE_CONCURRENCY", 2))


def due_deliveries(*, limit: int = 200, workspace_id: int | None = None) -> list[int]:
    """Rows to publish now: not delivered, not given up, due, held by no live worker, with
    no task waiting for them in the queue (``published_at``: set when the row is written and
    published at commit), and whose endpoint is not paused. Of a webhook's rows only its
    oldest, and only while that endpoint has no delivery being sent or waiting in the queue
    and its workspace fewer than its share; e-mails as they come."""
    now = timezone.now()
    due = (
        NotificationDelivery.objects.unscoped()
        .filter(delivered_at__isnull=True, given_up_at__isnull=True, next_try_at__lte=now)
        .filter(unclaimed_or_lapsed(now))
        .filter(Q(published_at__isnull=True) | Q(published_at__lt=_republish_before(now)))
    )
    if workspace_id is not None:
        due = due.filter(workspace_id=workspace_id)
    # One candidate per endpoint (its oldest due row), so that one endpoint's backlog can
    # never hide the others'.
    firsts = list(
        due.filter(webhook__isnull=False)
        .filter(Q(webhook__resume_at__isnull=True) | Q(webhook__resume_at__lte=now))
        .values("webhook_id", "workspace_id")
        .annotate(first=Min("pk"))
        .order_by("first")
        .values_list("first", "webhook_id", "workspace_id")
    )
    in_flight = _webhook_deliveries_in_flight(now, workspace_id=workspace_id)
    busy = {webhook_id for webhook_id, _ in in_flight}
    per_workspace = Counter(ws for _, ws in in_flight)
    chosen: list[int] = []
    for pk, webhook_id, ws in firsts:
        if len(chosen) >= limit:
            break
        if webhook_id in busy or per_workspace[ws] >= workspace_share():
            continue
        busy.add(webhook_id)
        per_workspace[ws] += 1
        chosen.append(pk)
    if len(chosen) < limit:
        emails = due.filter(webhook__isnull=True).order_by("next_try_at", "pk")
        chosen += list(emails.values_list("pk", flat=True)[: limit - len(chosen)])
    return chosen


def _republish_before(now: datetime) -> datetime:
    return now - timedelta(seconds=REPUBLISH_SECONDS)


def _webhook_deliveries_in_flight(
    now: datetime, *, workspace_id: int | None = None
) -> list[tuple[int, int]]:
    """(webhook, workspace) of every webhook delivery being sent (a live claim) or whose
    task waits in the queue."""
    rows = (
        NotificationDelivery.objects.unscoped()
        .filter(webhook__isnull=False, delivered_at__isnull=True, given_up_at__isnull=True)
        .filter(
            ~unclaimed_or_lapsed(now) | Q(published_at__gte=_republish_before(now)),
        )
    )
    if workspace_id is not None:
        rows = rows.filter(workspace_id=workspace_id)
    return [(webhook_id, ws) for webhook_id, ws in rows.values_list("webhook_id", "workspace_id")]


def _webhook_deliveries_sending(now: datetime, *, workspace_id: int) -> list[int]:
    """The webhook of every delivery of the workspace a live worker is sending now."""
    rows = (
        NotificationDelivery.objects.unscoped()
        .filter(workspace_id=workspace_id, webhook__isnull=False)
        .exclude(unclaimed_or_lapsed(now))
    )
    return list(rows.values_list("webhook_id", flat=True))


def publish_due(*, workspace_id: int | None = None, limit: int = 200) -> int:
    """Publish what :func:`due_deliveries` picks; how many were published."""
    picked = due_deliveries(workspace_id=workspace_id, limit=limit)
    if not picked:
        return 0
    NotificationDelivery.objects.unscoped().filter(pk__in=picked).update(
        published_at=timezone.now()
    )
    return sum(publish(pk) for pk in picked)


def publish_next(workspace_id: int) -> int:
    """A slot of the workspace is free (a delivery ended): publish what waits for it."""
    try:
        return publish_due(workspace_id=workspace_id, limit=workspace_share())
    except Exception:  # the reconciler will; this must not hide the outcome just recorded
        logger.warning("could not publish the next notifications of workspace %s", workspace_id)
        return 0


def deliver(delivery_id: int) -> bool:
    """Send one row. True if this call delivered it."""
    claimed = _claim(delivery_id)
    if isinstance(claimed, str):
        logger.info("notification %s not sent now: %s", delivery_id, claimed)
        return False
    delivery = claimed
    assert delivery.claimed_at is not None
    rows = NotificationDelivery.objects.unscoped()
    with Lease(rows, delivery.pk, delivery.claimed_at, what=f"notification {delivery.pk}") as lease:
        delivered = _deliver_claimed(delivery, lease)
    if delivery.webhook_id is not None:
        publish_next(delivery.workspace_id)
    return delivered


def _deliver_claimed(delivery: NotificationDelivery, lease: Lease) -> bool:
    try:
        status_code = _send(delivery)
    except sending.NotWanted as exc:
        logger.info("notification %s not sent: %s", delivery.pk, exc)
        _close(lease, delivered=False, error=str(exc), give_up=True)
        return False
    except Webhook.DoesNotExist:
        logger.info("notification %s not sent: its webhook was removed", delivery.pk)
        return False
    except sending.SendFailed as exc:
        _failed(delivery, lease, str(exc), status_code=exc.status_code)
        return False
    except Exception as exc:  # a bug or a surprise: recorded like any failure, retried
        _failed(delivery, lease, f"{type(exc).__name__}: {exc}", status_code=None, exc=exc)
        return False
    if delivery.webhook_id is not None:
        _endpoint_worked(delivery.webhook_id)
    return _close(lease, delivered=True, status_code=status_code)


def _claim(delivery_id: int) -> NotificationDelivery | str:
    """The delivery, claimed for this call (its try counted), or why it cannot be."""
    claimed = claim(
        NotificationDelivery.objects.unscoped(),
        delivery_id,
        settled=_settled,
        refuse=_refuse_while_the_endpoint_is_busy,
        also=_tried_now,
    )
    if isinstance(claimed, Skipped):
        return claimed.detail or _SKIP_WORDS[claimed.reason]
    return claimed


_SKIP_WORDS = {
    Skip.LOCKED: "another worker is claiming it",
    Skip.MISSING: "there is no such delivery",
    Skip.IN_PROGRESS: "another worker is sending it",
    Skip.NOT_DUE: "it waits to be tried again after a failure",
}


def _settled(delivery: NotificationDelivery) -> str | None:
    if delivery.delivered_at is not None:
        return "it was delivered already"
    if delivery.given_up_at is not None:
        return "it was given up after its last try"
    return None


def _refuse_while_the_endpoint_is_busy(delivery: NotificationDelivery, now: datetime) -> str | None:
    if delivery.webhook_id is None:
        return None
    busy = _endpoint_busy(delivery, now)
    if busy is not None:
        # This task is spent: the row is published again when a slot frees up.
        delivery.published_at = None
        delivery.save(update_fields=["published_at"])
    return busy


def _tried_now(delivery: NotificationDelivery, now: datetime) -> list[str]:
    delivery.last_tried_at = now
    delivery.published_at = None
    return ["last_tried_at", "published_at"]


def _endpoint_busy(delivery: NotificationDelivery, now: datetime) -> str | None:
    """Why the row's endpoint takes nothing now (paused, sending another, or its workspace
    sending its share), or None. Locks the workspace's webhook rows, in order, for the rest
    of the claim's transaction: two claims in one workspace count one after the other."""
    webhooks = list(
        Webhook.objects.unscoped()
        .select_for_update()
        .filter(workspace_id=delivery.workspace_id)
        .order_by("pk")
        .only("pk", "resume_at", "failures_in_a_row")
    )
    webhook = next((w for w in webhooks if w.pk == delivery.webhook_id), None)
    if webhook is None:
        return "its webhook was removed"
    if webhook.resume_at is not None and webhook.resume_at > now:
        return (
            f"its endpoint failed {webhook.failures_in_a_row} time(s) in a row and is paused "
            f"until {webhook.resume_at:%H:%M:%S}"
        )
    sending_now = _webhook_deliveries_sending(now, workspace_id=delivery.workspace_id)
    if webhook.pk in sending_now:
        return "another delivery to its endpoint is being sent"
    if len(sending_now) >= workspace_share():
        return (
            f"its workspace has {len(sending_now)} deliveries being sent, its share "
            "(TAU_NOTIFY_WORKSPACE_CONCURRENCY)"
        )
    return None


def _endpoint_worked(webhook_id: int) -> None:
    """The endpoint answered 2xx: any pause is over."""
    Webhook.objects.unscoped().filter(pk=webhook_id).filter(
        Q(failures_in_a_row__gt=0) | Q(resume_at__isnull=False)
    ).update(failures_in_a_row=0, resume_at=None)


def _endpoint_failed(webhook_id: int) -> timedelta | None:
    """The endpoint failed once more: it is paused, twice as long as the last time. The
    pause, or None if the webhook is gone."""
    with transaction.atomic():
        webhook = (
            Webhook.objects.unscoped()
            .select_for_update()
            .filter(pk=webhook_id)
            .only("pk", "failures_in_a_row")
            .first()
        )
        if webhook is None:
            return None
        failures = webhook.failures_in_a_row + 1
        pause = retry_delay(failures)
        Webhook.objects.unscoped().filter(pk=webhook_id).update(
            failures_in_a_row=failures, resume_at=timezone.now() + pause
        )
    return pause


def _send(delivery: NotificationDelivery) -> int | None:
    if delivery.channel == Channel.WEBHOOK:
        assert delivery.webhook_id is not None
        webhook = Webhook.objects.unscoped().get(pk=delivery.webhook_id)
        body = sending.webhook_body(
            delivery.payload, fmt=webhook.format, delivery_id=delivery.pk, count=delivery.count
        )
        return sending.post_webhook(url=webhook.url, secret=webhook.secret, body=body)
    sending.send_email(_email(delivery))
    return None


def _email(delivery: NotificationDelivery) -> sending.Email:
    from notifications.unsubscribe import unsubscribe_url

    assert delivery.user_id is not None
    user: Any = get_user_model()._default_manager.get(pk=delivery.user_id)
    if not user.email:
        raise sending.NotWanted("The person has no e-mail address any more.")
    if delivery.event not in email_events_for(user.pk):
        raise sending.NotWanted(
            f"The person stopped e-mails about {delivery.event} before this one was sent."
        )
    payload = delivery.payload
    link = unsubscribe_url(user_id=user.pk, event=delivery.event)
    title = str(payload.get("title", delivery.event))
    lines = [title, ""]
    lines += [f"{label}: {value}" for label, value in sending.detail_lines(payload)]
    if delivery.count > 1:
        lines.append(f"(This happened {delivery.count} times.)")
    if payload.get("url"):
        lines += ["", f"Open it: {payload['url']}"]
    lines += [
        "",
        "--",
        f"You get this e-mail because of your TauGrid notification settings ({delivery.event}).",
        f"Stop these e-mails: {link}",
        f"All your settings: {settings.TAU_PUBLIC_URL}{reverse('notification-preferences')}",
    ]
    return sending.Email(
        to=user.email, subject=f"[TauGrid] {title}", body="\n".join(lines), unsubscribe_url=link
    )


def _close(
    lease: Lease,
    *,
    delivered: bool,
    status_code: int | None = None,
    error: str = "",
    give_up: bool = False,
) -> bool:
    """Record this call's outcome. False when the claim lapsed and another worker took the
    row over (that worker records its own outcome)."""
    now = timezone.now()
    fields: dict[str, Any] = {
        "last_error": error,
        "last_status_code": status_code,
        "updated_at": now,
    }
    if delivered:
        fields["delivered_at"] = now
    if give_up:
        fields["given_up_at"] = now
    return lease.release(**fields)


def _failed(
    delivery: NotificationDelivery,
    lease: Lease,
    error: str,
    *,
    status_code: int | None,
    exc: Exception | None = None,
) -> None:
    target = f"webhook {delivery.webhook_id}" if delivery.webhook_id else "e-mail"
    if delivery.webhook_id is not None:
        pause = _endpoint_failed(delivery.webhook_id)
        if pause is not None:
            target += f", paused for {pause.total_seconds():.0f}s"
    now = timezone.now()
    fields = {"last_status_code": status_code, "updated_at": now}
    record_failure(
        lease,
        policy=retries(),
        tries=delivery.tries,
        error=error[:2000],
        what=f"notification {delivery.pk} ({delivery.event} to {target})",
        retrying=fields,
        giving_up={**fields, "given_up_at": now},
        exc_info=exc,
    )
