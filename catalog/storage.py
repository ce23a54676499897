"""Where the catalog keeps bytes: each workspace's files once per SHA-256.

``TAU_STORAGE_URL`` names the store; ``file://<folder>`` is the embedded default
(``var/storage/``). A workspace's blobs are ``<folder>/workspaces/<id>/blobs/<ab>/<sha256>``:
two versions with a file in common keep it once, and no workspace's store holds another's
bytes (nor tells it, by a blob that is already there, what another has). A blob is written
under a temporary name in the same folder and renamed once its digest is known, so a crash
leaves no blob whose name lies about its content.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tau.manifest import CHUNK_BYTES, ManifestError, hash_file

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
    shown = name or source.name
    temporary = workspace_root(workspace_id) / "blobs" / "incoming" / uuid.uuid4().hex
    temporary.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(source, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ManifestError(f"{shown} is a symlink; only files and folders are kept.") from exc
        raise ManifestError(f"{shown} cannot be read: {exc.strerror}.") from exc
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(descriptor, "rb", buffering=0) as reader:
            if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
                raise ManifestError(f"{shown} is no longer a regular file.")
            with temporary.open("xb") as writer:
                buffer = bytearray(CHUNK_BYTES)
                view = memoryview(buffer)
                while count := reader.readinto(buffer):
                    digest.update(view[:count])
                    writer.write(view[:count])
                    size += count
                    if on_bytes is not None:
                        on_bytes(count)
                writer.flush()
                os.fsync(writer.fileno())
        sha256 = digest.hexdigest()
        final = blob_path(workspace_id, sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() and final.stat().st_size == size:
            temporary.unlink()  # kept already, by an earlier version
        else:
            os.replace(temporary, final)
        return size, sha256
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
