"""Notices: what the apps tell people about, announced without knowing who listens.

An app that has something to tell (a workspace passed a share of its GPU-hour budget) sends
``notice`` inside the transaction of the change; the notifications app, which sits above
every app that sends, turns it into e-mails and webhook deliveries in that same transaction.
A receiver only writes rows: nothing is delivered, and no endpoint is called, before the
change commits, and a slow or failing endpoint never holds up the sender.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.dispatch import Signal

#: Sent with ``notice`` (a :class:`Notice`).
notice = Signal()


@dataclass(frozen=True)
class Notice:
    #: The event's name as the API spells it, e.g. ``budget.threshold``.
    event: str
    workspace_id: int
    #: One line saying what happened, for an e-mail's subject and a chat message.
    title: str
    #: What receivers get under ``data`` (JSON types only).
    data: dict[str, Any] = field(default_factory=dict)
    #: Repeats of the same notice with the same key are coalesced into one delivery.
    key: str = ""
    run_id: int | None = None


def announce(item: Notice) -> None:
    notice.send(sender=Notice, notice=item)
