"""The files of versions registered in place (issue 33): where they live, and reading them
checked.

A version registered from a prefix (catalog.prefixes) keeps no copy of its files: they stay in
the workspace's folder of prefixes (``TAU_DATA_PREFIX_DIR/<workspace slug>/<prefix>``, the
workspace's PersistentVolumeClaim or a share mounted on the portal) and the version keeps
their manifest. Whatever later happens to that folder, a reader gets the manifest's bytes or
an error naming the file, because every read checks:

- The folder is resolved each time it is read and must still lead into the workspace's own
  folder: a prefix replaced by a symlink to another workspace's data reads nothing. Below it,
  each file is opened one path component at a time without following a symlink, and must be
  a regular file of the manifest's size.
- Bytes are hashed as they stream (:class:`CheckedReader`); the chunk that completes a file
  is handed over only once the file's SHA-256 matched its manifest, so whoever trusts the
  portal never receives the whole of a changed file.
- What a reading found is remembered on this machine (``VAR_DIR/cache/in-place/``: the file's
  identity — device, inode, size, modification and change times — and the SHA-256 it had):
  a file unchanged since need not be read twice to be trusted, and one known to differ is
  refused before a byte is sent.
- A run on this machine reads a copy in the cache of copies (``VAR_DIR/cache/blobs/``,
  catalog.storage), written as it is hashed: one whose bytes are not the manifest's is never
  cached.

Nothing here writes into the workspace's folder; the marks, copies and temporary files are
the portal's own. Filesystem only: no model is imported, so the store's callers and the
executors can read in place without the catalog's services.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

from django.conf import settings

from catalog import storage
from tau.manifest import CHUNK_BYTES, Entry, ManifestError, check_path


class ChangedInPlace(OSError):
    """A file (or the folder) of a version registered in place that is not as registered:
    another size or other bytes, no longer a regular file, behind a symlink, or a folder
    that now leads out of the workspace's. ``strerror`` says how, without the file's name
    (callers name it); ``found`` is the SHA-256 it has now, when that is known."""

    def __init__(self, message: str, *, found: str | None = None) -> None:
        super().__init__(errno.EIO, message)
        self.found = found


def prefixes_root() -> Path:
    """The folder of every workspace's folder of prefixes (``TAU_DATA_PREFIX_DIR``; empty:
    ``VAR_DIR/prefixes``)."""
    base = str(getattr(settings, "TAU_DATA_PREFIX_DIR", "") or "")
    return Path(base) if base else Path(settings.VAR_DIR) / "prefixes"


def workspace_folder(workspace: Any) -> Path:
    """The workspace's folder of prefixes (it may not exist)."""
    return prefixes_root() / str(workspace.slug)


@dataclass(frozen=True)
class Location:
    """Where a version registered in place keeps its files: ``prefix`` ('' for all of it)
    in the workspace's folder of prefixes."""

    workspace_folder: Path
    prefix: str

    @property
    def said(self) -> str:
        """The prefix, for people."""
        return self.prefix or "."

    def folder(self) -> Path:
        """The prefix's folder, resolved now and checked: FileNotFoundError when it (or the
        workspace's folder) is not there, ChangedInPlace when it now leads out of the
        workspace's folder."""
        base = os.path.realpath(self.workspace_folder)
        if not os.path.isdir(base):
            raise FileNotFoundError(
                errno.ENOENT, f"the workspace's folder ({self.workspace_folder}) is gone"
            )
        if self.prefix:
            try:
                check_path(self.prefix)
            except ManifestError as exc:
                raise ChangedInPlace(f"the prefix {self.prefix!r} is refused: {exc}") from None
        real = os.path.realpath(os.path.join(base, self.prefix)) if self.prefix else base
        if real != base and not real.startswith(base + os.sep):
            raise ChangedInPlace(f"the prefix {self.said} now leads out of the workspace's folder")
        if not os.path.isdir(real):
            raise FileNotFoundError(errno.ENOENT, f"the folder {self.said} is gone")
        return Path(real)


def location(workspace: Any, prefix: str) -> Location:
    return Location(workspace_folder(workspace), prefix)


@dataclass(frozen=True)
class Hashed:
    """What reading a file found: its size, SHA-256 and identity when it was read."""

    size: int
    sha256: str
    identity: str


def hash_file(folder: Path, path: str, on_bytes: Callable[[int], None] | None = None) -> Hashed:
    """Read the file ``path`` under ``folder`` (a resolved :meth:`Location.folder`) whole:
    its size, SHA-256 and identity, not remembered (registering does not write a note for
    every file of a version that may never be read here).
    FileNotFoundError: it is not there; ChangedInPlace: it is not a regular file below the
    folder, or it changed while read."""
    descriptor, found = _open(folder, path)
    with os.fdopen(descriptor, "rb", buffering=0) as file:
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        while count := file.readinto(buffer):
            digest.update(view[:count])
            size += count
            if on_bytes is not None:
                on_bytes(count)
        identity = _identity(found)
        if _identity(os.fstat(file.fileno())) != identity:
            raise ChangedInPlace("it changed while it was read")
    return Hashed(size, digest.hexdigest(), identity)


def identity_now(folder: Path, path: str) -> str | None:
    """The file's identity as it is now (None: it is not there)."""
    try:
        return _identity(os.lstat(folder / path))
    except FileNotFoundError:
        return None


def unreadable(folder: Path, path: str, size: int) -> str | None:
    """What is plainly wrong with the file now, without reading it (it is missing, not a
    regular file, or not its manifest's size), or None: a check before a reply starts, so
    that what can be refused up front is."""
    try:
        found = os.lstat(folder / path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    if not stat.S_ISREG(found.st_mode):
        return "no longer a regular file"
    if found.st_size != size:
        return (
            f"changed since it was registered ({found.st_size:,} bytes, the manifest says {size:,})"
        )
    return None


def read_checked(
    workspace_id: int,
    folder: Path,
    path: str,
    size: int,
    sha256: str,
    *,
    hash_first: bool = False,
) -> BinaryIO:
    """The file open for reading, checked against its manifest's ``size`` and ``sha256`` as
    it is read (:class:`CheckedReader`). Refused at once — FileNotFoundError, ChangedInPlace —
    when it is not there, not a regular file, not that size, or remembered to differ.
    ``hash_first``: a file not remembered as unchanged since it matched is read whole first,
    so that a changed one is refused before a byte goes out (a cluster's stager then says so,
    rather than retrying a body cut short)."""
    opened = _Opened.of(workspace_id, folder, path, size, sha256)
    try:
        if hash_first and opened.remembered != sha256:
            opened.check()
        return cast(BinaryIO, opened.reader(close=True))
    except BaseException:
        os.close(opened.descriptor)
        raise


def local_copy(workspace_id: int, folder: Path, path: str, size: int, sha256: str) -> Path:
    """A checked copy of the file on this machine, for a run to link: the cache's copy of
    ``sha256`` (catalog.storage.cache_path), made as the file is read and hashed, never kept
    when the bytes are not the manifest's. The file itself is checked each time: one
    remembered as unchanged since it matched is trusted without reading it (its identity is
    read), any other is read again. FileNotFoundError, ChangedInPlace as
    :func:`read_checked`."""
    cached = storage.cache_path(workspace_id, sha256)
    opened = _Opened.of(workspace_id, folder, path, size, sha256)
    try:
        if storage.is_checked(cached):
            if opened.remembered != sha256:
                opened.check()
            return cached
        cached.parent.mkdir(parents=True, exist_ok=True)
        temporary = cached.with_name(f".{sha256}.{uuid.uuid4().hex}")
        try:
            with opened.reader(close=False) as reader, temporary.open("xb") as writer:
                while chunk := reader.read(CHUNK_BYTES):
                    writer.write(chunk)
                writer.flush()
                os.fsync(writer.fileno())
            os.replace(temporary, cached)
            storage.mark_checked(cached)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
    finally:
        os.close(opened.descriptor)
    return cached


def problems(workspace_id: int, where: Location, entries: Iterable[Entry]) -> list[str]:
    """Every file of the manifest read again where it lives: what is missing, no longer a
    regular file, or not its manifest's bytes, by path (empty: all as registered). What each
    was found to be is remembered, so that a read after it refuses a changed file at once."""
    try:
        folder = where.folder()
    except OSError as exc:
        return [f"{where.said}: {exc.strerror}; the version's files were there"]
    found: list[str] = []
    for entry in entries:
        try:
            hashed = hash_file(folder, entry.path)
        except FileNotFoundError:
            found.append(f"{entry.path}: missing from {where.said}")
            continue
        except ChangedInPlace as exc:
            found.append(f"{entry.path}: {exc.strerror}")
            continue
        except OSError as exc:
            found.append(f"{entry.path}: cannot be read ({exc.strerror})")
            continue
        _remember(workspace_id, folder, entry.path, hashed.identity, hashed.sha256)
        if hashed.size != entry.size:
            found.append(
                f"{entry.path}: changed since it was registered ({hashed.size:,} bytes, the "
                f"manifest says {entry.size:,})"
            )
        elif hashed.sha256 != entry.sha256:
            found.append(
                f"{entry.path}: changed since it was registered (SHA-256 {hashed.sha256}, the "
                f"manifest says {entry.sha256})"
            )
    return found


class CheckedReader(io.RawIOBase):
    """A file read as its manifest says it is: at most ``size`` bytes, hashed as they go; the
    read that completes the file raises ChangedInPlace instead of returning its bytes when
    the SHA-256 differs or more bytes follow, and one that finds the file short raises too.
    ``on_hashed`` is told the SHA-256 found, whichever it is."""

    def __init__(
        self,
        file: io.FileIO,
        size: int,
        sha256: str,
        on_hashed: Callable[[str], None],
    ) -> None:
        super().__init__()
        self._file = file
        self._size = size
        self._sha256 = sha256
        self._on_hashed = on_hashed
        self._digest = hashlib.sha256()
        self._sent = 0
        self._finished = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any, /) -> int:
        if self._finished:
            return 0
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self._size - self._sent)
        count = (self._file.readinto(view[:wanted]) or 0) if wanted else 0
        if wanted and not count:
            raise ChangedInPlace(
                f"it is shorter than registered ({self._sent:,} of {self._size:,} bytes)"
            )
        self._digest.update(view[:count])
        self._sent += count
        if self._sent == self._size:
            self._finish()
        return count

    def _finish(self) -> None:
        self._finished = True
        if self._file.read(1):
            raise ChangedInPlace(f"it is longer than the {self._size:,} bytes registered")
        found = self._digest.hexdigest()
        self._on_hashed(found)
        if found != self._sha256:
            raise ChangedInPlace(
                f"changed since it was registered (SHA-256 {found}, the manifest says "
                f"{self._sha256})",
                found=found,
            )

    def close(self) -> None:
        self._file.close()  # the descriptor too, unless the file was opened not to
        super().close()


@dataclass
class _Opened:
    """A file of a version registered in place, open (``descriptor``: the caller closes it),
    of its manifest's ``size``, not known to differ from its ``sha256``; ``remembered``: the
    SHA-256 it was last found to have, if it has not changed since."""

    descriptor: int
    size: int
    sha256: str
    remembered: str | None
    remember: Callable[[str], None]

    @classmethod
    def of(cls, workspace_id: int, folder: Path, path: str, size: int, sha256: str) -> _Opened:
        descriptor, found = _open(folder, path)
        try:
            if found.st_size != size:
                raise ChangedInPlace(
                    f"changed since it was registered ({found.st_size:,} bytes, the manifest "
                    f"says {size:,})"
                )
            identity = _identity(found)
            remembered = _remembered(workspace_id, folder, path, identity)
            if remembered is not None and remembered != sha256:
                raise ChangedInPlace(
                    f"changed since it was registered (SHA-256 {remembered}, the manifest says "
                    f"{sha256})",
                    found=remembered,
                )
        except BaseException:
            os.close(descriptor)
            raise

        def remember(hashed: str) -> None:
            # Only what the file still is: one written while it was read is not remembered.
            with contextlib.suppress(OSError):
                if _identity(os.fstat(descriptor)) == identity:
                    _remember(workspace_id, folder, path, identity, hashed)

        return cls(descriptor, size, sha256, remembered, remember)

    def reader(self, *, close: bool) -> CheckedReader:
        """A reader from where the descriptor is; ``close``: closing it closes the
        descriptor."""
        file = os.fdopen(self.descriptor, "rb", buffering=0, closefd=close)
        return CheckedReader(file, self.size, self.sha256, self.remember)

    def check(self) -> None:
        """Read it whole now (ChangedInPlace: not its manifest's bytes), then rewind."""
        with self.reader(close=False) as reader:
            while reader.read(CHUNK_BYTES):
                pass
        os.lseek(self.descriptor, 0, os.SEEK_SET)
        self.remembered = self.sha256


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _open(folder: Path, path: str) -> tuple[int, os.stat_result]:
    """``path`` under ``folder`` opened for reading, one component at a time, following no
    symlink; refused unless it is a regular file."""
    parts = path.split("/")
    directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=directory)
            os.close(directory)
            directory = inner
        descriptor = os.open(parts[-1], _FILE_FLAGS, dir_fd=directory)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ChangedInPlace(
                "it (or a folder on its path) is a symlink or no longer what it was; only "
                "regular files are read"
            ) from None
        raise
    finally:
        os.close(directory)
    found = os.fstat(descriptor)
    if not stat.S_ISREG(found.st_mode):
        os.close(descriptor)
        raise ChangedInPlace("it is no longer a regular file")
    os.set_blocking(descriptor, True)
    return descriptor, found


def _identity(found: os.stat_result) -> str:
    return f"{found.st_dev} {found.st_ino} {found.st_size} {found.st_mtime_ns} {found.st_ctime_ns}"


def _mark(workspace_id: int, folder: Path, path: str) -> Path:
    """Where what was found of the file is remembered (removed by ``storage.trim_cache`` once
    unused for a while: the file is then only read again)."""
    key = hashlib.sha256(f"{folder}\0{path}".encode()).hexdigest()
    return storage.in_place_marks() / "workspaces" / str(int(workspace_id)) / key[:2] / key


def _remembered(workspace_id: int, folder: Path, path: str, identity: str) -> str | None:
    """The SHA-256 the file had when last read, if it has not changed since."""
    mark = _mark(workspace_id, folder, path)
    try:
        kept, _, sha256 = mark.read_text().rstrip("\n").rpartition(" ")
    except OSError:
        return None
    if kept != identity:
        return None
    with contextlib.suppress(OSError):
        os.utime(mark)  # in use: not trimmed
    return sha256


def _remember(workspace_id: int, folder: Path, path: str, identity: str, sha256: str) -> None:
    """Remember what reading the file found (best effort: a mark that cannot be written only
    means the file is read again next time)."""
    mark = _mark(workspace_id, folder, path)
    with contextlib.suppress(OSError):
        mark.parent.mkdir(parents=True, exist_ok=True)
        temporary = mark.with_name(f".{mark.name}.{uuid.uuid4().hex}")
        temporary.write_text(f"{identity} {sha256}\n")
        os.replace(temporary, mark)
