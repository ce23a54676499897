"""Versions whose files a client sends over the API, resumable (issue 33).

The client first declares the whole manifest — every file's path, size and SHA-256
(:func:`start_upload`) — and the version is made ``ingesting`` with a row per file. Files the
workspace's store already holds whole (the same bytes in an earlier version) count as sent.
Then the client sends each remaining file, in pieces of at most
``TAU_DATA_UPLOAD_PIECE_BYTES``, each starting where the last ended (:func:`receive`); the
store keeps the pieces of a file until it is whole, then checks its SHA-256 against the
declaration and keeps it as the workspace's blob. When the last file is kept, the version is
checked and made ``ready`` (:func:`finish_if_whole`).

Interrupted anywhere — the client killed, the connection lost, the portal restarted — nothing
is ``ready`` that is not whole, and nothing sent is sent again: declaring the same manifest
finds the same ``ingesting`` version, and each file says how many bytes it holds
(``received``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from catalog import storage
from catalog.ingest import (
    CatalogError,
    check_and_make_ready,
    check_storage_quota,
    create_version,
    fail,
    lock_asset,
)
from catalog.models import Asset, AssetFile, AssetVersion
from tau.manifest import CHUNK_BYTES, Entry, Manifest, ManifestError, hash_file

#: The largest declaration of an upload's files, as JSON (about 400,000 files of paths of
#: usual lengths; a larger version is declared by a folder the portal reads, for now).
DECLARATION_BYTES = 64 * 2**20


class NotDeclared(CatalogError):
    """A file the version's declaration does not hold."""


class NotReceiving(CatalogError):
    """The version takes no more bytes (ready, failed, or not an upload)."""


class OutOfOrder(CatalogError):
    """A piece that does not start where the file's bytes so far end."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


class TooLarge(CatalogError):
    """A piece larger than one request may carry."""


@dataclass(frozen=True)
class Received:
    """What one piece did: the file's row after it, and whether the bytes did not match the
    declared SHA-256 (the file was dropped, to be sent again from its first byte)."""

    file: AssetFile
    mismatch: str = ""


def start_upload(asset: Asset, files: Any, *, user: Any = None) -> tuple[AssetVersion, bool]:
    """The ``ingesting`` version for the declared ``files`` (``[{path, size, sha256}]``): a new
    one, or the one an interrupted upload of the same files left (``created`` False)."""
    try:
        manifest = Manifest.from_dict(
            {"format": 1, "files": files}, max_files=settings.TAU_DATA_MAX_FILES
        )
    except ManifestError as exc:
        raise CatalogError(str(exc)) from exc
    if not manifest.files:
        raise CatalogError("An upload declares at least one file.")
    limit = settings.TAU_DATA_MAX_FILE_BYTES
    for entry in manifest.files:
        if entry.size > limit:
            raise CatalogError(
                f"{entry.path} is {entry.size:,} bytes; one file may be at most {limit:,} "
                "(TAU_DATA_MAX_FILE_BYTES)."
            )
    workspace_id = asset.workspace_id
    declared = manifest.digest
    with transaction.atomic():
        lock_asset(asset)
        waiting = (
            AssetVersion.objects.for_workspace(workspace_id)
            .filter(
                asset=asset,
                state=AssetVersion.State.INGESTING,
                source=AssetVersion.Source.UPLOAD,
                declared_digest=declared,
            )
            .first()
        )
        if waiting is not None:
            return waiting, False
        kept = {
            entry.sha256
            for entry in manifest.files
            if storage.has_blob(workspace_id, entry.sha256, entry.size)
        }
        held = (
            set(
                AssetFile.objects.for_workspace(workspace_id)
                .filter(sha256__in=[entry.sha256 for entry in manifest.files])
                .exclude(version__state=AssetVersion.State.FAILED)
                .values_list("sha256", flat=True)
            )
            | kept
        )
        new_bytes = {e.sha256: e.size for e in manifest.files if e.sha256 not in held}
        check_storage_quota(asset.workspace, sum(new_bytes.values()), what="This upload")
        version = create_version(
            asset,
            source=AssetVersion.Source.UPLOAD,
            source_detail=f"{manifest.files_count:,} files uploaded",
            created_by=user,
            declared_digest=declared,
            bytes_total=manifest.total_bytes,
            bytes_done=sum(entry.size for entry in manifest.files if entry.sha256 in kept),
        )
        AssetFile.objects.bulk_create(
            [
                AssetFile(
                    version=version,
                    path=entry.path,
                    size=entry.size,
                    sha256=entry.sha256,
                    stored=entry.sha256 in kept,
                    received=entry.size if entry.sha256 in kept else 0,
                )
                for entry in manifest.files
            ],
            batch_size=5000,
        )
    finish_if_whole(version)
    return version, True


def receive(
    version: AssetVersion,
    path: str,
    body: BinaryIO,
    *,
    length: int,
    start: int = 0,
    total: int | None = None,
) -> Received:
    """Write ``length`` bytes read from ``body`` into the declared file ``path`` from byte
    ``start`` (``total``: the file's whole size, as the client knows it)."""
    if (
        version.source != AssetVersion.Source.UPLOAD
        or version.state != AssetVersion.State.INGESTING
    ):
        raise NotReceiving(
            f"{version.ref} is {version.state}: it takes no more files. Declare the files "
            "again to start a new version."
        )
    workspace_id = version.asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id).filter(version=version)
    if not files.filter(path=path).exists():
        raise NotDeclared(f"{version.ref} declared no file {path!r}.")
    if length > settings.TAU_DATA_UPLOAD_PIECE_BYTES:
        raise TooLarge(
            f"A piece of {length:,} bytes: send at most {settings.TAU_DATA_UPLOAD_PIECE_BYTES:,} "
            "per request (TAU_DATA_UPLOAD_PIECE_BYTES)."
        )
    with transaction.atomic():
        row = files.select_for_update().get(path=path)
        if total is not None and total != row.size:
            raise CatalogError(f"{path} was declared as {row.size:,} bytes, not {total:,}.")
        if row.stored:
            return Received(row)
        part = storage.upload_part(workspace_id, version.pk, row.pk)
        if row.received < row.size or row.size == 0:
            if start != row.received:
                raise OutOfOrder(
                    f"{path}: the portal holds its first {row.received:,} bytes; send the "
                    f"piece that starts there, not at {start:,}.",
                    row.received,
                )
            if start + length > row.size:
                raise CatalogError(
                    f"{path}: a piece of {length:,} bytes from {start:,} ends past its "
                    f"declared size, {row.size:,} bytes."
                )
            written = _write_piece(part, body, start, length)
            row.received = start + written
            row.save(update_fields=["received"])
            AssetVersion.objects.for_workspace(workspace_id).filter(pk=version.pk).update(
                bytes_done=F("bytes_done") + written, touched_at=timezone.now()
            )
        # Else every byte is here and the file was not kept yet (a request that stopped
        # between the two steps): this one keeps it, whatever it sent.
    if row.received != row.size:
        return Received(row)
    # Whole: hashed and kept outside the row's lock (an S3 store's PUT of the whole file
    # takes a while); only then marked stored, in a second short step.
    return _keep(version, row, part)


def _keep(version: AssetVersion, row: AssetFile, part: Path) -> Received:
    """The whole part checked against its declared SHA-256 and kept in the store (then the
    version finished if it was the last), or dropped, saying so."""
    workspace_id = version.asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id).filter(pk=row.pk)
    try:
        size, sha256 = hash_file(part, name=row.path)
    except FileNotFoundError:
        # Another request kept (or dropped) it meanwhile: answer what it left.
        row.refresh_from_db()
        return Received(row)
    if (size, sha256) == (row.size, row.sha256):
        storage.keep_part(workspace_id, part, sha256, size)
        files.filter(stored=False).update(stored=True)
        row.stored = True
        finish_if_whole(version)
        return Received(row)
    part.unlink(missing_ok=True)
    with transaction.atomic():
        if files.filter(stored=False, received=row.size).update(received=0):
            AssetVersion.objects.for_workspace(workspace_id).filter(pk=version.pk).update(
                bytes_done=F("bytes_done") - row.size, touched_at=timezone.now()
            )
    row.received = 0
    return Received(
        row,
        f"{row.path}: the bytes sent do not match its declared SHA-256 ({sha256} instead of "
        f"{row.sha256}); nothing of it is kept. Send it again from its first byte.",
    )


def _write_piece(part: Path, body: BinaryIO, start: int, length: int) -> int:
    """Bytes from ``body`` written into ``part`` from ``start`` (what was there past it, from
    a piece cut short before it was counted, dropped first); how many arrived."""
    part.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    written = 0
    with os.fdopen(descriptor, "wb") as file:
        file.truncate(start)
        file.seek(start)
        while written < length:
            chunk = body.read(min(CHUNK_BYTES, length - written))
            if not chunk:
                break
            file.write(chunk)
            written += len(chunk)
        file.flush()
        os.fsync(file.fileno())
    return written


def finish_if_whole(version: AssetVersion) -> None:
    """Once every declared file is kept: ``verifying``, each checked in the store, ``ready``
    (or ``failed`` naming the file). Called after every kept file; one caller does it."""
    workspace_id = version.asset.workspace_id
    files = AssetFile.objects.for_workspace(workspace_id).filter(version=version)
    with transaction.atomic():
        locked = (
            AssetVersion.objects.for_workspace(workspace_id).select_for_update().get(pk=version.pk)
        )
        if locked.state != AssetVersion.State.INGESTING or files.filter(stored=False).exists():
            return
        locked.state = AssetVersion.State.VERIFYING
        locked.touched_at = timezone.now()
        locked.save(update_fields=["state", "touched_at"])
    version.state = AssetVersion.State.VERIFYING
    manifest = Manifest.of(
        Entry(path, size, sha256)
        for path, size, sha256 in files.values_list("path", "size", "sha256")
    )
    try:
        if manifest.digest != version.declared_digest:
            raise ManifestError("the files kept are not the files declared; upload them again.")
        check_and_make_ready(version, manifest, files_recorded=True)
    except ManifestError as exc:
        fail(version, str(exc))
    storage.drop_uploads(workspace_id, version.pk)
