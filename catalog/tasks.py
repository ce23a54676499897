"""The catalog's Celery tasks: its periodic work (beat: ``sweep-catalog-versions``), the
downloads of versions from URLs and the reading of prefixes."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction

from catalog import prefixes, storage, url_ingest
from catalog.models import Asset, AssetVersion
from catalog.sweep import sweep_versions as sweep

#: An ingest reads for as long as its data takes (50 GB from a URL, a prefix of a million
#: files), past the 5 minutes every other task gets (CELERY_TASK_TIME_LIMIT); one that hangs
#: is not left to this limit: it writes progress every second, and the sweep fails a version
#: that has none for TAU_DATA_STALE_SECONDS.
INGEST_TIME_LIMIT_SECONDS = 24 * 3600


@shared_task(ignore_result=True)
def sweep_versions() -> dict[str, int]:
    """Versions a dead process left ingesting or verifying (catalog.sweep)."""
    return sweep()


@shared_task(ignore_result=True)
def trim_cache() -> int:
    """Copies of an S3 store's files no staged run links any more (catalog.storage)."""
    return storage.trim_cache(float(settings.TAU_DATA_CACHE_SECONDS))


def start_url_ingest(
    asset: Asset, url: str, *, path: str | None = None, user: Any = None
) -> AssetVersion:
    """A new version from ``url`` (``catalog.url_ingest.start``), its download queued once
    the version is written."""
    version, name = url_ingest.start(asset, url, path=path, user=user)
    transaction.on_commit(lambda: ingest_url.delay(version.pk, url, name))
    return version


@shared_task(
    ignore_result=True,
    time_limit=INGEST_TIME_LIMIT_SECONDS,
    soft_time_limit=INGEST_TIME_LIMIT_SECONDS - 60,
)
def ingest_url(version_id: int, url: str, name: str) -> str:
    """Download a version's one file from ``url`` (catalog.url_ingest), or the objects an
    ``s3://`` URL names (catalog.s3_ingest); its state after."""
    version = (
        AssetVersion.objects.unscoped()
        .select_related("asset__workspace")
        .filter(pk=version_id, state=AssetVersion.State.INGESTING)
        .first()
    )
    if version is None:
        return "gone"  # deleted, or failed by the sweep meanwhile
    url_ingest.download(version, url, name)
    return str(version.state)


def start_prefix_ingest(asset: Asset, prefix: str, *, user: Any = None) -> AssetVersion:
    """A new version from the workspace's ``prefix`` (``catalog.prefixes.start``), read by a
    worker once the version is written."""
    version = prefixes.start(asset, prefix, user=user)
    transaction.on_commit(lambda: ingest_prefix.delay(version.pk, prefix))
    return version


@shared_task(
    ignore_result=True,
    time_limit=INGEST_TIME_LIMIT_SECONDS,
    soft_time_limit=INGEST_TIME_LIMIT_SECONDS - 60,
)
def ingest_prefix(version_id: int, prefix: str) -> str:
    """Read a version's files from the workspace's prefix (catalog.prefixes); its state."""
    version = (
        AssetVersion.objects.unscoped()
        .select_related("asset__workspace")
        .filter(pk=version_id, state=AssetVersion.State.INGESTING)
        .first()
    )
    if version is None:
        return "gone"
    prefixes.read(version, prefix)
    return str(version.state)
