"""Where the catalog keeps bytes: each workspace's files once per SHA-256.

``TAU_STORAGE_URL`` names the store; ``file://<folder>`` is the embedded default
(``var/storage/``). A workspace's blobs are ``<folder>/workspaces/<id>/blobs/<ab>/<sha256>``:
two versions with a file in common keep it once, and no workspace's store holds another's
bytes (nor tells it, by a blob that is already there, what another has). A blob is written
under a temporary name in the same folder and renamed once its digest is known, so a crash
leaves no blob whose name lies about its content; beside it, ``<sha256>.checked`` remembers
the file as it was when hashed (:func:`is_checked`: staging trusts a blob unchanged since,
and hashes one that changed). ``verify`` always reads every byte again.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tau.manifest import hash_file

_SHA256 = re.compile(r"[0-9a-f]{64}")


def root() -> Path:
    """The store's folder, from ``TAU_STORAGE_URL`` (``file://`` only, so far)."""
    url = str(getattr(settings, "TAU_STORAGE_URL", "") or "")
    if not url:
        return Path(settings.VAR_DIR) / "storage"
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise ImproperlyConfigured(
            f"TAU_STORAGE_URL={parts.scheme}://…: this portal keeps data in a folder "
            "(file:///path/to/storage) only so far."
        )
    return Path(unquote(parts.path))


def workspace_root(workspace_id: int) -> Path:
    return root() / "workspaces" / str(int(workspace_id))


def blob_path(workspace_id: int, sha256: str) -> Path:
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"{sha256!r} is not a SHA-256 hex digest")
    return workspace_root(workspace_id) / "blobs" / sha256[:2] / sha256


def hash_blob(path: Path) -> tuple[int, str]:
    """The size and SHA-256 of a stored blob, read again (FileNotFoundError: it is gone)."""
    if not path.is_file():
        raise FileNotFoundError(path)
    return hash_file(path, name=path.name)


def write_blob(
    workspace_id: int,
    source: Path,
    on_bytes: Callable[[int], None] | None = None,
    *,
    name: str | None = None,
) -> tuple[int, str]:
    """Copy the regular file ``source`` (``name`` in messages) into the workspace's store,
    hashing as it is read (once); returns its size and SHA-256. Refuses a file that is not
    regular once opened (a symlink or a FIFO put in its place)."""
    temporary = workspace_root(workspace_id) / "blobs" / "incoming" / uuid.uuid4().hex
    temporary.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temporary.open("xb") as writer:
            size, sha256 = hash_file(source, on_bytes, name=name or source.name, sink=writer.write)
            writer.flush()
            os.fsync(writer.fileno())
        keep_part(workspace_id, temporary, sha256, size)  # or dropped: kept already
        return size, sha256
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def has_blob(workspace_id: int, sha256: str, size: int) -> bool:
    """Whether the workspace's store holds the blob ``sha256`` whole (by its size)."""
    try:
        return blob_path(workspace_id, sha256).stat().st_size == size
    except FileNotFoundError:
        return False


def upload_part(workspace_id: int, version_id: int, file_id: int) -> Path:
    """Where the bytes of one uploaded file gather until it is whole (catalog.uploads)."""
    return workspace_root(workspace_id) / "uploads" / str(int(version_id)) / str(int(file_id))


def keep_part(workspace_id: int, part: Path, sha256: str, size: int) -> None:
    """Make the whole, checked upload ``part`` the workspace's blob ``sha256`` (a rename in
    the same store; dropped if the blob is there already)."""
    final = blob_path(workspace_id, sha256)
    final.parent.mkdir(parents=True, exist_ok=True)
    if has_blob(workspace_id, sha256, size):
        part.unlink()
    else:
        os.replace(part, final)
        mark_checked(final)


def _mark(blob: Path) -> Path:
    return blob.with_name(f"{blob.name}.checked")


def _identity(blob: Path) -> str:
    found = blob.stat()
    return f"{found.st_ino} {found.st_mtime_ns} {found.st_size}\n"


def mark_checked(blob: Path) -> None:
    """Remember that ``blob``'s bytes were hashed and match its name, as the file is now
    (inode, modification time, size): a reader may trust it until the file changes."""
    temporary = blob.with_name(f".{blob.name}.{uuid.uuid4().hex}")
    temporary.write_text(_identity(blob))
    os.replace(temporary, _mark(blob))


def is_checked(blob: Path) -> bool:
    """Whether ``blob`` is as it was when last hashed (:func:`mark_checked`): any write to
    it since (a new modification time, size or inode) says no."""
    try:
        return _mark(blob).read_text() == _identity(blob)
    except (FileNotFoundError, NotADirectoryError):
        return False


def forget_blob(workspace_id: int, sha256: str) -> None:
    blob = blob_path(workspace_id, sha256)
    blob.unlink(missing_ok=True)
    _mark(blob).unlink(missing_ok=True)


def drop_uploads(workspace_id: int, version_id: int) -> None:
    """Forget the pieces of a version's uploads (it is ready, failed or gone)."""
    shutil.rmtree(
        workspace_root(workspace_id) / "uploads" / str(int(version_id)), ignore_errors=True
    )
