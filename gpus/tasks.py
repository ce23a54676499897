"""The Celery task that keeps the fleet rows in step (``gpus.fleet.sync_fleet``), fired by
beat every ``TAU_GPU_SYNC_SECONDS`` (``CELERY_BEAT_SCHEDULE["sync-gpu-fleet"]``).

Syncs must not pile up: a big fleet or a slow API server can make one sync outlast the beat
interval, and queued syncs would all run, one after another, long after they were useful.
Two guards: the message expires after one interval (a worker busy elsewhere drops the old
ones: the next beat brings a fresh one), and a sync takes a cache lock (``cache.add``, atomic
on Redis) for as long as it runs; a sync that finds it taken is skipped. The lock expires by
itself after ``LOCK_SECONDS``, so a worker killed mid-sync does not stop the fleet for good.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any, Final

from celery import shared_task
from django.conf import settings
from django.core.cache import cache

from gpus import fleet

logger = logging.getLogger(__name__)

SYNC_TASK: Final = "gpus.tasks.sync_fleet"
LOCK_KEY: Final = "gpus:sync-fleet:running"
#: Longer than any sync should take (two lists and a few cordons, each under the Kubernetes
#: client's timeout), short enough that a lock a killed worker left lapses soon.
LOCK_SECONDS: Final = 300


@shared_task(name=SYNC_TASK, ignore_result=True, expires=float(settings.TAU_GPU_SYNC_SECONDS))
def sync_fleet() -> dict[str, Any]:
    """Sync the fleet unless another sync is still running; what happened, as a dict."""
    token = uuid.uuid4().hex
    try:
        taken = cache.add(LOCK_KEY, token, timeout=LOCK_SECONDS)
    except Exception as error:  # the cache is down: better no sync than syncs on top of syncs
        logger.warning("fleet sync skipped: the lock cannot be taken (%s)", error)
        return dataclasses.asdict(fleet.SyncResult(source="", ok=False, skipped=True))
    if not taken:
        logger.info("fleet sync skipped: the previous one is still running")
        return dataclasses.asdict(fleet.SyncResult(source="", ok=False, skipped=True))
    try:
        return dataclasses.asdict(fleet.sync_fleet())
    finally:
        try:
            # Only our own lock: one that lapsed and was taken by another sync is theirs.
            if cache.get(LOCK_KEY) == token:
                cache.delete(LOCK_KEY)
        except Exception as error:
            logger.warning("the fleet sync lock was not released (%s); it lapses", error)


REFRESH_TASK: Final = "gpus.tasks.refresh_fleet_telemetry"


@shared_task(
    name=REFRESH_TASK,
    ignore_result=True,
    expires=float(max(1, settings.TAU_PROMETHEUS_CACHE_SECONDS)),
)
def refresh_fleet_telemetry() -> bool:
    """Read the fleet's GPU telemetry into the cache (``gpus.readings.refresh_fleet``), so
    that no page waits on Prometheus; whether it was read. An old message is dropped (the
    next beat brings a fresh one) and a failure is kept as the pages' notice, not raised."""
    from gpus import readings as telemetry

    return telemetry.refresh_fleet().ok
