"""What every outbox in TauGrid shares (run deliveries, Kueue syncs): a row is claimed by the
worker that acts on it, the claim lapses if that worker died, and a failed try waits twice as
long as the one before, up to a cap.

The rule the outboxes exist for is each app's own: write the row in the transaction of the
change, act on it outside any transaction, record the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

#: How long a claim holds: longer than any one try may take (a Celery task is stopped after
#: ``CELERY_TASK_TIME_LIMIT``); after that another worker may take the row over.
CLAIM_SECONDS = int(getattr(settings, "CELERY_TASK_TIME_LIMIT", 300)) + 60


def claim_is_live(claimed_at: datetime | None, now: datetime) -> bool:
    """Whether a worker holds the row now (claimed, and not so long ago that it lapsed)."""
    return claimed_at is not None and claimed_at > now - timedelta(seconds=CLAIM_SECONDS)


def unclaimed_or_lapsed(now: datetime) -> Q:
    """The rows no live worker holds, for a reconciler's query."""
    return Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - timedelta(seconds=CLAIM_SECONDS))


def doubling_delay(tries: int, *, first_seconds: int, max_seconds: int) -> timedelta:
    """The wait after the ``tries``-th failed try: ``first_seconds`` after the first,
    doubling with each try, at most ``max_seconds``."""
    return timedelta(seconds=min(max_seconds, first_seconds * 2 ** min(max(tries - 1, 0), 30)))


class _OnCommit:
    """The on-commit callback for one row (a class, so that one already registered in this
    transaction can be recognised and not registered twice)."""

    def __init__(self, key: str, row_id: int, send: Callable[[int], None]) -> None:
        self.key = key
        self.row_id = row_id
        self.send = send

    def __call__(self) -> None:
        self.send(self.row_id)


def once_on_commit(key: str, row_id: int, send: Callable[[int], None]) -> None:
    """``send(row_id)`` when the transaction commits, once however often it is asked for in
    that transaction (a row folded into three times is published once). ``key`` names the
    outbox, so rows of two outboxes with the same id are told apart."""
    for entry in getattr(connection, "run_on_commit", None) or []:
        # Django keeps (savepoint ids, callback, robust) per registered callback.
        callback = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
        if isinstance(callback, _OnCommit) and (callback.key, callback.row_id) == (key, row_id):
            return
    transaction.on_commit(_OnCommit(key, row_id, send))
