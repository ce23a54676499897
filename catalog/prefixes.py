"""A dataset version registered from a prefix (issue 33): ``POST …/versions/`` with
``{"source": "prefix", "prefix": "raw/2026-11"}``, ``tau data dataset register NAME PREFIX``.

A workspace's prefixes are folders under its own folder of ``TAU_DATA_PREFIX_DIR``
(``<dir>/<workspace slug>/``; empty setting: ``VAR_DIR/prefixes``) — typically the
workspace's PersistentVolumeClaim, or a share, mounted there in the portal's pods, where data
already is: registering one reads every file under it, checks it (regular files only, no
symlink, device or path that leaves the folder; the limits on files and sizes; the storage
quota) and keeps it in the workspace's store, content-addressed, so the version stays the
same bytes whatever later happens to the folder. The request is checked at once and the
version made ``ingesting``; a Celery task (``catalog.tasks.ingest_prefix``) reads the files,
with progress, to ``ready`` or ``failed`` naming the file. Another workspace's folder cannot be
named: the prefix is a relative path inside the workspace's own, resolved before use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from catalog.ingest import CatalogError, create_version, fill_version, lock_asset
from catalog.models import Asset, AssetVersion
from tau.manifest import ManifestError, check_path, list_files


def workspace_folder(workspace: Any) -> Path:
    """The workspace's folder of prefixes (it may not exist)."""
    base = str(getattr(settings, "TAU_DATA_PREFIX_DIR", "") or "")
    root = Path(base) if base else Path(settings.VAR_DIR) / "prefixes"
    return root / str(workspace.slug)


def folder_of(workspace: Any, prefix: str) -> Path:
    """The folder ``prefix`` names in the workspace's own, checked: a relative path without
    ``..`` or hidden characters, that exists, is a folder, and (symlinks resolved) stays
    inside the workspace's folder. CatalogError otherwise."""
    clean = prefix.strip("/")
    if clean:
        try:
            check_path(clean)
        except ManifestError as exc:
            raise CatalogError(f"prefix: {exc}") from None
    base = workspace_folder(workspace)
    if not base.is_dir():
        raise CatalogError(
            f"{workspace.slug} has no folder of prefixes on the portal ({base}): the platform "
            "team mounts the workspace's data there (TAU_DATA_PREFIX_DIR)."
        )
    folder = base / clean if clean else base
    real_base = os.path.realpath(base)
    real = os.path.realpath(folder)
    if real != real_base and not real.startswith(real_base + os.sep):
        raise CatalogError(f"prefix {prefix!r} leads out of the workspace's folder.")
    if not os.path.isdir(real):
        raise CatalogError(f"{workspace.slug} has no folder {clean or '.'!r} to register.")
    return Path(real)


def start(asset: Asset, prefix: str, *, user: Any = None) -> AssetVersion:
    """The asset's next version, ``ingesting`` from ``prefix``; the caller queues the read
    (``catalog.tasks.start_prefix_ingest``)."""
    folder_of(asset.workspace, prefix)
    with transaction.atomic():
        lock_asset(asset)
        return create_version(
            asset,
            source=AssetVersion.Source.PREFIX,
            source_detail=prefix.strip("/")[:1024] or ".",
            created_by=user,
        )


def read(version: AssetVersion, prefix: str) -> None:
    """Fill the version from the prefix's files: ``ready``, or ``failed`` saying why."""
    workspace = version.asset.workspace
    max_files = int(settings.TAU_DATA_MAX_FILES)

    def listing() -> list[tuple[str, Path, int]]:
        try:
            folder = folder_of(workspace, prefix)
        except CatalogError as exc:
            raise ManifestError(str(exc)) from None
        return [
            (item.path, item.absolute, item.size)
            for item in list_files(
                folder,
                max_files=max_files,
                max_file_bytes=int(settings.TAU_DATA_MAX_FILE_BYTES),
            )
        ]

    fill_version(version, listing, max_files=max_files)
