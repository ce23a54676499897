"""``run.waiting``: runs that have waited for resources longer than
``TAU_NOTIFY_WAITING_MINUTES``, found by Celery beat (``notifications.tasks.notify_waiting``),
told of once per wait.

A wait is a stay in the queue: it starts when the run was last queued (``queued_at``, set
again by every retry or resume) or, for a run not yet handed to its backend, when it was
submitted. A :class:`~notifications.models.NotifiedWait` row per (run, start of the wait)
makes the notice once-only, across beat runs and racing workers (its unique constraint).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, Exists, OuterRef
from django.db.models.functions import Coalesce
from django.utils import timezone

from notifications import events
from notifications.models import NotifiedWait
from notifications.receivers import run_payload
from notifications.services import Event, notify
from runs.models import Run, RunState

logger = logging.getLogger(__name__)

#: The states a run waits in before it holds resources.
WAITING_STATES = (RunState.PENDING, RunState.QUEUED)


def notify_waiting_runs(*, limit: int = 500) -> int:
    """Tell of every run waiting too long that was not told of for this wait yet. Returns
    how many were told of."""
    minutes = int(settings.TAU_NOTIFY_WAITING_MINUTES)
    now = timezone.now()
    since = Coalesce("queued_at", "created_at", output_field=DateTimeField())
    # unscoped(): a platform task over every workspace's queue.
    candidates = (
        Run.objects.unscoped()
        .filter(state__in=WAITING_STATES)
        .annotate(wait_started=since)
        .filter(wait_started__lte=now - timedelta(minutes=minutes))
        .annotate(
            told=Exists(
                NotifiedWait.objects.unscoped().filter(
                    run=OuterRef("pk"), since=OuterRef("wait_started")
                )
            )
        )
        .filter(told=False)
        .select_related("workspace")
        .order_by("wait_started")[:limit]
    )
    told = 0
    for run in candidates:
        started = run.wait_started
        try:
            with transaction.atomic():
                NotifiedWait.objects.create(run=run, since=started)
                waited = int((now - started).total_seconds() // 60)
                title = f"Run {run.name} has been waiting for {waited} minutes"
                notify(
                    Event(
                        name=events.RUN_WAITING,
                        workspace=run.workspace,
                        title=title,
                        payload=run_payload(
                            run,
                            events.RUN_WAITING,
                            title,
                            {
                                "waiting_minutes": waited,
                                "waiting_since": started.isoformat(),
                                "reason": run.state_reason,
                                "queue_position": run.queue_position,
                            },
                        ),
                        key=f"run:{run.pk}:waiting:{started.isoformat()}",
                        submitter_id=run.submitted_by_id,
                    )
                )
        except IntegrityError:
            continue  # another worker told of this wait first
        told += 1
    if told:
        logger.info("told of %d run(s) waiting longer than %d minutes", told, minutes)
    return told
