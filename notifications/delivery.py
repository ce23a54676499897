"""The notifications outbox: sending what :func:`notifications.services.notify` wrote.

The same three steps as run deliveries (``runs.delivery``), so that no transaction or lock
is held while an endpoint or an SMTP server takes its time:

1. *claim* the row in a short transaction that locks that row only (``SKIP LOCKED``); its
   try is counted; a claim lapses after ``portal.outbox.CLAIM_SECONDS`` if its worker died;
2. send it (``notifications.sending``), outside any transaction;
3. record the outcome, only if the claim is still this call's: delivered, or the error
   and when to try again (``TAU_NOTIFY_RETRY_SECONDS`` doubling up to
   ``TAU_NOTIFY_RETRY_MAX_SECONDS``); after ``TAU_NOTIFY_MAX_TRIES`` tries it is given up,
   and the log says so with the last error.

A task is published for each row once the transaction that wrote it commits; the
reconciler (Celery beat, ``notifications.tasks.reconcile_notifications`` every
``TAU_RECONCILE_SECONDS``) sends what a lost task, a down broker or a retry's backoff left.
Logs name deliveries and webhooks by id and host: never a secret, never a whole URL (chat
webhook URLs are credentials themselves).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from notifications import sending
from notifications.models import NotificationDelivery, Webhook
from portal.outbox import claim_is_live, doubling_delay, once_on_commit, unclaimed_or_lapsed

logger = logging.getLogger(__name__)

#: The Celery task that sends one row (``notifications.tasks``), published by name.
SEND_TASK = "notifications.tasks.send_notification"

Channel = NotificationDelivery.Channel


def publish_on_commit(delivery_id: int) -> None:
    """Publish the row once its transaction commits (once, however often it is folded into)."""
    once_on_commit(SEND_TASK, delivery_id, lambda pk: publish(pk))


def publish(delivery_id: int) -> None:
    """Ask a worker to send it now. Failing is fine: the reconciler will."""
    try:
        current_app.send_task(SEND_TASK, args=(delivery_id,), retry=False)
    except Exception as exc:  # the broker is down: the row is the durable record
        logger.warning(
            "could not enqueue notification %s (%s); the reconciler will", delivery_id, exc
        )


def retry_delay(tries: int) -> timedelta:
    return doubling_delay(
        tries,
        first_seconds=int(settings.TAU_NOTIFY_RETRY_SECONDS),
        max_seconds=int(settings.TAU_NOTIFY_RETRY_MAX_SECONDS),
    )


def due_deliveries(*, grace_seconds: int = 5, limit: int = 200) -> list[int]:
    """Rows the reconciler should send now: not delivered, not given up, due, held by no
    live worker, and older than a short grace (the task published at commit goes first)."""
    now = timezone.now()
    return list(
        NotificationDelivery.objects.unscoped()
        .filter(
            delivered_at__isnull=True,
            given_up_at__isnull=True,
            next_try_at__lte=now,
            created_at__lte=now - timedelta(seconds=grace_seconds),
        )
        .filter(unclaimed_or_lapsed(now))
        .order_by("next_try_at")
        .values_list("pk", flat=True)[:limit]
    )


def deliver(delivery_id: int) -> bool:
    """Send one row. True if this call delivered it."""
    claimed = _claim(delivery_id)
    if isinstance(claimed, str):
        logger.info("notification %s not sent now: %s", delivery_id, claimed)
        return False
    delivery = claimed
    try:
        status_code = _send(delivery)
    except sending.NotWanted as exc:
        logger.info("notification %s not sent: %s", delivery.pk, exc)
        _close(delivery, delivered=False, error=str(exc), give_up=True)
        return False
    except Webhook.DoesNotExist:
        logger.info("notification %s not sent: its webhook was removed", delivery.pk)
        return False
    except sending.SendFailed as exc:
        _failed(delivery, str(exc), status_code=exc.status_code)
        return False
    except Exception as exc:  # a bug or a surprise: recorded like any failure, retried
        logger.exception("notification %s: sending raised", delivery.pk)
        _failed(delivery, f"{type(exc).__name__}: {exc}", status_code=None)
        return False
    return _close(delivery, delivered=True, status_code=status_code)


def _claim(delivery_id: int) -> NotificationDelivery | str:
    now = timezone.now()
    with transaction.atomic():
        delivery = (
            NotificationDelivery.objects.unscoped()
            .select_for_update(skip_locked=True)
            .filter(pk=delivery_id)
            .first()
        )
        if delivery is None:
            exists = NotificationDelivery.objects.unscoped().filter(pk=delivery_id).exists()
            return "another worker is claiming it" if exists else "there is no such delivery"
        if delivery.delivered_at is not None:
            return "it was delivered already"
        if delivery.given_up_at is not None:
            return "it was given up after its last try"
        if claim_is_live(delivery.claimed_at, now):
            return "another worker is sending it"
        if delivery.next_try_at > now:
            return "it waits to be tried again after a failure"
        delivery.tries += 1
        delivery.claimed_at = now
        delivery.last_tried_at = now
        delivery.save(update_fields=["tries", "claimed_at", "last_tried_at"])
    return delivery


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
    from notifications.services import email_events_for

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
    delivery: NotificationDelivery,
    *,
    delivered: bool,
    status_code: int | None = None,
    error: str = "",
    retry_at: Any = None,
    give_up: bool = False,
) -> bool:
    """Record this call's outcome. False when the claim lapsed and another worker took the
    row over (that worker records its own outcome)."""
    now = timezone.now()
    fields: dict[str, Any] = {
        "claimed_at": None,
        "last_error": error,
        "last_status_code": status_code,
        "updated_at": now,
    }
    if delivered:
        fields["delivered_at"] = now
    if retry_at is not None:
        fields["next_try_at"] = retry_at
    if give_up:
        fields["given_up_at"] = now
    updated = (
        NotificationDelivery.objects.unscoped()
        .filter(pk=delivery.pk, claimed_at=delivery.claimed_at)
        .update(**fields)
    )
    if not updated:
        logger.warning(
            "notification %s: the claim lapsed while sending; another worker took it over",
            delivery.pk,
        )
    return bool(updated)


def _failed(delivery: NotificationDelivery, error: str, *, status_code: int | None) -> None:
    error = error[:2000]
    target = f"webhook {delivery.webhook_id}" if delivery.webhook_id else "e-mail"
    max_tries = int(settings.TAU_NOTIFY_MAX_TRIES)
    if delivery.tries < max_tries:
        delay = retry_delay(delivery.tries)
        logger.warning(
            "notification %s (%s to %s) failed, try %d of %d; trying again in %ds: %s",
            delivery.pk,
            delivery.event,
            target,
            delivery.tries,
            max_tries,
            delay.total_seconds(),
            error,
        )
        _close(
            delivery,
            delivered=False,
            status_code=status_code,
            error=error,
            retry_at=timezone.now() + delay,
        )
        return
    logger.error(
        "notification %s (%s to %s) failed %d times; giving up: %s",
        delivery.pk,
        delivery.event,
        target,
        delivery.tries,
        error,
    )
    _close(delivery, delivered=False, status_code=status_code, error=error, give_up=True)
