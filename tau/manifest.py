"""Manifests of a folder: every file's path, size and SHA-256, their totals, and the digest of
the manifest itself, its content address. A dataset version or a model version *is* its
manifest (issue 33): the record of exactly which bytes a run read or produced, which still
proves it after the files are gone.

Standard library only: the ``tau`` client builds and checks manifests of a researcher's
folder with this module, and the portal builds and checks those of its storage with the same
code, so both always agree on a digest.

**Paths** are relative POSIX paths of regular files, in UTF-8, sorted by code point: no
absolute path, no ``.`` or ``..`` component, no backslash (a separator elsewhere), no
character a reader cannot see (:mod:`tau.printable`), at most ``MAX_PATH_CHARACTERS``.
A folder holding anything but regular files and folders (a symlink, a FIFO, a socket, a
device) is refused with the path named: a manifest says what the bytes are, not where else
they might be found.

**The digest** is the SHA-256 of the canonical form (format 1)::

    {"files":[{"path":"a.txt","sha256":"…","size":3},…],"format":1}

JSON with sorted keys, no spaces, UTF-8 (not ASCII escapes), the files sorted by path. The
file lines of :meth:`Manifest.sha256sum` are exactly ``sha256sum``'s for the same files, so
``cd folder && sha256sum -c`` checks a copy with nothing but coreutils.

Reading is streamed (a fixed buffer: constant memory for a file of any size), the limits
(number of files, size of one file) are checked from the listing before a byte is hashed, and
a file that changes while it is read is refused rather than recorded half-old.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tau.printable import hidden_character, hidden_character_problem

FORMAT = 1
#: The most files one manifest may hold (issue 33).
MAX_FILES = 1_000_000
MAX_PATH_CHARACTERS = 1024
#: Bytes read at a time: the memory one hashing takes, whatever the file's size.
CHUNK_BYTES = 1024 * 1024
#: How often progress is said while one large file is read.
PROGRESS_EVERY_BYTES = 16 * CHUNK_BYTES
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = frozenset({"path", "size", "sha256"})

#: ``progress(bytes_done, bytes_total)``.
Progress = Callable[[int, int], None]


class ManifestError(ValueError):
    """A folder or a manifest that cannot be recorded; the message names the file."""


@dataclass(frozen=True, order=True)
class Entry:
    """One file: its path (relative, POSIX), size in bytes and SHA-256 (hex)."""

    path: str
    size: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    """Files sorted by path, each once."""

    files: tuple[Entry, ...]

    @classmethod
    def of(cls, entries: Iterable[Entry], *, max_files: int = MAX_FILES) -> Manifest:
        """The manifest of ``entries`` (any order), checked: valid paths, each path once."""
        files = tuple(sorted(entries))
        if len(files) > max_files:
            raise ManifestError(f"{len(files):,} files: a manifest holds at most {max_files:,}.")
        seen: set[str] = set()
        for entry in files:
            _check_entry(entry)
            if entry.path in seen:
                raise ManifestError(f"{entry.path!r} is listed twice.")
            seen.add(entry.path)
        _refuse_file_and_folder_of_one_name(seen)
        return cls(files)

    @classmethod
    def from_dict(cls, data: Any, *, max_files: int = MAX_FILES) -> Manifest:
        """A manifest sent as JSON (the canonical form's shape), checked as :meth:`of`."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(f"A manifest is an object with format {FORMAT} and its files.")
        files = data.get("files")
        if not isinstance(files, list):
            raise ManifestError("A manifest's files are a list.")
        if len(files) > max_files:
            raise ManifestError(f"{len(files):,} files: a manifest holds at most {max_files:,}.")
        return cls.of(map(entry_from_dict, files), max_files=max_files)

    @property
    def files_count(self) -> int:
        return len(self.files)

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def as_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "files": [entry.as_dict() for entry in self.files]}

    def canonical(self) -> bytes:
        """The bytes the digest is taken of (the module's docstring)."""
        return json.dumps(
            self.as_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical form: the version's content address."""
        return "sha256:" + hashlib.sha256(self.canonical()).hexdigest()

    def sha256sum(self) -> str:
        """The files as ``sha256sum`` lists them (``<hex>  <path>``), sorted by path."""
        return "".join(f"{entry.sha256}  {entry.path}\n" for entry in self.files)

    def get(self, path: str) -> Entry | None:
        for entry in self.files:
            if entry.path == path:
                return entry
        return None


def entry_from_dict(item: Any) -> Entry:
    """One file as JSON gives it (``{"path", "size", "sha256"}``, nothing else), not yet
    checked (:meth:`Manifest.of`, :class:`StreamedManifest`)."""
    if not isinstance(item, dict) or item.keys() != _ENTRY_KEYS:
        raise ManifestError("Each file of a manifest has exactly a path, size and sha256.")
    path = item["path"]
    if not isinstance(path, str):
        raise ManifestError("A file's path is text.")
    return Entry(path, item["size"], item["sha256"])


def _check_entry(entry: Entry) -> None:
    if check_path(entry.path) != entry.path:
        raise ManifestError(f"{entry.path!r} is not written as a plain relative path.")
    if type(entry.size) is not int or entry.size < 0:
        raise ManifestError(f"{entry.path!r}: its size must be a whole number of bytes.")
    if not isinstance(entry.sha256, str) or not _SHA256.fullmatch(entry.sha256):
        raise ManifestError(f"{entry.path!r}: its sha256 must be 64 lowercase hex digits.")


class StreamedManifest:
    """A manifest taken one entry at a time, in path order, holding none of them: each entry
    checked as :meth:`Manifest.of` checks it, counted, and hashed into the digest as it comes.

    Why in path order: the digest is taken of the files sorted by path, and sorting needs
    them all at once; a sender that lists them sorted (a walk of a folder does, and so do
    the portal's rows ordered by path) lets a manifest of a million files be checked and
    hashed in the memory of one. The order also makes the other checks local: a path listed
    twice is the one just before it, and a file that is also the folder of another (``a``
    and ``a/b``) is still on a short stack of files that prefix the paths since (every path
    sorted between ``a`` and ``a/b`` starts with ``a``). :attr:`digest` is always the
    digest :class:`Manifest` gives the same files (tests/datasets/test_manifest.py).
    """

    def __init__(self, *, max_files: int = MAX_FILES) -> None:
        self.max_files = max_files
        self.files_count = 0
        self.total_bytes = 0
        self._hash = hashlib.sha256(b'{"files":[')
        self._last = ""
        #: The files listed so far that are prefixes of the last path, shortest first.
        self._prefixes: list[str] = []

    def add(self, entry: Entry) -> bytes:
        """Check and count ``entry``; its canonical form (what the digest hashes)."""
        _check_entry(entry)
        path = entry.path
        if self.files_count:
            if path == self._last:
                raise ManifestError(f"{path!r} is listed twice.")
            if path < self._last:
                raise ManifestError(
                    f"{path!r} comes after {self._last!r}: list the files sorted by path "
                    "(by Unicode code point, as Python's sorted() does)."
                )
        if self.files_count >= self.max_files:
            raise ManifestError(
                f"More than {self.max_files:,} files: a manifest holds at most {self.max_files:,}."
            )
        prefixes = self._prefixes
        while prefixes and not path.startswith(prefixes[-1]):
            prefixes.pop()
        for parent in prefixes:
            if path[len(parent)] == "/":
                raise ManifestError(f"{parent!r} is a file and also the folder of {path!r}.")
        prefixes.append(path)
        canonical = canonical_entry(entry)
        if self.files_count:
            self._hash.update(b",")
        self._hash.update(canonical)
        self.files_count += 1
        self.total_bytes += entry.size
        self._last = path
        return canonical

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the files added so far, as :attr:`Manifest.digest`."""
        whole = self._hash.copy()
        whole.update(b'],"format":%d}' % FORMAT)
        return "sha256:" + whole.hexdigest()


def canonical_entry(entry: Entry) -> bytes:
    """One file as the canonical form writes it (keys sorted, no spaces, UTF-8)."""
    path = json.dumps(entry.path, ensure_ascii=False)
    return f'{{"path":{path},"sha256":"{entry.sha256}","size":{entry.size}}}'.encode()


def check_path(path: str) -> str:
    """``path`` as a manifest path (module docstring), or ManifestError saying why not."""
    if not path or len(path) > MAX_PATH_CHARACTERS:
        raise ManifestError(f"A file's path has 1 to {MAX_PATH_CHARACTERS} characters.")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ManifestError(
            f"{path!r} is not valid UTF-8 (a name written in another encoding); rename it."
        ) from exc
    if hidden_character(path) is not None:
        raise ManifestError(f"{hidden_character_problem(path, f'The path {path!r}')}.")
    if "\\" in path:
        raise ManifestError(f"{path!r} holds a backslash; paths are separated with '/'.")
    if path.startswith("/"):
        raise ManifestError(f"{path!r} is absolute; paths are relative to the folder.")
    parts = path.split("/")
    if ".." in parts:
        raise ManifestError(f"{path!r} points outside the folder (it holds '..').")
    if "" in parts or "." in parts:
        raise ManifestError(f"{path!r} has an empty or '.' part; write it as a plain path.")
    return path


def _refuse_file_and_folder_of_one_name(paths: set[str]) -> None:
    """A path that is a file and also the folder of another (``a`` and ``a/b``) cannot be
    written out as files."""
    for path in paths:
        parent = path.rpartition("/")[0]
        while parent:
            if parent in paths:
                raise ManifestError(f"{parent!r} is a file and also the folder of {path!r}.")
            parent = parent.rpartition("/")[0]


@dataclass(frozen=True)
class Listed:
    """A regular file found in the folder, before it is read."""

    path: str
    absolute: Path
    size: int
    mtime_ns: int


def list_files(
    root: Path, *, max_files: int = MAX_FILES, max_file_bytes: int | None = None
) -> list[Listed]:
    """Every regular file under ``root``, sorted by path; refuses anything else, with its
    path, and the limits before any file is read. ``root`` itself may be a symlink to the
    folder (the caller named it); nothing under it may be."""
    found: list[Listed] = []
    for listed in walk_files(root):
        found.append(listed)
        if len(found) > max_files:
            raise ManifestError(f"{root} holds more than {max_files:,} files, the most allowed.")
        if max_file_bytes is not None and listed.size > max_file_bytes:
            raise ManifestError(
                f"{listed.path} is {listed.size:,} bytes; one file may have at most "
                f"{max_file_bytes:,}."
            )
    found.sort(key=lambda listed: listed.path)
    return found


def walk_files(root: Path) -> Iterator[Listed]:
    """Every regular file under ``root``, sorted by path, one at a time: what
    :func:`list_files` lists, holding no more than the names of one folder at once (a
    folder of a million files is listed in the memory of its largest folder's names).
    Refuses anything else as it comes to it, with its path."""
    for path, absolute, info in _walk_root(root):
        yield Listed(path, Path(absolute), info.st_size, info.st_mtime_ns)


def count_files(root: Path) -> Iterator[int]:
    """The size of each regular file under ``root``, in :func:`walk_files`' order and with
    its refusals, and nothing else: counting a folder before reading it costs a walk
    without the :class:`Listed` of each file."""
    for _, _, info in _walk_root(root):
        yield info.st_size


def _walk_root(root: Path) -> Iterator[tuple[str, str, os.stat_result]]:
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            raise ManifestError(f"{root} is not a folder.")
    except FileNotFoundError as exc:
        raise ManifestError(f"{root} does not exist.") from exc
    yield from _walk(os.fspath(root), "")


def _walk(folder: str, prefix: str) -> Iterator[tuple[str, str, os.stat_result]]:
    # A folder sorts as its name and a '/': where its files' paths sort among its siblings
    # (``a/b`` after ``a!x``), so that the walk yields the files in path order.
    with os.scandir(folder) as entries:
        keys = sorted(
            f"{entry.name}/" if entry.is_dir(follow_symlinks=False) else entry.name
            for entry in entries
        )
    for key in keys:
        name = key.removesuffix("/")
        path = check_path(f"{prefix}{name}")
        absolute = os.path.join(folder, name)
        info = os.stat(absolute, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            yield from _walk(absolute, f"{path}/")
        elif stat.S_ISREG(info.st_mode):
            yield path, absolute, info
        else:
            raise ManifestError(
                f"{path} is {_kind(info.st_mode)}; only files and folders are kept."
            )


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "not a regular file"


def hash_file(
    path: Path,
    on_bytes: Callable[[int], None] | None = None,
    *,
    name: str | None = None,
    sink: Callable[[memoryview], object] | None = None,
) -> tuple[int, str]:
    """The size and SHA-256 of the file at ``path``, read in fixed chunks; ``on_bytes(n)``
    after each chunk, and each chunk given to ``sink`` (a copy made in the same read).
    Refuses a file that is not a regular file once opened (swapped for a symlink or a FIFO
    since it was listed: opened without following, and without blocking)."""
    shown = name or str(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ManifestError(f"{shown} is a symlink; only files and folders are kept.") from exc
        raise ManifestError(f"{shown} cannot be read: {exc.strerror}.") from exc
    with os.fdopen(descriptor, "rb", buffering=0) as file:
        opened = os.fstat(file.fileno())
        if not stat.S_ISREG(opened.st_mode):
            raise ManifestError(f"{shown} is no longer a regular file.")
        digest = hashlib.sha256()
        size = 0
        # No larger than the file: a folder of a million small files would otherwise zero a
        # megabyte for each (most of the time of reading it). A file that grows is read all
        # the same, in more pieces.
        buffer = bytearray(max(1, min(CHUNK_BYTES, opened.st_size)))
        view = memoryview(buffer)
        while True:
            count = file.readinto(buffer)
            if not count:
                break
            digest.update(view[:count])
            if sink is not None:
                sink(view[:count])
            size += count
            if on_bytes is not None:
                on_bytes(count)
    return size, digest.hexdigest()


@dataclass(frozen=True)
class Known:
    """What an earlier, interrupted scan found for one file: reused while the file's size and
    modification time are still those (a resumed ingest hashes only what is left)."""

    size: int
    mtime_ns: int
    sha256: str


def scan(
    root: Path,
    *,
    max_files: int = MAX_FILES,
    max_file_bytes: int | None = None,
    progress: Progress | None = None,
    known: Mapping[str, Known] | None = None,
    on_file: Callable[[Entry, int], None] | None = None,
) -> Manifest:
    """The manifest of the folder ``root``.

    ``progress(done, total)`` is told the bytes accounted for (read, or known from ``known``)
    as the scan goes and once at the end; ``on_file(entry, mtime_ns)`` after each file, so a
    caller can keep what a later scan may reuse (``known``). A file whose size or
    modification time changed while it was read is refused: read it again when it is still.
    """
    listed = list_files(root, max_files=max_files, max_file_bytes=max_file_bytes)
    total = sum(item.size for item in listed)
    done = 0
    said = 0

    def tell(count: int) -> None:
        nonlocal done, said
        done += count
        if progress is not None and done - said >= PROGRESS_EVERY_BYTES:
            said = done
            progress(done, total)

    entries = []
    for item in listed:
        earlier = (known or {}).get(item.path)
        if earlier is not None and (earlier.size, earlier.mtime_ns) == (item.size, item.mtime_ns):
            entry = Entry(item.path, item.size, earlier.sha256)
            tell(item.size)
        else:
            entry = read_listed(item, tell)
        entries.append(entry)
        if on_file is not None:
            on_file(entry, item.mtime_ns)
    if progress is not None:
        progress(done, total)
    return Manifest.of(entries, max_files=max_files)


def read_listed(item: Listed, on_bytes: Callable[[int], None] | None = None) -> Entry:
    """The entry of a file :func:`walk_files` listed, read now (``on_bytes`` as for
    :func:`hash_file`); refused if its size or modification time changed while it was read:
    read it again when it is still."""
    size, sha256 = hash_file(item.absolute, on_bytes, name=item.path)
    after = os.stat(item.absolute, follow_symlinks=False)
    if size != item.size or after.st_size != size or after.st_mtime_ns != item.mtime_ns:
        raise ManifestError(
            f"{item.path} changed while it was read ({item.size:,} bytes listed, "
            f"{size:,} read); read the folder again once nothing writes to it."
        )
    return Entry(item.path, size, sha256)


@dataclass(frozen=True)
class Problem:
    """One way a folder differs from its manifest."""

    path: str
    what: str  # "missing", "unexpected", "size", "content"

    def __str__(self) -> str:
        return {
            "missing": f"{self.path}: missing",
            "unexpected": f"{self.path}: not in the manifest",
            "size": f"{self.path}: its size differs",
            "content": f"{self.path}: its content differs (SHA-256)",
        }[self.what]


def verify(root: Path, manifest: Manifest, *, progress: Progress | None = None) -> list[Problem]:
    """How the folder ``root`` differs from ``manifest``, every file read again (empty: it
    holds exactly those bytes). Files of the wrong kind (a symlink…) are refused as by
    :func:`scan`."""
    listed = {item.path: item for item in list_files(root, max_files=MAX_FILES + 1)}
    expected = {entry.path: entry for entry in manifest.files}
    problems = [Problem(path, "missing") for path in expected if path not in listed]
    problems += [Problem(path, "unexpected") for path in listed if path not in expected]
    to_read = []
    for entry in manifest.files:
        item = listed.get(entry.path)
        if item is not None and item.size != entry.size:
            problems.append(Problem(entry.path, "size"))
        elif item is not None:
            to_read.append((entry, item))
    total = sum(entry.size for entry, _ in to_read)
    done = 0

    def tell(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    for entry, item in to_read:
        _, sha256 = hash_file(item.absolute, tell, name=entry.path)
        if sha256 != entry.sha256:
            problems.append(Problem(entry.path, "content"))
    return sorted(problems, key=lambda problem: (problem.path, problem.what))
