"""What every outbox in TauGrid shares (run deliveries, Kueue syncs): a row is claimed by the
worker that acts on it, the claim lapses if that worker died, and a failed try waits twice as
long as the one before, up to a cap.

The rule the outboxes exist for is each app's own: write the row in the transaction of the
change, act on it outside any transaction, record the outcome.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
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
