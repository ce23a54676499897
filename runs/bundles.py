"""Code bundles: the project directory a run ships, as a zip, checked before it is kept.

An upload is accepted only if it is a plain, modest zip: limited in size and file count, no
absolute paths or ``..``, no symlinks or device files, valid UTF-8 names, and a bounded
compression ratio (zip bombs). Accepted bundles are stored once per content under
``var/bundles/<sha256[:2]>/<sha256>.zip`` and only ever unpacked into a fresh directory, with
every member checked again on the way out.

A zip made from a project *folder* (one top-level folder holding everything, as "Compress"
in a file manager makes it) is unwrapped at submission when the entrypoint is inside that
folder: the stored bundle is the folder's contents, so ``train.py`` runs as ``train.py``
on every backend. Submission decides that (``runs.submission.check_bundle``) from the
bundle's :class:`BundleListing`, the same listing the submit page reads in the browser.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler
from django.db import IntegrityError, transaction

from runs.models import CodeBundle
from workspaces.models import Workspace

MAX_BUNDLE_BYTES = 50 * 2**20
MAX_UNPACKED_BYTES = 500 * 2**20
MAX_FILES = 5000
MAX_RATIO = 100  # uncompressed / compressed, per member and overall
MAX_PATH_LENGTH = 255
_CHUNK = 2**16
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BundleRejected(ValueError):
    """The upload is not an acceptable bundle; the message says why, for the user."""


#: Top-level entries that file managers add to a zip and no project means to ship: macOS
#: Finder's resource forks. They never count as a second top-level folder.
IGNORED_TOP_LEVEL = frozenset({"__MACOSX"})


@dataclass(frozen=True)
class BundleListing:
    """What a bundle holds: its regular files (normalised relative paths), and the single
    top-level folder everything lies in, if there is one (``wrapper``)."""

    files: frozenset[str]
    wrapper: str | None

    @classmethod
    def from_names(cls, names: Iterable[str]) -> BundleListing:
        """From zip member names (folders end in ``/``), as the zip's central directory
        lists them; names that are not plain relative paths are left out (the full check
        refuses such a zip at submission)."""
        files: set[str] = set()
        tops: set[str] = set()
        nested = True
        for name in names:
            if not name or name.endswith("/") or "\\" in name or "\x00" in name:
                continue
            path = PurePosixPath(name)
            if path.is_absolute() or ".." in path.parts or str(path) == ".":
                continue
            if path.parts[0] in IGNORED_TOP_LEVEL:
                continue
            files.add(str(path))
            tops.add(path.parts[0])
            nested = nested and len(path.parts) > 1
        wrapper = next(iter(tops)) if len(tops) == 1 and nested else None
        return cls(files=frozenset(files), wrapper=wrapper)

    def similar(self, script: str, limit: int = 3) -> list[str]:
        """Files with the script's name elsewhere in the bundle, nearest first."""
        name = PurePosixPath(script).name
        found = [path for path in self.files if PurePosixPath(path).name == name]
        return sorted(found, key=lambda path: (path.count("/"), path))[:limit]


@dataclass(frozen=True)
class BundleInfo:
    sha256: str
    size: int
    file_count: int
    unpacked_size: int
    listing: BundleListing


def storage_root() -> Path:
    return Path(settings.VAR_DIR) / "bundles"


def bundle_path(sha256: str) -> Path:
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"{sha256!r} is not a SHA-256 hex digest")
    return storage_root() / sha256[:2] / f"{sha256}.zip"


def _member_problem(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    if info.flag_bits & 0x1:
        return f"{name!r} is encrypted"
    # Without the UTF-8 flag, names are CP437 by the zip spec; accept plain ASCII only.
    if info.flag_bits & 0x800 == 0 and not name.isascii():
        return f"{name!r}: file names must be UTF-8"
    if "\x00" in name or "\\" in name:
        return f"{name!r} has a character not allowed in a path"
    if len(name) > MAX_PATH_LENGTH:
        return f"a path is longer than {MAX_PATH_LENGTH} characters"
    path = PurePosixPath(name)
    if name.startswith("/") or path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return f"{name!r} is an absolute path"
    if any(part == ".." for part in path.parts):
        return f"{name!r} points outside the project ('..')"
    if str(path) == "." and not info.is_dir():
        return f"{name!r} is not a file name"
    # Unix modes live in the high 16 bits; many tools leave the type bits empty (a plain file).
    file_type = stat.S_IFMT(info.external_attr >> 16)
    if file_type == stat.S_IFLNK:
        return f"{name!r} is a symbolic link"
    if file_type not in (0, stat.S_IFREG, stat.S_IFDIR):
        return f"{name!r} is not a regular file or folder"
    if (
        info.compress_size
        and info.file_size / info.compress_size > MAX_RATIO
        and info.file_size > 2**20
    ):
        return f"{name!r} expands {info.file_size // max(info.compress_size, 1)}x (zip bomb?)"
    # No compression method grows data by more than a fraction of a percent plus a header, so
    # far more compressed than uncompressed bytes means the declared size is a lie (zipfile
    # would stop at the declared size and never look at the rest).
    if info.compress_size > info.file_size + info.file_size // 100 + 1024:
        return (
            f"{name!r} declares {info.file_size} bytes but holds {info.compress_size} "
            "compressed bytes (a damaged or crafted size header)"
        )
    return None


def inspect_zip(path: Path) -> BundleInfo:
    """Check a zip file on disk against every rule; its fingerprint if it passes."""
    size = path.stat().st_size
    if size > MAX_BUNDLE_BYTES:
        raise BundleRejected(
            f"The bundle is {size // 2**20} MiB; the limit is {MAX_BUNDLE_BYTES // 2**20} MiB."
        )
    try:
        archive = zipfile.ZipFile(path)
    except UnicodeDecodeError:
        raise BundleRejected(
            "The bundle is refused: its file names are marked UTF-8 but are not valid UTF-8."
        ) from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        raise BundleRejected("The bundle is not a zip file.") from None
    with archive:
        members = archive.infolist()
        if len(members) > MAX_FILES:
            raise BundleRejected(
                f"The bundle has {len(members)} entries; the limit is {MAX_FILES}."
            )
        seen: set[str] = set()
        files_at: set[str] = set()
        folders: set[str] = set()
        unpacked = 0
        files = 0
        for info in members:
            problem = _member_problem(info)
            if problem:
                raise BundleRejected(f"The bundle is refused: {problem}.")
            normal = str(PurePosixPath(info.filename))
            if normal in seen:
                raise BundleRejected(f"The bundle lists {info.filename!r} twice.")
            seen.add(normal)
            if not info.is_dir():
                files_at.add(normal)
            folders.update(str(parent) for parent in PurePosixPath(normal).parents)
            unpacked += info.file_size
            files += 0 if info.is_dir() else 1
        clash = sorted(files_at & folders)
        if clash:
            raise BundleRejected(f"The bundle has {clash[0]!r} both as a file and as a folder.")
        if unpacked > MAX_UNPACKED_BYTES:
            raise BundleRejected(
                f"The bundle unpacks to {unpacked // 2**20} MiB; "
                f"the limit is {MAX_UNPACKED_BYTES // 2**20} MiB."
            )
        if size and unpacked / size > MAX_RATIO and unpacked > 10 * 2**20:
            raise BundleRejected("The bundle expands far more than real code does (zip bomb?).")
        # The declared sizes could lie: read every member through, counting real bytes.
        actual = 0
        for info in members:
            if info.is_dir():
                continue
            try:
                with archive.open(info) as stream:
                    while chunk := stream.read(_CHUNK):
                        actual += len(chunk)
                        if actual > MAX_UNPACKED_BYTES:
                            raise BundleRejected(
                                "The bundle unpacks to more than its entries declare."
                            )
            except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as exc:
                raise BundleRejected(f"The bundle is damaged ({info.filename}: {exc}).") from None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return BundleInfo(
        sha256=digest.hexdigest(),
        size=size,
        file_count=files,
        unpacked_size=actual,
        listing=BundleListing.from_names(info.filename for info in members),
    )


@dataclass
class StagedUpload:
    """An upload written to a temporary file and checked, not yet kept: submission looks at
    its listing before deciding to keep it (``keep``) or not (``discard``)."""

    path: Path
    info: BundleInfo

    @property
    def listing(self) -> BundleListing:
        return self.info.listing


def stage_upload(upload: IO[bytes]) -> StagedUpload:
    """Write an uploaded zip to a temporary file next to the store and check it. Raises
    BundleRejected (leaving nothing behind) when it is not acceptable."""
    root = storage_root()
    root.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix="upload-", suffix=".zip", dir=root)
    try:
        written = 0
        with os.fdopen(handle, "wb") as out:
            while chunk := upload.read(_CHUNK):
                written += len(chunk)
                if written > MAX_BUNDLE_BYTES:
                    raise BundleRejected(
                        f"The bundle is larger than {MAX_BUNDLE_BYTES // 2**20} MiB."
                    )
                out.write(chunk)
        return StagedUpload(path=Path(temporary), info=inspect_zip(Path(temporary)))
    except BaseException:
        os.unlink(temporary)
        raise


class BoundedUploadHandler(TemporaryFileUploadHandler):
    """Django's temporary-file upload handler (``FILE_UPLOAD_HANDLERS``), except that it
    keeps no more than one byte past MAX_BUNDLE_BYTES of any file, the largest upload any
    route takes: the rest of the file is read and dropped, never written to disk, and the
    upload is then refused by its size (``stage_upload`` reads the extra byte; the file's
    ``size`` stays the size that was sent). How much is read at all is bounded before this,
    from ``Content-Length`` (``runs.submission.SubmissionSizeMiddleware``)."""

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self.kept = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        room = MAX_BUNDLE_BYTES + 1 - self.kept
        if room > 0:
            piece = raw_data[:room]
            self.file.write(piece)
            self.kept += len(piece)
        return None


def discard(staged: StagedUpload) -> None:
    staged.path.unlink(missing_ok=True)


def keep(staged: StagedUpload, *, workspace: Workspace, unwrap: str | None = None) -> CodeBundle:
    """Store a staged upload once per content (``unwrap``: store the contents of that
    top-level folder instead of the zip as uploaded) and record it for the workspace."""
    try:
        if unwrap is not None:
            unwrapped = _unwrapped(staged.path, unwrap)
            staged.path.unlink()
            staged.path = unwrapped
            staged.info = inspect_zip(unwrapped)
        info = staged.info
        final = bundle_path(info.sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        if not final.exists():
            os.replace(staged.path, final)  # atomic: readers never see half a bundle
            os.chmod(final, 0o440)
    finally:
        discard(staged)
    try:
        with transaction.atomic():
            bundle, _ = CodeBundle.objects.get_or_create(
                workspace=workspace,
                sha256=info.sha256,
                defaults={"size": info.size, "file_count": info.file_count},
            )
    except IntegrityError:  # a concurrent upload of the same content won the race
        bundle = CodeBundle.objects.for_workspace(workspace).get(sha256=info.sha256)
    return bundle


def store_upload(*, workspace: Workspace, upload: IO[bytes]) -> CodeBundle:
    """Check an uploaded zip and keep it (once per content). Nothing is stored if it fails."""
    return keep(stage_upload(upload), workspace=workspace)


def _unwrapped(source: Path, folder: str) -> Path:
    """A copy of the checked zip ``source`` with ``folder/`` taken off every name, and the
    entries outside it (only ``IGNORED_TOP_LEVEL`` ones can be) left out. Each member keeps
    its bytes, compression, time and mode, so the same upload always gives the same zip."""
    prefix = f"{folder}/"
    handle, target = tempfile.mkstemp(prefix="unwrap-", suffix=".zip", dir=source.parent)
    os.close(handle)
    try:
        with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
            for info in old.infolist():
                name = str(PurePosixPath(info.filename))
                if not name.startswith(prefix):
                    continue  # the folder's own entry, or __MACOSX
                copy = zipfile.ZipInfo(name[len(prefix) :], date_time=info.date_time)
                copy.compress_type = info.compress_type
                copy.create_system = info.create_system
                copy.external_attr = info.external_attr
                if info.is_dir():
                    copy.filename += "/"
                    new.writestr(copy, b"")
                    continue
                with old.open(info) as stream, new.open(copy, "w") as out:
                    shutil.copyfileobj(stream, out, _CHUNK)
    except BaseException:
        os.unlink(target)
        raise
    return Path(target)


def folder_zip(bundle_sha256: str, folder: str) -> Path:
    """A new zip of what lies in ``folder/`` of a stored bundle, names taken relative to it
    (a pipeline's stage is the folder of its tau.yaml), made the way an upload is unwrapped,
    so the same folder always gives the same zip. The caller deletes the file."""
    source = bundle_path(bundle_sha256)
    if inspect_zip(source).sha256 != bundle_sha256:
        raise BundleRejected(f"The stored bundle {bundle_sha256[:12]} does not match its digest.")
    return _unwrapped(source, folder)


def unpack(bundle_sha256: str, destination: Path) -> None:
    """Unpack a stored bundle into ``destination``, which must be a new, empty directory."""
    source = bundle_path(bundle_sha256)
    # A stored file could have been damaged or replaced: check it again, digest included.
    if inspect_zip(source).sha256 != bundle_sha256:
        raise BundleRejected(f"The stored bundle {bundle_sha256[:12]} does not match its digest.")
    unpack_checked(source, destination)


def unpack_checked(source: Path, destination: Path) -> None:
    """Unpack a zip that passed :func:`inspect_zip` (a stored bundle, a staged upload) into
    ``destination``, which must be a new, empty directory."""
    destination.mkdir(parents=True, exist_ok=False)
    root = destination.resolve()
    with zipfile.ZipFile(source) as archive:
        for info in archive.infolist():
            target = (root / info.filename).resolve()
            if target != root and root not in target.parents:
                raise BundleRejected(f"{info.filename!r} would land outside the run directory.")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as stream, open(target, "xb") as out:
                shutil.copyfileobj(stream, out, _CHUNK)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, (mode or 0o644) & 0o755)
