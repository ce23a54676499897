"""The catalog's periodic work (Celery beat: ``sweep-catalog-versions``)."""

from __future__ import annotations

from celery import shared_task

from catalog.sweep import sweep_versions as sweep


@shared_task(ignore_result=True)
def sweep_versions() -> dict[str, int]:
    """Versions a dead process left ingesting or verifying (catalog.sweep)."""
    return sweep()
