"""Writes: webhooks, e-mail preferences, and the deliveries an event turns into.

:func:`notify` is what the receivers call inside the transaction of the change they tell
of. It only writes rows (one per webhook that wants the event, one per person to e-mail)
and asks for them to be sent once the transaction commits; nothing here calls out, so a
slow or failing endpoint never holds up a run or a budget check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from notifications.delivery import publish_on_commit
from notifications.events import (
    ADMIN_EVENTS,
    DEFAULT_EMAIL_EVENTS,
    EVENTS,
    RUN_EVENTS,
    unknown_events,
    unknown_events_message,
    wants,
)
from notifications.models import EmailPreference, NotificationDelivery, PayloadFormat, Webhook
from notifications.preferences import email_events_for
from portal import addresses, audit
from workspaces.models import Membership, Role, Workspace

if TYPE_CHECKING:
    from django.contrib.auth.models import User

Channel = NotificationDelivery.Channel

#: The longest secret accepted, and the shortest (a guessable secret signs nothing).
SECRET_MIN_LENGTH = 16
SECRET_MAX_LENGTH = 200


# -- webhooks -----------------------------------------------------------------------------------


def clean_events(events: Iterable[str]) -> list[str]:
    """The event names, each once, in the order of ``EVENTS``; unknown ones are refused."""
    names = list(events)
    unknown = unknown_events(names)
    if unknown:
        raise ValidationError({"events": [unknown_events_message(unknown)]})
    return [name for name in EVENTS if name in names]


def clean_webhook_url(url: str) -> str:
    try:
        addresses.check_url(url)
    except addresses.RefusedAddress as exc:
        raise ValidationError({"url": [str(exc)]}) from None
    return url


@transaction.atomic
def create_webhook(
    *,
    workspace: Workspace,
    url: str,
    secret: str,
    events: Iterable[str],
    fmt: str = PayloadFormat.JSON,
    by: User,
) -> Webhook:
    """A new webhook of ``workspace``, audited (without its secret)."""
    if not SECRET_MIN_LENGTH <= len(secret) <= SECRET_MAX_LENGTH:
        raise ValidationError(
            {
                "secret": [
                    f"Give a secret of {SECRET_MIN_LENGTH} to {SECRET_MAX_LENGTH} characters, "
                    "e.g. the output of `openssl rand -hex 32`; receivers check signatures "
                    "with it."
                ]
            }
        )
    if fmt not in PayloadFormat.values:
        raise ValidationError({"format": [f"Use one of {', '.join(PayloadFormat.values)}."]})
    _refuse_past_the_limit(workspace)
    webhook = Webhook.objects.create(
        workspace=workspace,
        url=clean_webhook_url(url),
        secret=secret,
        events=clean_events(events),
        format=fmt,
        created_by=by,
        created_by_username=by.get_username(),
    )
    audit.record(
        action="webhook.created",
        workspace=workspace,
        object_type="notifications.webhook",
        object_id=str(webhook.pk),
        object_repr=addresses.split_url(webhook.url).hostname or "",
        after={"url": webhook.url, "events": webhook.events, "format": webhook.format},
        actor=by,
    )
    return webhook


def webhook_limit() -> int:
    """The most webhooks one workspace may have (``TAU_WEBHOOKS_PER_WORKSPACE``)."""
    return int(getattr(settings, "TAU_WEBHOOKS_PER_WORKSPACE", 20))


def _refuse_past_the_limit(workspace: Workspace) -> None:
    """Refuse a webhook beyond :func:`webhook_limit`: every endpoint is one more place each
    event is sent to. The workspace's row is locked for the rest of the transaction, so two
    admins adding the last one at once get one webhook, not two."""
    Workspace.unscoped_objects.select_for_update(no_key=True).filter(pk=workspace.pk).first()
    count = Webhook.objects.for_workspace(workspace).count()
    if count >= webhook_limit():
        raise ValidationError(
            {
                NON_FIELD_ERRORS: [
                    f"This workspace has {count} webhooks, the most a workspace may have "
                    f"(TAU_WEBHOOKS_PER_WORKSPACE={webhook_limit()}): remove one it no longer "
                    "needs before adding another."
                ]
            },
            code="too_many_webhooks",
        )


@transaction.atomic
def delete_webhook(*, webhook: Webhook, by: User) -> None:
    """Remove the webhook and its delivery log, audited."""
    audit.record(
        action="webhook.deleted",
        workspace=webhook.workspace,
        object_type="notifications.webhook",
        object_id=str(webhook.pk),
        object_repr=addresses.split_url(webhook.url).hostname or "",
        before={"url": webhook.url, "events": webhook.events, "format": webhook.format},
        actor=by,
    )
    webhook.delete()


# -- e-mail preferences ---------------------------------------------------------------------------


@transaction.atomic
def set_email_events(*, user: User, events: Iterable[str]) -> list[str]:
    cleaned = clean_events(events)
    EmailPreference.objects.update_or_create(user=user, defaults={"events": cleaned})
    return cleaned


@transaction.atomic
def unsubscribe(*, user_id: int, event: str) -> bool:
    """Stop e-mails about ``event`` to the user. False if there is no such user."""
    if not get_user_model()._default_manager.filter(pk=user_id).exists():
        return False
    current = [name for name in email_events_for(user_id) if name != event]
    EmailPreference.objects.update_or_create(user_id=user_id, defaults={"events": current})
    return True


def email_enabled() -> bool:
    """E-mail is sent only where an SMTP server is configured (``TAU_EMAIL_HOST``)."""
    return bool(getattr(settings, "EMAIL_HOST", ""))


# -- events into deliveries -----------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """Something to tell people of, as receivers build it."""

    name: str
    workspace: Workspace
    title: str
    payload: dict[str, Any]
    key: str = ""
    #: For run events: who submitted the run (e-mailed, if they want it).
    submitter_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def notify(event: Event) -> list[NotificationDelivery]:
    """Write the deliveries ``event`` turns into, in the caller's transaction; each is sent
    once that transaction commits. Returns the rows written or folded into."""
    if event.name not in EVENTS:
        raise ValueError(f"{event.name!r} is no event")
    written: list[NotificationDelivery] = []
    webhooks = Webhook.objects.for_workspace(event.workspace).only("pk", "events")
    for webhook in webhooks:
        if wants(webhook.events, event.name):
            written.append(
                _write(event, channel=Channel.WEBHOOK, webhook_id=webhook.pk, user_id=None)
            )
    if email_enabled():
        for user_id in _email_recipients(event):
            written.append(_write(event, channel=Channel.EMAIL, webhook_id=None, user_id=user_id))
    return written


def _email_recipients(event: Event) -> list[int]:
    """The people to e-mail: a run's submitter, or the workspace's admins, who are members
    now, have an address, and want this event."""
    members = Membership.objects.for_workspace(event.workspace).exclude(user__email="")
    if event.name in RUN_EVENTS:
        if event.submitter_id is None:
            return []
        members = members.filter(user_id=event.submitter_id)
    elif event.name in ADMIN_EVENTS:
        members = members.filter(role=Role.ADMIN)
    else:
        return []
    user_ids = list(members.order_by("user_id").values_list("user_id", flat=True))
    if not user_ids:
        return []
    chosen = dict(
        EmailPreference.objects.filter(user_id__in=user_ids).values_list("user_id", "events")
    )
    return [
        user_id for user_id in user_ids if event.name in chosen.get(user_id, DEFAULT_EMAIL_EVENTS)
    ]


def _write(
    event: Event, *, channel: str, webhook_id: int | None, user_id: int | None
) -> NotificationDelivery:
    """A delivery row, or the pending one of the same target, event and key folded into:
    one that no worker holds now (a claimed row may already be on its way, so a repeat after
    it is a delivery of its own)."""
    rows = NotificationDelivery.objects.for_workspace(event.workspace)
    target: dict[str, Any] = {"webhook_id": webhook_id, "user_id": user_id}
    if event.key:
        pending = (
            rows.filter(
                channel=channel,
                event=event.name,
                key=event.key,
                delivered_at__isnull=True,
                given_up_at__isnull=True,
                claimed_at__isnull=True,
                **target,
            )
            .order_by("-pk")
            .first()
        )
        if pending is not None:
            # The filter runs again under the row lock: a claim that won the race since the
            # read above leaves nothing to update, and a new row is written below.
            folded = rows.filter(pk=pending.pk, claimed_at__isnull=True).update(
                count=F("count") + 1, payload=event.payload, updated_at=timezone.now()
            )
            if folded:
                pending.refresh_from_db()
                return pending
    delivery = NotificationDelivery.objects.create(
        workspace=event.workspace,
        channel=channel,
        webhook_id=webhook_id,
        user_id=user_id,
        event=event.name,
        key=event.key[:200],
        payload=event.payload,
        published_at=timezone.now(),  # published at commit (cleared if that fails)
    )
    publish_on_commit(delivery.pk)
    return delivery
