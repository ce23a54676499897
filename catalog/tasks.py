"""The catalog's periodic work (Celery beat: ``sweep-catalog-versions``)."""

from __future__ import annotations

from celery import shared_task

from catalog.sweep import sweep_versions as sweep


@shared_task(ignore_result=True)
def sweep_versions() -> dict[str, int]:
    """Versions a dead process left ingesting or verifying (catalog.sweep)."""
    return sweep()


@shared_task(ignore_result=True)
def ingest_url(version_id: int, url: str, name: str) -> str:
    """Download a version's one file from ``url`` (catalog.url_ingest); its state after."""
    from catalog.models import AssetVersion
    from catalog.url_ingest import download

    version = (
        AssetVersion.objects.unscoped()
        .select_related("asset__workspace")
        .filter(pk=version_id, state=AssetVersion.State.INGESTING)
        .first()
    )
    if version is None:
        return "gone"  # deleted, or failed by the sweep meanwhile
    download(version, url, name)
    return str(version.state)
