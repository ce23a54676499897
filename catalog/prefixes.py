"""A dataset version registered in place from a prefix (issue 33): ``POST …/versions/`` with
``{"source": "prefix", "prefix": "raw/2026-11"}``, ``tau data dataset register NAME PREFIX``.

A workspace's prefixes are folders under its own folder of ``TAU_DATA_PREFIX_DIR``
(``<dir>/<workspace slug>/``; empty setting: ``VAR_DIR/prefixes``) — typically the
workspace's PersistentVolumeClaim, or a share, mounted there in the portal's pods, where data
already is. Registering one checks it and records it; nothing is copied: the version keeps
where its files live (``AssetVersion.in_place``, ``prefix``) and their manifest, and every
later read — a run's staging, a cluster's stager, a download, ``verify`` — reads them there,
checked against the manifest (catalog.in_place), so a file changed afterwards is refused,
named, rather than read.

The request is checked at once (a relative path without ``..``, resolved, inside the
workspace's own folder: another workspace's folder cannot be named by any spelling) and the
version made ``ingesting``; a Celery task (``catalog.tasks.ingest_prefix``) lists and hashes
every file, with progress: regular files only (a symlink, a device, a FIFO fails the version,
naming it), within the limits on files and sizes. Then, ``verifying``, each file is found
unchanged since it was hashed, and the version is ``ready`` with its manifest — or ``failed``
naming the file. The bytes occupy the workspace's own volume, not the store: they do not
count against the storage quota, and deleting the version leaves them where they are.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from catalog import in_place
from catalog.in_place import workspace_folder
from catalog.ingest import (
    CatalogError,
    Progress,
    claim,
    create_version,
    fail_on_the_way,
    lock_asset,
    make_ready,
)
from catalog.models import Asset, AssetVersion
from tau.manifest import Entry, Manifest, ManifestError, check_path, list_files

__all__ = ["folder_of", "read", "start", "workspace_folder"]


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
    """The asset's next version, ``ingesting`` in place at ``prefix``; the caller queues the
    read (``catalog.tasks.start_prefix_ingest``)."""
    folder_of(asset.workspace, prefix)
    clean = prefix.strip("/")
    with transaction.atomic():
        lock_asset(asset)
        return create_version(
            asset,
            source=AssetVersion.Source.PREFIX,
            source_detail=clean[:1024] or ".",
            in_place=True,
            prefix=clean,
            created_by=user,
        )


def read(version: AssetVersion, prefix: str) -> None:
    """Hash the files at the version's prefix into its manifest: ``ready``, or ``failed``
    saying why — unless the sweep failed it meanwhile (taken for dead), whose word stands.
    (``prefix``: the one asked for, for a version queued before versions kept their
    prefix.)"""
    if not version.in_place:
        version.in_place, version.prefix = True, prefix.strip("/")
        version.save(update_fields=["in_place", "prefix"])
    workspace = version.asset.workspace
    max_files = int(settings.TAU_DATA_MAX_FILES)
    try:
        try:
            folder = folder_of(workspace, version.prefix)
        except CatalogError as exc:
            raise ManifestError(str(exc)) from None
        listed = list_files(
            folder, max_files=max_files, max_file_bytes=int(settings.TAU_DATA_MAX_FILE_BYTES)
        )
        version.bytes_total = sum(item.size for item in listed)
        version.save(update_fields=["bytes_total"])
        progress = Progress(version)
        entries: list[Entry] = []
        identities: list[str] = []
        for item in listed:
            try:
                hashed = in_place.hash_file(folder, item.path, progress.add)
            except FileNotFoundError:
                raise ManifestError(f"{item.path} disappeared while the prefix was read.") from None
            except OSError as exc:
                raise ManifestError(f"{item.path}: {exc.strerror}.") from None
            if hashed.size != item.size:
                raise ManifestError(
                    f"{item.path} changed while it was read ({item.size:,} bytes listed, "
                    f"{hashed.size:,} read)."
                )
            entries.append(Entry(item.path, hashed.size, hashed.sha256))
            identities.append(hashed.identity)
        manifest = Manifest.of(entries, max_files=max_files)
        if not claim(version, AssetVersion.State.INGESTING, AssetVersion.State.VERIFYING):
            return  # the sweep took this worker for dead and failed it: its word stands
        # Each file as it was when hashed: one written meanwhile would make the manifest
        # lie from the start.
        for entry, identity in zip(entries, identities, strict=True):
            if in_place.identity_now(folder, entry.path) != identity:
                raise ManifestError(
                    f"{entry.path} changed while the prefix was read: register it again once "
                    "it is written."
                )
        make_ready(version, manifest, files_recorded=False)
    except ManifestError as exc:
        fail_on_the_way(version, str(exc))
