"""Staging a local attempt's datasets (issue 33): every file of every version the run pinned
(``catalog.runs.staging_plan``) at ``TAU_DATA_DIR/<path>/<file>``, read-only in the sandbox.

Each file comes from a local file the store gives (``catalog.storage.local_copy``): a folder
store's own blob, or, for an S3 store, this machine's cached copy, fetched once and hashed as
it is fetched (one whose bytes are not those its name says is never cached). A file is trusted
as its last hash left it (``catalog.storage.is_checked``: the same inode, modification time
and size as when its SHA-256 was last computed, at ingest, at fetch or at an earlier staging);
one that changed since is read again and its SHA-256 checked against the manifest before the
workload can see it: a missing or changed file fails the attempt as ``infrastructure``, naming
the version and the file. A version registered in place has no blob: each of its files is
read where it lives, under its prefix (``catalog.in_place.local_copy``), into the same cache
of copies, hashed as it is copied; a file remembered as unchanged since it matched is not
read again. One that is missing, or changed since it was registered, fails the attempt as
``infrastructure`` too, naming the file, and its bytes are never cached. A checked file is
then linked into the attempt's ``data/`` folder (a hard link: no copy when the store or the
cache shares the disk, which the embedded default's does), or copied where it does not. The
folder is mounted read-only in the sandbox; the files themselves are read-only too (a copy's,
never the workspace's own file in place).

Filesystem only, and the S3 store's API when it fetches: this runs in the preparation's worker
thread.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from catalog import in_place, storage
from catalog.runs import StagedDataset
from tau.manifest import ManifestError, hash_file


class StagingFailed(RuntimeError):
    """A pinned file that cannot be staged; the message names the version and the file."""


@dataclass(frozen=True)
class Staged:
    files: int
    bytes: int
    seconds: float

    def said(self) -> str:
        return f"{self.files:,} files, {self.bytes:,} bytes in {self.seconds:.1f} s"


def stage(datasets: tuple[StagedDataset, ...], data_dir: Path) -> Staged:
    """Put every file of ``datasets`` under ``data_dir``, each checked against its digest."""
    started = time.monotonic()
    files = 0
    total = 0
    data_dir.mkdir(parents=True, exist_ok=True)
    for dataset in datasets:
        root = data_dir / dataset.path
        folder = _in_place_folder(dataset)
        for item in dataset.files:
            target = root / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if folder is None:
                _place(dataset, item.path, item.size, item.sha256, target)
            else:
                _place_in_place(dataset, folder, item.path, item.size, item.sha256, target)
            files += 1
            total += item.size
    return Staged(files=files, bytes=total, seconds=time.monotonic() - started)


def _place(dataset: StagedDataset, path: str, size: int, sha256: str, target: Path) -> None:
    where = f"{dataset.ref}: {path}"
    try:
        blob = storage.local_copy(dataset.workspace_id, sha256)
    except FileNotFoundError:
        raise StagingFailed(f"{where} is missing from the workspace's store.") from None
    except storage.StoredCopyDiffers as exc:
        raise StagingFailed(
            f"{where}: the stored copy differs from the manifest (SHA-256 {exc.found} instead "
            f"of {sha256}); the version cannot be read until it is ingested again."
        ) from None
    except storage.StorageError as exc:
        raise StagingFailed(f"{where} could not be fetched: {exc.strerror}.") from None
    if not storage.is_checked(blob):
        # Changed since it was hashed (or never marked): read it all before trusting it.
        try:
            found_size, found = hash_file(blob, name=where)
        except ManifestError as exc:
            raise StagingFailed(f"{where} is missing from the workspace's store ({exc}).") from None
        if (found_size, found) != (size, sha256):
            raise StagingFailed(
                f"{where}: the stored copy differs from the manifest (SHA-256 {found} instead "
                f"of {sha256}); the version cannot be read until it is ingested again."
            )
        storage.mark_checked(blob)
    _link(where, blob, target)


def _in_place_folder(dataset: StagedDataset) -> Path | None:
    """The folder a version registered in place reads from, resolved now; None: the store."""
    if dataset.in_place is None:
        return None
    try:
        return dataset.in_place.folder()
    except OSError as exc:
        raise StagingFailed(
            f"{dataset.ref} is registered in place at {dataset.in_place.said}, and "
            f"{exc.strerror}: the version cannot be read."
        ) from None


def _place_in_place(
    dataset: StagedDataset, folder: Path, path: str, size: int, sha256: str, target: Path
) -> None:
    where = f"{dataset.ref}: {path}"
    said = dataset.in_place.said if dataset.in_place is not None else "."
    try:
        copy = in_place.local_copy(dataset.workspace_id, folder, path, size, sha256)
    except FileNotFoundError:
        raise StagingFailed(
            f"{where} is missing from {said}, where the version was registered in place."
        ) from None
    except in_place.ChangedInPlace as exc:
        raise StagingFailed(
            f"{where}: {exc.strerror}; the version cannot be read until the file is put back "
            "(or the prefix registered again as a new version)."
        ) from None
    except OSError as exc:
        raise StagingFailed(f"{where} could not be read from {said}: {exc.strerror}.") from None
    _link(where, copy, target)


def _link(where: str, blob: Path, target: Path) -> None:
    try:
        os.link(blob, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise StagingFailed(f"{where} could not be staged: {exc.strerror}.") from None
        _copy(blob, target)
    # The link shares the blob's inode: read-only for everyone, as blobs are kept.
    os.chmod(target, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)


def _copy(source: Path, target: Path) -> None:
    with source.open("rb") as reader, target.open("xb") as writer:
        while chunk := reader.read(1024 * 1024):
            writer.write(chunk)
