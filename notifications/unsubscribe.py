"""One-click unsubscribe tokens: who and from what, signed with the portal's secret key.

A link in an e-mail must work without logging in (a mail client's one-click unsubscribe,
RFC 8058, POSTs to it with no session), so the link itself carries who it is for, signed:
a forged or altered token is refused. It carries no expiry: an old e-mail's link still
stops the e-mails it came with.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core import signing
from django.urls import reverse

from notifications.events import EVENTS

SALT = "taugrid.notifications.unsubscribe"


@dataclass(frozen=True)
class Unsubscribe:
    user_id: int
    event: str


def make_token(*, user_id: int, event: str) -> str:
    return signing.dumps({"u": user_id, "e": event}, salt=SALT, compress=False)


def read_token(token: str) -> Unsubscribe | None:
    """What the token says, or None when it is not one this portal signed."""
    try:
        value = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        return None
    if not isinstance(value, dict):
        return None
    user_id, event = value.get("u"), value.get("e")
    if not isinstance(user_id, int) or event not in EVENTS:
        return None
    return Unsubscribe(user_id=user_id, event=str(event))


def unsubscribe_url(*, user_id: int, event: str) -> str:
    path = reverse(
        "notification-unsubscribe", kwargs={"token": make_token(user_id=user_id, event=event)}
    )
    return f"{settings.TAU_PUBLIC_URL}{path}"
