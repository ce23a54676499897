"""Deleting one version of a dataset or model (issue 33): ``DELETE …/versions/{v}/``.

A version that nothing names goes whole: its row, its file rows, its aliases. A version that
a record names — a run read it (``RunInput``) or made it (``produced_by``), or another version
was derived from it — keeps its row and its manifest (every file's path, size and SHA-256) as
state ``deleted``, with when and by whom: the run's sealed evidence still proves which bytes
were used, and the pages say the files are gone. Either way its aliases go (an alias names a
version whose files can be read), and then every blob no other version of the workspace still
holds is removed from the store. A version registered in place has no blob: deleting it
removes nothing from the store and never touches its files, which stay in the workspace's
folder where they were (the workspace's own data; only the version goes). A version still
being ingested or verified is refused: wait for it, or for the sweep to fail it. So is a
version an endpoint's record names (the model version it serves), files included: its pods
fetch them whenever they start.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import router, transaction
from django.db.models import ProtectedError
from django.db.models.deletion import Collector
from django.utils import timezone

from catalog import storage
from catalog.ingest import CatalogError, held_shas, kept_by, lock_asset
from catalog.models import AssetAlias, AssetFile, AssetVersion, RunInput

logger = logging.getLogger(__name__)


def named_by(version: AssetVersion) -> str | None:
    """What record names ``version`` (said for people), or None."""
    workspace_id = version.asset.workspace_id
    read = (
        RunInput.objects.for_workspace(workspace_id)
        .filter(version=version)
        .select_related("run")
        .first()
    )
    if read is not None:
        return f"the run {read.run.name} read it"
    if version.produced_by_id is not None:
        return "the run that made it names it"
    derived = version.derivatives.order_by("pk").first()
    if derived is not None:
        return f"{derived.ref} was made from it"
    return None


def held_elsewhere(version: AssetVersion) -> str | None:
    """Who outside the catalog keeps the version through a protected key, said for people,
    or None: an endpoint's record names the model version it serves, whose files its pods
    fetch whenever they start, so neither its row nor its files go (even when a run's record
    would keep the row alone). Found by Django's own deletion collector, which finds every
    such key: those apps are above the catalog, which does not know them."""
    try:
        Collector(using=router.db_for_write(AssetVersion)).collect([version])
    except ProtectedError as exc:
        # A run's RunInput is the catalog's own: it keeps the row as a record (named_by).
        elsewhere = [
            row
            for row in exc.protected_objects
            if row._meta.app_label != AssetVersion._meta.app_label
        ]
        if elsewhere:
            return kept_by(elsewhere)
    return None


def delete_version(version: AssetVersion, *, user: Any = None) -> bool:
    """Delete the version's files (module docstring): True when the version is gone whole,
    False when it stays as a record. CatalogError when it cannot be deleted now, or at all
    while another app's record names it (:func:`held_elsewhere`)."""
    if version.state in (AssetVersion.State.INGESTING, AssetVersion.State.VERIFYING):
        raise CatalogError(
            f"{version.ref} is {version.state}: wait until it is ready or failed, then delete it."
        )
    if version.state == AssetVersion.State.DELETED:
        raise CatalogError(f"{version.ref}'s files were deleted already.")
    held = held_elsewhere(version)
    if held is not None:
        raise CatalogError(f"{version.ref} is named by {held}: it is kept, files too.")
    asset = version.asset
    workspace_id = asset.workspace_id
    version_id = version.pk
    try:
        with transaction.atomic():
            lock_asset(asset)
            # In place: the files are the workspace's own, never deleted; the store has no blob.
            shas = (
                set()
                if version.in_place
                else set(
                    AssetFile.objects.for_workspace(workspace_id)
                    .filter(version=version)
                    .values_list("sha256", flat=True)
                )
            )
            AssetAlias.objects.for_workspace(workspace_id).filter(version=version).delete()
            why_kept = named_by(version)
            if why_kept is None:
                version.delete()
            else:
                version.state = AssetVersion.State.DELETED
                version.deleted_at = timezone.now()
                version.deleted_by = user
                version.save(update_fields=["state", "deleted_at", "deleted_by"])
            still_held = held_shas(workspace_id, shas)
    except ProtectedError as exc:  # named since held_elsewhere looked: nothing of it went
        raise CatalogError(
            f"{version.ref} is named by {kept_by(exc.protected_objects)}: it is kept."
        ) from None
    for sha256 in shas - still_held:
        storage.forget_blob(workspace_id, sha256)
    storage.drop_uploads(workspace_id, version_id)
    logger.info(
        "%s %s deleted%s: %d blob(s) removed",
        asset.kind,
        f"{asset.name}@{version.number}",
        "" if why_kept is None else f" (its manifest kept: {why_kept})",
        len(shas - still_held),
    )
    return why_kept is None
