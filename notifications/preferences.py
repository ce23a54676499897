"""What each person is e-mailed about: read by the pages, by :mod:`notifications.services`
(which writes the choice) and by :mod:`notifications.delivery` (which checks it again just
before sending, so an e-mail stopped after it was queued is not sent)."""

from __future__ import annotations

from notifications.events import DEFAULT_EMAIL_EVENTS, EVENTS
from notifications.models import EmailPreference


def email_events_for(user_id: int) -> list[str]:
    """What the person is e-mailed about (their choice, or the defaults)."""
    chosen = EmailPreference.objects.filter(user_id=user_id).values_list("events", flat=True)
    for events in chosen:
        return [name for name in EVENTS if name in events]
    return list(DEFAULT_EMAIL_EVENTS)
