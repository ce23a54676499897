"""Versions a dead process left on the way (issue 33), swept every minute (Celery beat
``sweep-catalog-versions``, catalog.tasks). Apart from catalog.ingest and catalog.uploads,
since it finishes what either left."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from catalog import storage, uploads
from catalog.ingest import fail
from catalog.models import AssetVersion


def sweep_versions(now: Any = None) -> dict[str, int]:
    """Versions a dead process left on the way (``touched_at``), across workspaces:

    - an upload ``verifying`` with no sign of life for ``TAU_DATA_STALE_SECONDS`` (its
      checker died): checked again, to ready or failed;
    - an upload ``ingesting`` with no piece for ``TAU_DATA_UPLOAD_ABANDON_SECONDS``:
      failed, its pieces dropped (declaring the files again starts over);
    - any other version ``ingesting`` or ``verifying`` for ``TAU_DATA_STALE_SECONDS``
      (its ingest runs in one process, which wrote progress every second): failed, saying
      how far it got.

    Nothing is ever made ready here that was not checked whole."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.TAU_DATA_STALE_SECONDS)
    abandoned = now - timedelta(seconds=settings.TAU_DATA_UPLOAD_ABANDON_SECONDS)
    versions = AssetVersion.objects.unscoped().select_related("asset")
    counts = {"checked_again": 0, "abandoned": 0, "failed": 0}
    upload = AssetVersion.Source.UPLOAD
    waiting = (AssetVersion.State.INGESTING, AssetVersion.State.VERIFYING)
    for version in versions.filter(source=upload, state="verifying", touched_at__lt=stale):
        if _claim(version, AssetVersion.State.VERIFYING, AssetVersion.State.INGESTING, now):
            uploads.finish_if_whole(version)
            counts["checked_again"] += 1
    for version in versions.filter(source=upload, state="ingesting", touched_at__lt=abandoned):
        if _claim(version, AssetVersion.State.INGESTING, AssetVersion.State.FAILED, now):
            days = settings.TAU_DATA_UPLOAD_ABANDON_SECONDS / 86400
            fail(
                version,
                f"The upload was abandoned: no piece arrived for {days:g} days "
                f"({version.bytes_done:,} of {version.bytes_total:,} bytes had). Declare the "
                "files again to start over.",
            )
            storage.drop_uploads(version.asset.workspace_id, version.pk)
            counts["abandoned"] += 1
    others = versions.exclude(source=upload).filter(state__in=waiting, touched_at__lt=stale)
    for version in others:
        if _claim(version, version.state, AssetVersion.State.FAILED, now):
            fail(
                version,
                f"Its ingest stopped (the process making it ended) after "
                f"{version.bytes_done:,} of {version.bytes_total:,} bytes; make it again.",
            )
            counts["failed"] += 1
    return counts


def _claim(version: AssetVersion, was: str, becomes: str, now: Any) -> bool:
    """Move ``version`` from ``was`` to ``becomes`` unless someone else did first."""
    moved = (
        AssetVersion.objects.unscoped()
        .filter(pk=version.pk, state=was, touched_at=version.touched_at)
        .update(state=becomes, touched_at=now)
    )
    version.state = becomes
    version.touched_at = now
    return bool(moved)
